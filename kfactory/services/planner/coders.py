"""The coder portfolio: which coder gets the next piece of design work.

Arms are the template coder (the search strategy's design points) and one arm per agent persona. Each arm's
yield is its improvements (a measured candidate faster than everything measured before it in the campaign) per
unit of cost: the device-seconds its candidates took to verify and measure, plus its tokens weighed at
`llm_token_seconds` device-seconds each. The next arm is drawn by Thompson sampling from a Gamma posterior of
that rate, so a coder that yields more gets more work and one that yields nothing still gets an occasional try.
Everything here is a fold over the campaign's events, so a restarted planner rebuilds it by replaying them.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from kfactory.agents.personas import PERSONAS
from kfactory.bus.events import sha256_hex
from kfactory.bus.origins import STRATEGY, Origin, parse
from kfactory.judge.order import default_parallel
from kfactory.v1 import events_pb2 as pb

TEMPLATE = "template"
#: an improvement must beat the best so far by this fraction (a difference inside the noise is not a win)
IMPROVEMENT = 0.02
#: agent failures that say the endpoint, not the persona, is failing; this many in a row pause every agent
ENDPOINT_FAILURES = frozenset({pb.AGENT_TIMEOUT, pb.AGENT_RATE_LIMITED, pb.AGENT_UNAVAILABLE,
                               pb.AGENT_NOT_CONFIGURED})
BREAKER = 3
#: failures a repairer can work on: the candidate exists and its evidence says what went wrong
REPAIRABLE = frozenset({pb.COMPILE_ERROR, pb.WRONG_RESULT, pb.NOT_DETERMINISTIC, pb.STATIC_CHECK, pb.CRASHED,
                        pb.OUT_OF_BOUNDS, pb.INPUT_MUTATED, pb.LAUNCH_FAILED, pb.DEVICE_FAULT, pb.MEMOISED})
#: prior of the yield: one improvement per PRIOR_COST device-seconds
PRIOR_COST = 1.0
#: tasks one persona gets with the same parents: asking again with nothing new to show is mostly wasted tokens
SAME_PARENTS = 2


def arm_of(origin: str) -> str | None:
    """The arm a point or candidate belongs to, by its origin; None for the reference and manual kernels."""
    kind, detail = parse(origin)
    if kind in STRATEGY:
        return TEMPLATE
    return detail if kind is Origin.AGENT else None


@dataclass
class ArmStats:
    """What one coder did in a campaign."""
    proposed: int = 0
    candidates: int = 0
    measured: int = 0
    improvements: int = 0
    device_s: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    failures: Counter = field(default_factory=Counter)

    def cost(self, token_seconds: float) -> float:
        """Device-seconds spent, its tokens counted at `token_seconds` each."""
        return self.device_s + token_seconds * (self.tokens_in + self.tokens_out)


@dataclass
class CoderLedger:
    """Per-arm results, the failed candidates awaiting repair, and the endpoint's failure streak."""
    arms: dict[str, ArmStats] = field(default_factory=dict)
    best_s: float | None = None
    failed: list[str] = field(default_factory=list)
    repaired: set[str] = field(default_factory=set)
    endpoint_streak: int = 0
    last_endpoint_failure: str = ""
    #: tasks per (persona, parents)
    asked: Counter = field(default_factory=Counter)

    def arm(self, name: str) -> ArmStats:
        return self.arms.setdefault(name, ArmStats())

    # -- folding events ------------------------------------------------------------------------
    def on_point(self, m: pb.PointProposed) -> None:
        arm = arm_of(m.origin)
        if arm is not None:
            self.arm(arm).proposed += 1
        if arm == "repairer" and m.parents:
            self.repaired.add(m.parents[0])
        if m.HasField("agent"):
            self.asked[(m.agent.persona, tuple(m.parents))] += 1

    def on_candidate(self, c: pb.Candidate) -> None:
        arm = arm_of(c.origin)
        if arm is None:
            return
        self.arm(arm).candidates += 1
        if c.HasField("agent"):
            self._tokens(arm, c.agent)
            self.endpoint_streak = 0

    def on_rejected(self, m: pb.Rejected) -> None:
        if m.HasField("agent"):  # an agent task that produced no new candidate: its tokens were spent all the same
            persona = m.agent.persona
            self._tokens(persona, m.agent)
            self.arm(persona).failures[pb.RejectReason.Name(m.reason)] += 1
            if m.reason in ENDPOINT_FAILURES:
                self.endpoint_streak += 1
                self.last_endpoint_failure = pb.RejectReason.Name(m.reason)
            else:
                self.endpoint_streak = 0
            return
        arm = arm_of(m.candidate.origin)
        if arm is not None:
            self.arm(arm).device_s += sum(ch.seconds for ch in m.checks)
            self.arm(arm).failures[pb.RejectReason.Name(m.reason)] += 1
        if m.reason in REPAIRABLE and m.candidate.id:
            self.failed.append(m.candidate.id)

    def on_compile_failed(self, m: pb.CompileFailed) -> None:
        arm = arm_of(m.candidate.origin)
        if arm is not None:
            self.arm(arm).failures[pb.RejectReason.Name(m.reason)] += 1
        if m.reason in REPAIRABLE:
            self.failed.append(m.candidate.id)

    def on_verified(self, m: pb.Verified) -> None:
        arm = arm_of(m.candidate.origin)
        if arm is not None:
            self.arm(arm).device_s += m.seconds

    def on_measured(self, m: pb.Measured) -> None:
        arm = arm_of(m.candidate.origin)
        improved = self.best_s is None or m.score_s < self.best_s * (1 - IMPROVEMENT)
        if not m.screened_out:
            self.best_s = m.score_s if self.best_s is None else min(self.best_s, m.score_s)
        if arm is None:
            return
        s = self.arm(arm)
        s.measured += 1
        s.device_s += m.seconds
        if improved and not m.screened_out:
            s.improvements += 1

    def _tokens(self, arm: str, info: pb.AgentInfo) -> None:
        s = self.arm(arm)
        s.tokens_in += info.tokens_in
        s.tokens_out += info.tokens_out

    # -- questions -----------------------------------------------------------------------------
    def tokens(self) -> int:
        """Tokens the campaign's agents spent (prompt and reply, every persona)."""
        return sum(s.tokens_in + s.tokens_out for name, s in self.arms.items() if name != TEMPLATE)

    def endpoint_paused(self) -> bool:
        """BREAKER endpoint failures in a row: the model endpoint, not a persona, is failing."""
        return self.endpoint_streak >= BREAKER

    def next_repair(self) -> str | None:
        """The most recent failed candidate no repairer has been given yet."""
        return next((c for c in reversed(self.failed) if c not in self.repaired), None)

    def choose(self, eligible: list[str], rng: random.Random, token_seconds: float) -> str | None:
        """An untried arm first (in the given order); then a Thompson draw of each arm's yield."""
        if not eligible:
            return None
        untried = [a for a in eligible if self.arm(a).proposed == 0]
        if untried:
            return untried[0]
        draws = {a: rng.gammavariate(1 + self.arm(a).improvements,
                                     1 / (PRIOR_COST + self.arm(a).cost(token_seconds))) for a in eligible}
        return max(draws, key=lambda a: draws[a])

    def summary(self, token_seconds: float) -> dict:
        """Per arm: work, results, cost and yields (improvements per device-second and per thousand tokens)."""
        out = {}
        for name, s in sorted(self.arms.items()):
            tokens = s.tokens_in + s.tokens_out
            out[name] = {"proposed": s.proposed, "candidates": s.candidates, "measured": s.measured,
                         "improvements": s.improvements, "device_seconds": round(s.device_s, 3),
                         "tokens_in": s.tokens_in, "tokens_out": s.tokens_out,
                         "improvements_per_device_second":
                             round(s.improvements / s.device_s, 4) if s.device_s else None,
                         "improvements_per_ktoken": round(1e3 * s.improvements / tokens, 4) if tokens else None,
                         "failures": dict(s.failures)}
        return out


# -- the planner's questions over a campaign's state (duck-typed CampaignState) ------------------------------
CODERS = (TEMPLATE, "agent")


def validate(spec: pb.CampaignSpec, settings) -> str:
    """Fill the coder fields' defaults; returns what is wrong with them ("" when nothing)."""
    unknown = [c for c in spec.coders if c not in CODERS]
    if unknown:
        return f"coders: unknown {unknown}; known: {', '.join(CODERS)}"
    bad = [p for p in spec.personas if p not in PERSONAS]
    if bad:
        return f"personas: unknown {bad}; known: {', '.join(PERSONAS)}"
    if "agent" in spec.coders and not spec.token_budget:
        spec.token_budget = settings.llm_token_budget
    return ""


def agent_note(spec: pb.CampaignSpec, settings) -> str:
    """Why agent coders asked for by the spec cannot run here ("" when they can or were not asked for)."""
    if "agent" in spec.coders and not settings.llm_configured():
        return ("agent coders off: no model configured (set KFACTORY_LLM_BASE_URL and KFACTORY_LLM_MODEL, or "
                "--llm-base-url and --llm-model); template coders only")
    return ""


def agents_on(st) -> bool:
    """Agents may take work: asked for, configured, the endpoint not failing, tokens left."""
    return ("agent" in st.spec.coders and not st.agent_note and not st.coders.endpoint_paused()
            and st.coders.tokens() < st.spec.token_budget)


def template_slots(st, settings) -> int:
    """Points the strategy may have in flight: the campaign's `parallel`; while agents may take work, no more than
    the planner's default without agents (kfactory.judge.order.default_parallel, which adds a slot per persona on
    cpu), so that idle agents' slots never let the search decide on less than that default means it to."""
    if not agents_on(st):
        return st.spec.parallel
    return min(st.spec.parallel, default_parallel(settings, st.spec.target.split(":")[0]))


def personas(spec: pb.CampaignSpec) -> list[str]:
    """The personas a campaign's agents run as: those the spec names, or every one."""
    return list(spec.personas) or list(PERSONAS)


def eligible(st, settings) -> list[str]:
    """The arms that can take the next piece of work now (settings.llm_parents: parents per agent task)."""
    arms = []
    if (st.strategy is not None and not st.template_exhausted and (TEMPLATE in st.spec.coders or not st.spec.coders)
            and st.strategy_in_flight() < template_slots(st, settings)):
        arms.append(TEMPLATE)
    if agents_on(st):
        for p in personas(st.spec):
            if st.agent_in_flight(p):
                continue  # one task per persona at a time: a slow model must not take every slot
            if not (st.coders.next_repair() if PERSONAS[p].parents == "failed" else st.ranked(1)):
                continue  # nothing to work from yet
            if st.coders.asked[(p, tuple(parents_for(st, p, settings.llm_parents)))] >= SAME_PARENTS:
                continue  # it had these parents already; wait until something new is measured
            arms.append(p)
    return arms


def parents_for(st, persona: str, k: int) -> list[str]:
    """An agent task's parents: the k best measured candidates, or (repairer) the failed one then the best."""
    if PERSONAS[persona].parents == "failed":
        failed = st.coders.next_repair()
        return [failed] + [c for c in st.ranked(k - 1) if c != failed]
    return st.ranked(k)


def agent_point(st, persona: str, parents: list[str], family: str, attempt: int) -> pb.PointProposed:
    """The PointProposed of one agent task (its id derives from the persona, its task count and its parents)."""
    n = st.coders.arm(persona).proposed
    origin = Origin.AGENT.of(persona)
    pid = sha256_hex(f"{origin}:{n}:{attempt}:{','.join(parents)}")[:24]
    return pb.PointProposed(point_id=pid, family=family, params_json="{}", strategy=st.spec.strategy,
                            problem=st.spec.problem, target=st.spec.target, origin=origin,
                            runner_threads=st.spec.threads, parents=parents,
                            agent=pb.AgentTask(persona=persona, device=st.device))

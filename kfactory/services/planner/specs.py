"""Campaign specs: the defaults filled in and everything refused that cannot run, naming the field.

One function for the planner's submit and for `kfactory run`, which checks its spec before any service or
server starts (the same one-line messages as `submit`).
"""
from __future__ import annotations

import re
import secrets
from collections.abc import Callable

from kfactory.bus import events as ev
from kfactory.platform.config import Settings
from kfactory.judge.order import default_parallel
from kfactory.problems import Problem, ProblemError
from kfactory.problems.check import problems_of
from kfactory.services.planner import coders
from kfactory.platform.spec_ranges import spec_errors
from kfactory.strategies import KNOWN as STRATEGIES
from kfactory.strategies import BadStrategyOption, check_options
from kfactory.targets import Target, UnknownTarget
from kfactory.targets.flags import FLAG_TARGETS, FlagRefused, check_flags
from kfactory.v1 import events_pb2 as pb


class SpecError(ValueError):
    """A campaign spec that cannot run; the message says what to fix."""


class StartNotPublished(RuntimeError):
    """A valid campaign whose start the event bus did not take (NATS unreachable through the publish's
    retries): nothing was started, and the client may submit it again (the Campaigns API answers UNAVAILABLE)."""


def validate(spec: pb.CampaignSpec, settings: Settings, problem_of: Callable[[str], Problem],
             target_of: Callable[[str], Target]) -> tuple[pb.CampaignSpec, str]:
    """(the spec with its defaults filled in, a note on agents that are off though asked for, or ""); raises
    SpecError naming the field for anything that cannot run, CheckUnavailable (kfactory/problems/refcheck.py) when
    the host is too busy to check the problem's reference now."""
    if wrong := spec_errors(spec):
        raise SpecError("; ".join(wrong))
    try:
        problem = problem_of(spec.problem)
    except ProblemError as e:
        raise SpecError(f"problem: {e}") from e
    # a reference that raises or a template that does not render would fail every candidate: found here first
    if found := problems_of(problem, settings.reference_check_s):
        more = f" (and {len(found) - 1} more: kfactory problems check {spec.problem})" if len(found) > 1 else ""
        raise SpecError(f"problem: {found[0]}{more}")
    try:
        target = target_of(spec.target or "cpu")
    except (UnknownTarget, ValueError) as e:
        raise SpecError(f"target: {e}") from e
    spec.target = spec.target or "cpu"
    if target.name not in problem.spec.abi:
        raise SpecError(f"target: problem {problem.name} has no ABI for target {target.name}")
    spec.strategy = spec.strategy or "default"
    if spec.strategy not in STRATEGIES:
        raise SpecError(f"strategy: unknown {spec.strategy!r}; known: {', '.join(STRATEGIES)}")
    try:  # checked against the strategy's table here, so a misspelt option fails the submit, not the campaign
        check_options(spec.strategy, dict(spec.strategy_options))
    except BadStrategyOption as e:
        raise SpecError(f"strategy_options: {e}") from e
    # the planner's device budget is the campaign's from its start: a planner restarted with another leaves it
    spec.budget_device_seconds = spec.budget_device_seconds or settings.device_seconds
    if spec.budget_candidates == 0 and spec.budget_seconds == 0 and spec.budget_device_seconds == 0:
        raise SpecError("budget: give a candidate count, a time limit in seconds, a device-time limit, or more "
                        "than one")
    _check_manual(spec, settings, target.name)
    _check_engine(spec, problem)
    spec.threads = spec.threads or settings.threads
    spec.seed = spec.seed or secrets.randbits(32)
    if why := coders.validate(spec, settings):
        raise SpecError(why)
    agent_note = coders.agent_note(spec, settings)
    agents = "agent" in spec.coders and not agent_note
    spec.parallel = spec.parallel or default_parallel(settings, target.name,  # enough to feed the device
                                                      len(coders.personas(spec)) if agents else 0)
    notes = [n for n in (agent_note, _budget_note(spec, problem, agents=agents)) if n]
    return spec, "; ".join(notes)


def _budget_note(spec: pb.CampaignSpec, problem: Problem, agents: bool) -> str:
    """How the budget is spent when no family can be searched ("" when one can); SpecError when nothing can
    spend it."""
    unknown = [f for f in spec.families if f not in problem.families]
    if unknown:
        raise SpecError(f"families: {unknown} not in problem {problem.name} ({list(problem.families)})")
    target = spec.target.split(":")[0]
    if [f for f in problem.families_for(target) if not spec.families or f.name in spec.families]:
        return ""
    if agents:
        return f"problem {problem.name} has no family for target {spec.target}: agent coders spend the budget"
    if spec.manual_sources or not spec.budget_candidates:
        n = len(spec.manual_sources)
        return (f"problem {problem.name} has no family for target {spec.target} and no agents are on: the campaign "
                f"measures the reference kernel and your {n} hand-written kernel{'s' * (n != 1)}, and the "
                "search budget goes unspent")
    raise SpecError(f"families: problem {problem.name} has no family for target {spec.target}, and no agent "
                    "coders (--coders agent) or hand-written kernels (--manual) to spend the budget")


def _check_engine(spec: pb.CampaignSpec, problem: Problem) -> None:
    """An engine campaign's candidates are the designs of its one family (kfactory/engines/problem.py), which
    the template coder renders; a hand-written source or an agent's kernel is not an engine design. Timing
    rounds and the showdown (kfactory/engines/finale.py) are an engine campaign's alone."""
    if problem.kind != "engine":
        if spec.timing_rounds > 1 or spec.showdown_rounds:
            raise SpecError(f"timing_rounds, showdown_rounds: problem {problem.name} is a kernel problem; timing "
                            "rounds and the showdown after the search are an engine campaign's")
        return
    if 0 < spec.showdown_margin < 1:
        raise SpecError(f"showdown_margin (--showdown-margin): {spec.showdown_margin:g} is below 1; give a ratio "
                        "of at least 1 (1.15: designs within 15% of the fastest contend), or 0 for the default")
    if spec.manual_sources:
        raise SpecError(f"manual_sources: problem {problem.name} is an engine; its candidates are the designs of "
                        "kfactory.engines.design.space(), not hand-written sources")
    if [c for c in spec.coders if c != coders.TEMPLATE]:
        raise SpecError(f"coders: problem {problem.name} is an engine; only the template coder renders its "
                        f"designs (not {', '.join(spec.coders)})")


#: a hand-written kernel's name: it becomes the candidate's origin (manual:NAME), in reports, lessons and queries
MANUAL_NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def _check_manual(spec: pb.CampaignSpec, settings: Settings, target: str) -> None:
    seen: set[str] = set()
    for m in spec.manual_sources:
        if not MANUAL_NAME.fullmatch(m.name):
            raise SpecError(f"manual_sources (--manual): the name {m.name!r} is not 1-64 letters, digits, or _ . + -")
        if m.name in seen:   # one origin and one design point: the second would be taken for the first
            raise SpecError(f"manual_sources (--manual): two kernels are named {m.name!r}; give each its own name")
        seen.add(m.name)
        if why := settings.oversized(m.source):
            raise SpecError(f"manual_sources[{m.name}]: {why}")
        # refused here too (the compiler refuses them whatever their way in), so the client hears it at once
        if target in FLAG_TARGETS:
            try:
                check_flags(target, m.compile_flags)
            except FlagRefused as e:
                raise SpecError(f"manual_sources[{m.name}].compile_flags: {e}") from e
    # the CampaignStarted event carries the whole spec and the warm start's evidence, and must fit one message
    if spec.ByteSize() > ev.MAX_EVENT_BYTES // 2:
        raise SpecError(f"manual_sources: the spec is {spec.ByteSize()} bytes in all, over half the "
                        f"{ev.MAX_EVENT_BYTES}-byte event limit; send fewer or smaller sources")

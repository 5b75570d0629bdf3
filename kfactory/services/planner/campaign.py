"""One campaign's state, rebuilt only from events (so a restarted planner replays the stream to resume)."""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from kfactory.bus import events as ev
from kfactory.bus.origins import SEARCHED, STRATEGY, Origin, is_kind
from kfactory.evidence.verdicts import found_wrong
from kfactory.judge import objective
from kfactory.judge.order import device_seconds
from kfactory.judge.stats import significant
from kfactory.problems.package import lowest_score
from kfactory.services.planner.coders import CoderLedger
from kfactory.services.planner.refusals import refusal
from kfactory.strategies import Point, Space, make_strategy
from kfactory.strategies.base import Evidence
from kfactory.strategies.transfer import WarmPriors
from kfactory.v1 import events_pb2 as pb

TERMINAL = ("measured", "rejected", "compile_failed")
#: how much faster at another shape a kernel tied at the scored shape must be to be the result instead: those
#: timings are each kernel's own, minutes apart, and on a host whose load drifts they move more than their
#: intervals say (on the 2-core host a campaign's scores of its best kernels ran 10-20% above the same kernels'
#: interleaved timings after it); the gaps this is for are 1.6-2x
ELSEWHERE_FACTOR = 1.25


class UnknownEventKind(LookupError):
    """An event whose body kind the planner neither handles nor declares ignored (HANDLERS, IGNORED): a kind
    added to the Event oneof without teaching the planner about it, or an event from a newer schema (its body
    then reads as no kind at all). Folding it silently could leave a campaign waiting for ever."""

    def __init__(self, kind: str):
        super().__init__(f"the planner has no rule for event kind {kind or '(no body)'!r}: add it to "
                         "kfactory/services/planner/campaign.py HANDLERS or IGNORED")
        self.kind = kind


@dataclass
class PointState:
    point: Point | None
    origin: str
    done: bool = False
    candidate_id: str = ""


#: a verdict that the reference kernel computes something other than reference.py (not the host's condition, as a
#: timeout or a crash may be)
DISAGREES = frozenset({pb.WRONG_RESULT, pb.NOT_DETERMINISTIC, pb.INPUT_MUTATED, pb.OUT_OF_BOUNDS})


@dataclass
class CampaignState:
    """Everything the planner knows about a campaign, as a fold over its events."""
    id: str
    spec: pb.CampaignSpec
    device: pb.DeviceInfo
    space: Space | None
    started_wall: float = field(default_factory=time.time)
    #: its CampaignStarted's time in ns (0 until folded, or where the event gave none): the key the Campaigns
    #: list pages by, as memory's archive keeps it (kfactory/services/paging.py)
    started_ns: int = 0
    points: dict[str, PointState] = field(default_factory=dict)
    counts: pb.Counts = field(default_factory=pb.Counts)
    measured: dict[str, pb.Measured] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)
    candidates: dict[str, pb.Candidate] = field(default_factory=dict)
    comparisons: dict[str, pb.Comparison] = field(default_factory=dict)
    #: the showdowns' timings (kfactory/services/planner/driver.py _showdown) by the search's best they were for
    showdowns: dict[str, pb.Comparison] = field(default_factory=dict)
    #: candidates that are never its result: those a showdown failed (found wrong, or crashed there), those its
    #: final comparison found wrong (final_wrong), and those other campaigns found wrong (known_wrong)
    disqualified: set[str] = field(default_factory=set)
    #: results their final comparison found wrong (also in disqualified): at most FINAL_TRIES, restarts included
    final_wrong: set[str] = field(default_factory=set)
    #: kernels another campaign of the problem found wrong (also in disqualified), each with that campaign: those
    #: memory knew at the start (CampaignStarted.known_wrong), and those a campaign folded beside it finds wrong
    #: while it runs (kfactory/services/planner/replay.py); a point whose kernel was one when its result came
    #: scores as failed (a strategy cannot take back a score it was told before)
    known_wrong: dict[str, str] = field(default_factory=dict)
    #: the problem's name where it loads (else the spec's locator): campaigns of one problem share what they find
    #: wrong, however their specs name it
    problem_name: str = ""
    #: a kernel known to be wrong was measured (or one measured was learned wrong): the screen's threshold, which
    #: the benchmarker lowered to its score, must be raised again (CampaignDriver._fix_threshold)
    threshold_stale: bool = False
    reference_id: str = ""
    #: the first candidate measured in full whose every timing reached spec.goal_fraction ("" until one does, or
    #: without a goal): kept as the measurements are folded, since the planner asks before every proposal
    goal_by: str = ""
    finished: pb.CampaignFinished | None = None
    cancelled: str = ""
    seen_events: set[str] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: the warm start: points from other campaigns, proposed before the strategy's own while the strategy
    #: trusts their sources (transfer.WarmPriors)
    priors: WarmPriors = field(default_factory=lambda: WarmPriors([], 0))
    #: the warm start's sources (earlier campaigns) and the device each ran on, for the summary
    source_devices: dict[str, str] = field(default_factory=dict)

    #: proposals whose candidate has not appeared yet: a restarted planner sends them to the coder again, since
    #: an earlier life may have died between publishing a proposal and queueing its work (a resend is deduplicated)
    proposals: dict[str, pb.Event] = field(default_factory=dict)
    #: why the campaign's strategy stopped working ("" while it works); the planner fails the campaign with it
    strategy_error: str = ""
    #: points rejected as duplicates of a candidate still in flight: told the twin's result when it comes
    awaiting_twin: dict[str, list[str]] = field(default_factory=dict)
    #: points ended by a dead letter: if their work is sent back (`kfactory dead-letters --replay`) and ends
    #: after all, that outcome replaces the dead letter's
    dead_lettered: set[str] = field(default_factory=set)
    #: requests to send a dead letter's work back (by DLQ sequence) that the planner has not answered yet
    resend_requests: dict[int, pb.ResendRequested] = field(default_factory=dict)
    #: points whose dead letter's work was sent back and is out again: point id -> DLQ sequence
    resent: dict[str, int] = field(default_factory=dict)
    #: candidates whose verification (by the verifier) this planner has seen: the chain a measurement ends
    verified: set[str] = field(default_factory=set)
    #: when the campaign finished (its CampaignFinished's time), None while it runs
    finished_wall: float | None = None
    #: why the campaign cannot run although it was started ("" when it can): its problem does not load here
    #: (a package moved or deleted since), ...; the planner fails it with this reason instead of resuming it
    broken: str = ""
    #: the candidate the final comparison is timing ("" before it starts): `kfactory run` says so while it waits
    comparing: str = ""
    #: the search's best whose showdown has been asked for ("" before): the search is over from then on
    showing_down: str = ""
    #: per search best, the contenders its showdowns were asked for
    showdown_asked: dict[str, set[str]] = field(default_factory=dict)
    #: the event ids of compare requests (a showdown's, the final comparison's) that were dead-lettered: no answer
    #: will come, and the driver stops waiting for one
    dead_compares: set[str] = field(default_factory=set)
    #: this planner drives the campaign now: it alone ends it, and a CampaignFinished from anyone else is refused
    driven: bool = False
    #: device-seconds its verifications, screens, measurements and comparisons held the device
    #: (kfactory.judge.order.device_seconds)
    device_s: float = 0.0
    #: of which each search best's showdowns', and each compared result's final comparison's, by candidate (after
    #: the search: no candidate's cost, compare_device_s; a later campaign's reserve: summary
    #: device_seconds_showdown, device_seconds_final_comparison)
    showdown_device_by: dict[str, float] = field(default_factory=dict)
    final_device_by: dict[str, float] = field(default_factory=dict)
    #: under a device budget, the device seconds its search leaves for them, and the earlier campaigns that
    #: figure is from (0: a share of the budget): CampaignStarted.compare_reserve_s, judge.order.room
    compare_reserve_s: float = 0.0
    compare_reserve_campaigns: int = 0
    #: of device_s, what its searched candidates held (not the reference kernel's, nor a manual kernel's: a
    #: naive reference costs many candidates' device time and predicts nothing of the search's; judge.order.room)
    searched_device_s: float = 0.0
    #: the problem's rule for the campaign's result among its measured candidates (Problem.winner), set where the
    #: problem loads; else the lowest score
    winner: Callable[[list[pb.Measured]], pb.Measured] = lowest_score
    #: the weights every measurement of the campaign is ranked by, spelled out (objective.spelled_out: the first
    #: shape's name alone, weight 1, where the package names none), set where a kernel problem loads; None: each
    #: as it was scored (an engine's, a campaign whose problem does not load, memory's fold)
    objective: dict[str, float] | None = None
    #: what the planner times after the search, where the problem has it (an engine's timing rounds and
    #: showdown: kfactory/engines/finale.py EngineFinale, set by the planner service); it folds every event of
    #: the campaign (`fold`), names the next re-timing request (`next`), and the winner it decides (`winner`) is
    #: the campaign's result
    finale: Any = None

    def __post_init__(self):
        self.strategy = None
        #: the coder portfolio (template coder and agent personas): results, costs, yields
        self.coders = CoderLedger()
        self.template_exhausted = False
        #: why agent coders are off although the spec asked for them ("" when they are on or not asked for)
        self.agent_note = ""
        self.token_seconds = 1e-3
        if self.space:
            # strategies are pluggable code: any failure of one is this campaign's failure, never the planner's
            try:
                self.strategy = make_strategy(self.spec.strategy or "default", self.space, self.spec.seed,
                                             **dict(self.spec.strategy_options))
            except Exception as e:  # noqa: BLE001 (reported as the campaign's reason, with its type)
                self.strategy_failed("construction", e)

    def strategy_failed(self, during: str, e: Exception) -> None:
        """Stop using the strategy and keep why (construction, ask or tell raised); the first failure is the
        reason, not what a later call on the stopped strategy ran into."""
        self.strategy = None
        if not self.strategy_error:
            name = self.spec.strategy or "default"
            self.strategy_error = f"strategy {name!r} failed in {during}: {type(e).__name__}: {e}"
        self.changed.set()

    # -- folding events -----------------------------------------------------------------------
    def apply(self, event: pb.Event, own: bool = False) -> str:
        """Fold one event in; applying the same event twice changes nothing. Returns why the event was refused
        ("" when it was folded in): an event that cannot be believed (kfactory/evidence/trust.py) changes nothing, and
        its id stays free for the real event. `own`: the planner applies an event it is about to publish."""
        if event.id in self.seen_events:
            return ""
        kind = ev.kind_of(event)
        handle = handler_of(kind)  # before anything changes: an unknown kind leaves the state as it was
        if why := refusal(self, event, kind, own):
            return why
        self.seen_events.add(event.id)
        held = device_seconds(event)
        self.device_s += held
        if kind == "comparison":
            by = self.showdown_device_by if event.comparison.showdown else self.final_device_by
            by[event.comparison.candidate_id] = by.get(event.comparison.candidate_id, 0.0) + held
        elif (cand := ev.candidate_of(event)) is not None and is_kind(cand.origin, *SEARCHED):
            self.searched_device_s += held
        if kind == "point_proposed":
            self.proposals[event.point_proposed.point_id] = event
        elif kind == "campaign_started":
            self.started_wall = event.time_unix_ns / 1e9 or self.started_wall
            self.started_ns = event.time_unix_ns
        elif kind == "campaign_finished":
            self.finished_wall = event.time_unix_ns / 1e9 or time.time()
        if handle is not None:
            handle(self, getattr(event, kind))
        if self.finale is not None:
            self.finale.fold(event)
        self.changed.set()
        return ""

    def _on_campaign_started(self, m: pb.CampaignStarted) -> None:
        self.device.CopyFrom(m.device)
        self.compare_reserve_s, self.compare_reserve_campaigns = m.compare_reserve_s, m.compare_reserve_campaigns
        evidence = [Evidence(point, p.relative, p.campaign_id) for p in m.priors
                    if self.space is not None and self.space.valid(point := Point(p.family, p.params_json))]
        # up to spec.warm_start points the earlier campaigns rate best together (weighted by the strategy's trust
        # in each) are proposed first; the strategy learns from all of them
        self.priors = WarmPriors(evidence, self.spec.warm_start)
        self.source_devices = {p.campaign_id: p.device for p in m.priors}
        for k in m.known_wrong:
            self.learn_wrong(k.candidate_id, k.campaign_id)
        if self.strategy and evidence:
            try:
                self.strategy.warm(evidence)
            except Exception as e:  # noqa: BLE001 (reported as the campaign's reason, with its type)
                self.strategy_failed("warm", e)

    def _on_point_proposed(self, m: pb.PointProposed) -> None:
        point = Point(m.family, m.params_json) if is_kind(m.origin, *STRATEGY) else None
        self.coders.on_point(m)
        self.points.setdefault(m.point_id, PointState(point, m.origin))
        if point and self.strategy:
            self.strategy.seen.add(point)
        self.counts.proposed += 1

    def _on_candidate_created(self, m: pb.CandidateCreated) -> None:
        self.proposals.pop(m.candidate.point_id, None)
        self.candidates[m.candidate.id] = m.candidate
        self.coders.on_candidate(m.candidate)
        if m.candidate.origin == Origin.REFERENCE.of():
            self.reference_id = m.candidate.id

    def _on_compiled(self, m: pb.Compiled) -> None:
        self.counts.compiled += 1
        self.artifacts[m.candidate.id] = m.artifact_digest
        self.candidates[m.candidate.id] = m.candidate

    def _on_compile_failed(self, m: pb.CompileFailed) -> None:
        self.counts.compile_failed += 1
        self.coders.on_compile_failed(m)
        self._finish_point(m.candidate.point_id, None)
        self._tell_awaiting(m.candidate.id, None)

    def _on_verified(self, m: pb.Verified) -> None:
        self.counts.verified += 1
        self.verified.add(m.candidate.id)
        self.coders.on_verified(m)

    def _on_rejected(self, m: pb.Rejected) -> None:
        if ev.timing_round(m) >= 2:   # a later timing round (the finale's, which folds it): not the search's
            return
        self.counts.rejected += 1
        self.coders.on_rejected(m)
        if m.reason == pb.PROBLEM_ERROR and not self.broken:
            # no candidate can be judged against a reference that fails: the campaign fails with its error
            self.broken = f"the problem's reference failed: {m.message}"
        elif m.candidate.origin == Origin.REFERENCE.of() and m.reason in DISAGREES and not self.broken:
            # the package's own kernel disagrees with its reference.py: one of the two, or the tolerance, is wrong,
            # and every candidate would be judged against it (a campaign 'completed' with every kernel wrong)
            self.broken = (f"the problem's own reference kernel failed verification ({pb.RejectReason.Name(m.reason)}:"
                           f" {m.message}): reference.py, the tolerance or the reference kernel is wrong; fix the "
                           "package (kfactory problems check) and run again")
        point_id = ev.outcome_point(m)
        if m.reason == pb.DUPLICATE:  # not the point's fault: it scores like its twin, now or when that is known
            twin = self.measured.get(m.candidate.id)
            if twin is None:
                self.awaiting_twin.setdefault(m.candidate.id, []).append(point_id)
            self._finish_point(point_id, self._score(twin) if twin else None, tell=twin is not None)
            return
        self._finish_point(point_id, None)
        self._tell_awaiting(m.candidate.id, None)

    def _on_measured(self, m: pb.Measured) -> None:
        if ev.timing_round(m) >= 2:   # a later timing round (the finale's, which folds it): not the search's
            return
        m = self._in_objective(m)
        self.counts.measured += 1
        self.coders.on_measured(m)
        self.measured[m.candidate.id] = m
        if not self.goal_by and m.candidate.id not in self.disqualified and self._reaches_goal(m):
            self.goal_by = m.candidate.id
        if m.candidate.id in self.known_wrong:
            self.threshold_stale = True
        self._finish_point(m.candidate.point_id, self._score(m))
        self._tell_awaiting(m.candidate.id, self._score(m))

    def _in_objective(self, m: pb.Measured) -> pb.Measured:
        """m as this campaign ranks it: a full measurement scored with other weights (a benchmarker that loaded
        another version of the package, a package edited before a planner's restart replays the stream, a forged
        weight) is rescored from its own timings under the campaign's objective, as a copy (the event may be
        shared with other readers). One that lacks a shape the campaign scores, or a screened-out one (a bound
        from one timing, never a result), is kept as it was scored: refusing it would leave its point in flight."""
        if self.objective is None or m.screened_out or objective.scored_by(m) == self.objective:
            return m
        try:
            score = objective.score(m.timings, self.objective)
        except KeyError:
            return m
        out = pb.Measured()
        out.CopyFrom(m)
        objective.restate(out, score, self.objective)
        return out

    def _score(self, m: pb.Measured) -> float | None:
        """What the strategy is told of a measured kernel: its score, or a failure (None) for a kernel known to be
        wrong (fast for no good reason)."""
        return None if m.candidate.id in self.known_wrong else m.score_s

    def _on_dead_letter(self, m: pb.DeadLetter) -> None:
        """Work that can never finish: its point is over (counted as rejected), or the campaign would wait."""
        if (req := ev.decoded(m.payload)) is not None and req.HasField("compare_request"):
            self.dead_compares.add(req.id)   # its candidate's point ended long before
            return
        work = ev.dead_work(m)
        if work is None or m.cause == pb.CAMPAIGN_CANCELLED:   # the latter: not begun when the campaign was
            return                                              # cancelled, so not done, as its user asked
        point_id, cand = work
        ps = self.points.get(point_id)
        if ps is not None and not ps.done:
            self.counts.rejected += 1
            self._finish_point(point_id, None)
            self.dead_lettered.add(point_id)
        if cand is not None:
            # its duplicates learn it failed, and stay waiting: if the work is sent back and ends, they learn that
            self._tell_points(self.awaiting_twin.get(cand.id, []), None)

    def _on_resend_requested(self, m: pb.ResendRequested) -> None:
        self.resend_requests[m.dlq_seq] = m

    def _on_resend_answered(self, m: pb.ResendAnswered) -> None:
        """An accepted resend puts its point in flight again: the campaign waits for the work's new outcome,
        which counts instead of the dead letter's (and the strategy, told of a failure then, learns it)."""
        self.resend_requests.pop(m.dlq_seq, None)
        ps = self.points.get(m.point_id)
        if m.accepted and ps is not None and ps.done and m.point_id in self.dead_lettered:
            self.dead_lettered.discard(m.point_id)
            self.counts.rejected -= 1
            ps.done = False
            self.resent[m.point_id] = m.dlq_seq

    def _on_compare_request(self, m: pb.CompareRequest) -> None:
        if m.contenders:
            self.showing_down = m.candidate.id
            self.showdown_asked.setdefault(m.candidate.id, set()).update(c.id for c in m.contenders)
        else:
            self.comparing = m.candidate.id

    def _on_comparison(self, m: pb.Comparison) -> None:
        if m.showdown:
            self.showdowns[m.candidate_id] = m
        elif m.candidate_id not in self.disqualified:  # a result found wrong: its other shapes' figures are not kept
            self.comparisons[m.shape] = m
        if m.showdown and m.failed_candidate:  # any failure there, as before: no result of this campaign
            self._disqualify(m.failed_candidate)
        elif (cid := found_wrong(m)) and cid not in self.disqualified:
            # (a late answer about a kernel already out, learned wrong meanwhile, takes no try of FINAL_TRIES)
            self._disqualify(cid)
            self.final_wrong.add(cid)

    @property
    def compare_device_s(self) -> float:
        """The device time its showdowns and final comparisons held."""
        return sum(self.showdown_device_by.values()) + sum(self.final_device_by.values())

    @property
    def search_device_s(self) -> float:
        """The device time its candidates held (verifications, screens, measurements): all but the comparisons'."""
        return self.device_s - self.compare_device_s

    @property
    def problem_key(self) -> str:
        """What campaigns of one problem share: its name where it loads, else the spec's locator."""
        return self.problem_name or self.spec.problem

    def learn_wrong(self, candidate: str, campaign: str) -> None:
        """Another campaign of the problem (`campaign`) found this kernel wrong: it is no result of this one
        either. One this campaign took out itself stays its own finding."""
        if candidate and candidate not in self.disqualified:
            self.known_wrong[candidate] = campaign
            self._disqualify(candidate)
            self.threshold_stale = self.threshold_stale or candidate in self.measured
            self.changed.set()

    def _disqualify(self, candidate: str) -> None:
        """No result of this campaign, whatever its score; where it was the kernel that reached the goal, the
        next measured one that reaches it is, or none, and the search goes on (CampaignDriver._search_to_end),
        unless a comparison was asked already: then the search is over for good (CampaignDriver._budget_left)."""
        self.disqualified.add(candidate)
        if self.goal_by == candidate:
            self.goal_by = self._goal_by()

    def _goal_by(self) -> str:
        """The first kernel measured that reached the goal and is not disqualified ("" when none did)."""
        return next((cid for cid, m in self.measured.items()
                     if cid not in self.disqualified and self._reaches_goal(m)), "")

    def _on_campaign_finished(self, m: pb.CampaignFinished) -> None:
        self.finished = m

    def _finish_point(self, point_id: str, score: float | None, tell: bool = True) -> None:
        self.proposals.pop(point_id, None)
        self.resent.pop(point_id, None)
        ps = self.points.get(point_id)
        if ps is not None and point_id in self.dead_lettered:
            # the work was sent back after its dead letter and has ended now: this outcome counts instead, and
            # the strategy, told of a failure then, learns the real result
            self.dead_lettered.discard(point_id)
            self.counts.rejected -= 1
            if tell:
                self._tell(ps, score)
            return
        if ps is None or ps.done:
            return
        ps.done = True
        if tell:
            self._tell(ps, score)

    def _tell_awaiting(self, candidate_id: str, score: float | None) -> None:
        """The strategy learns the result of the points that were duplicates of this candidate (until then they
        count as in flight for it, see Strategy.pending)."""
        self._tell_points(self.awaiting_twin.pop(candidate_id, []), score)

    def _tell_points(self, point_ids: list[str], score: float | None) -> None:
        for point_id in point_ids:
            if (ps := self.points.get(point_id)) is not None:
                self._tell(ps, score)

    def _tell(self, ps: PointState, score: float | None) -> None:
        if ps.point and self.strategy:
            try:
                self.strategy.tell(ps.point, score)
            except Exception as e:  # noqa: BLE001 (as in construction: the campaign fails, with the reason)
                self.strategy_failed("tell", e)

    # -- questions the loop asks --------------------------------------------------------------
    def in_flight(self) -> int:
        return sum(1 for p in self.points.values() if not p.done)

    def search_proposed(self) -> int:
        return sum(1 for p in self.points.values() if is_kind(p.origin, *SEARCHED))

    def search_done(self) -> int:
        """Its searched points with an outcome (measured, rejected or failed to compile)."""
        return sum(1 for p in self.points.values() if p.done and is_kind(p.origin, *SEARCHED))

    def next_prior(self) -> Point | None:
        """The next warm-start point not proposed yet, while the strategy trusts the sources enough
        (transfer.WarmPriors; the strategy is told its result like any other)."""
        if self.priors.left <= 0:  # no warm start (or it is over): the strategy is not asked about its sources
            return None
        return self.priors.next(self.source_trust(), lambda p: self.strategy is not None and p in self.strategy.seen)

    def source_trust(self):
        """The strategy's judgement of the warm start's sources (strategies/agreement.Trust), None when it makes
        none."""
        if self.strategy is None:
            return None
        try:
            return self.strategy.trust()
        except Exception as e:  # noqa: BLE001 (as in ask and tell: the campaign fails, with the reason)
            self.strategy_failed("trust", e)
            return None

    def strategy_in_flight(self) -> int:
        """The strategy's points (its own and the warm start's) not finished yet."""
        return sum(1 for p in self.points.values() if not p.done and is_kind(p.origin, *STRATEGY))

    def agent_in_flight(self, persona: str) -> int:
        return sum(1 for p in self.points.values() if not p.done and p.origin == Origin.AGENT.of(persona))

    def can_win(self) -> dict[str, pb.Measured]:
        """The kernels measured in full that can be the campaign's result, by id: not the reference kernel, not
        screened out (a screen's timing may never have been verified), not disqualified."""
        return {cid: m for cid, m in self.measured.items()
                if cid != self.reference_id and not m.screened_out and cid not in self.disqualified}

    def screen_threshold(self) -> float:
        """The best full score of a kernel that can be the result (can_win): what the screen compares with;
        infinity before there is one (nothing is screened out then)."""
        return min((m.score_s for m in self.can_win().values()), default=math.inf)

    def ranked(self, k: int) -> list[str]:
        """The k fastest measured candidates (the reference included, none disqualified: an agent would improve
        on a kernel found wrong), fastest first: an agent's parents."""
        full = [m for m in self.measured.values() if not m.screened_out and m.candidate.id not in self.disqualified]
        return [m.candidate.id for m in sorted(full, key=lambda m: m.score_s)[:k]]

    def best(self) -> pb.Measured | None:
        """The campaign's result: of the candidates measured in full that are not the reference kernel (a
        screened-out timing is no result: it may never have been verified), the one the finale decided (an
        engine's showdown), else the one the showdown of the search's best decided (showdown_winner), else the
        search's best (search_best: the one `winner` picks, the problem's rule, Problem.winner; the lowest score
        where none is set)."""
        if self.finale is not None and (decided := self.finale.winner()) in self.measured \
                and decided not in self.disqualified:
            return self.measured[decided]
        pick = self.search_best()
        if pick is None:
            return None
        return self.measured.get(self.showdown_winner(pick) or "", pick)

    def search_best(self) -> pb.Measured | None:
        """The search's result: of the candidates measured in full that are not the reference kernel (nor
        disqualified), the one `winner` picks by their own measurements (before any showdown)."""
        mine = list(self.can_win().values())
        return self.winner(mine) if mine else None

    def contenders(self, pick: pb.Measured, margin: float, most: int) -> list[pb.Measured]:
        """The showdown's contenders beside `pick`: up to `most` other candidates measured in full (not the
        reference kernel) whose scores are within `margin` of pick's, fastest first."""
        near = [m for cid, m in self.can_win().items() if cid != pick.candidate.id and cid in self.artifacts
                and m.score_s <= pick.score_s * (1 + margin)]
        return sorted(near, key=lambda m: m.score_s)[:max(0, most)]

    def showdown_winner(self, pick: pb.Measured) -> str | None:
        """The candidate the showdown of `pick` decided (showdown_decision); None when there was no showdown for
        pick, or it failed."""
        return self.showdown_decision(pick)[0]

    def showdown_decision(self, pick: pb.Measured) -> tuple[str | None, str]:
        """(the candidate the showdown of `pick` decided, why). The lowest median of its interleaved timing among
        the candidates measured in full, where it is faster than pick's outside the noise (the medians' intervals
        apart): "faster". Inside the noise, a kernel tied with pick there that is faster at every other
        optimisation shape outside the noise, by their own measurements (tied_but_faster_elsewhere): "tied, faster
        elsewhere"; else pick: "stays". (None, "") when there was no showdown for pick, or it failed."""
        sd = self.showdowns.get(pick.candidate.id)
        if sd is None or sd.error:
            return None, ""
        eligible = self.can_win()
        timed = {e.candidate_id: e.timing for e in sd.entries if e.HasField("timing") and e.candidate_id in eligible}
        if not timed:
            return None, ""
        fastest = min(timed, key=lambda cid: timed[cid].median_s)
        mine = timed.get(pick.candidate.id)
        if mine is None or significant(timed[fastest], mine):
            return fastest, "faster"
        tied = [self.measured[cid] for cid, t in timed.items() if cid != pick.candidate.id and not significant(t, mine)]
        if (other := tied_but_faster_elsewhere(pick, tied, sd.shape)) is not None:
            return other, "tied, faster elsewhere"
        return pick.candidate.id, "stays"

    def reported(self) -> tuple[pb.Counts, pb.Measured | None]:
        """(counts, best) as the campaign reports them: live while it runs, and once it has finished, what it
        finished with. Events after that (an expired or cancelled campaign's work still in flight, a dead letter
        sent back just as the campaign ended) are kept in memory's archive but change no finished campaign; they
        are counted apart, in after_finish."""
        if self.finished is None:
            return self.counts, self.best()
        return self.finished.counts, self.measured.get(self.finished.best_candidate_id)

    @property
    def after_finish(self) -> pb.Counts:
        """What the fold counts beyond what the campaign finished with (CampaignStatus.after_finish): results
        of work still out at its end. A difference of counts, not an order of arrival: a result the stream holds
        before the finish but this planner folded after publishing it (the finish did not count it) is late, and
        a restarted planner, which folds it before the finish, finds the same."""
        return ev.late_counts(self.counts, self.finished.counts) if self.finished is not None else pb.Counts()

    def goal_reached(self) -> pb.Measured | None:
        """The first candidate measured in full (not the reference kernel, not screened out, not disqualified)
        whose every timing reached spec.goal_fraction of the device's measured ceiling (sol_fraction); None without
        a goal."""
        return self.measured.get(self.goal_by) if self.goal_by else None

    def _reaches_goal(self, m: pb.Measured) -> bool:
        goal = self.spec.goal_fraction
        return (goal > 0 and m.candidate.id != self.reference_id and not m.screened_out and bool(m.timings)
                and all(t.sol_fraction >= goal for t in m.timings))

    def elapsed(self) -> float:
        """Seconds since the campaign started (its CampaignStarted's time, so a restarted planner keeps its
        clock), up to when it finished."""
        return (self.finished_wall or time.time()) - self.started_wall

    def expired(self) -> bool:
        """Its time budget (spec.budget_seconds, when it has one) is spent."""
        return bool(self.spec.budget_seconds) and self.elapsed() >= self.spec.budget_seconds

    def finishing(self) -> str:
        """Why the campaign ends without waiting for work in flight ("" when it waits for it)."""
        if self.cancelled:
            return f"cancelled: {self.cancelled}"
        if self.broken:
            return self.broken
        if self.strategy_error:
            return "its search strategy failed"
        return "its time budget is spent" if self.expired() else ""

    def state_name(self) -> str:
        return self.finished.state if self.finished else "running"


#: the event kinds a campaign's state folds in, and the method that folds each one's body
HANDLERS: dict[str, Callable[[CampaignState, Any], None]] = {
    "campaign_started": CampaignState._on_campaign_started,
    "point_proposed": CampaignState._on_point_proposed,
    "candidate_created": CampaignState._on_candidate_created,
    "compiled": CampaignState._on_compiled,
    "compile_failed": CampaignState._on_compile_failed,
    "verified": CampaignState._on_verified,
    "rejected": CampaignState._on_rejected,
    "measured": CampaignState._on_measured,
    "dead_letter": CampaignState._on_dead_letter,
    "resend_requested": CampaignState._on_resend_requested,
    "resend_answered": CampaignState._on_resend_answered,
    "compare_request": CampaignState._on_compare_request,
    "comparison": CampaignState._on_comparison,
    "campaign_finished": CampaignState._on_campaign_finished,
}
#: kinds the planner folds in without a handler, on purpose: memory's findings are knowledge derived from results
#: the planner has folded already (it reads them through memory's Priors, at submit)
IGNORED = frozenset({"finding"})


def handler_of(kind: str) -> Callable[[CampaignState, Any], None] | None:
    """The method that folds a `kind` event's body; None for a kind the planner ignores on purpose. Raises
    UnknownEventKind for any other kind."""
    if kind in HANDLERS:
        return HANDLERS[kind]
    if kind in IGNORED:
        return None
    raise UnknownEventKind(kind)


def tied_but_faster_elsewhere(pick: pb.Measured, tied: list[pb.Measured], scored: str) -> str | None:
    """Of the kernels tied with `pick` on the objective (`scored`: its label, the showdown's shape; the shapes it
    scores are objective.scored_names), the one a user of every optimisation shape wants instead: at each other
    shape, faster than pick outside the noise and by ELSEWHERE_FACTOR at least (their own measurements), the
    lowest product of those shapes' medians over pick's where several are; None when none is (or when the
    objective scores every shape). Kernels tied at the scored shape can differ 2x at another (softmax 1x50257:
    whether a row is split over the threads)."""
    names = objective.scored_names(scored)
    others = {t.shape: t for t in pick.timings if t.shape not in names}
    gains = {}
    for m in tied:
        mine = {t.shape: t for t in m.timings if t.shape not in names}
        if others and mine.keys() == others.keys() and all(_faster(mine[s], others[s]) for s in others):
            gains[m.candidate.id] = math.prod(mine[s].median_s / others[s].median_s for s in others)
    return min(gains, key=lambda cid: gains[cid]) if gains else None


def _faster(a: pb.ShapeTiming, b: pb.ShapeTiming) -> bool:
    """a is faster than b by ELSEWHERE_FACTOR at least, outside the noise."""
    return a.median_s * ELSEWHERE_FACTOR <= b.median_s and significant(a, b)

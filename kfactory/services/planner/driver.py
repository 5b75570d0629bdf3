"""Driving a campaign: propose the fixed kernels, hand out design work until the budget is spent, wait for the
work in flight, ask for the problem's timings after the search (an engine's rounds and showdown), time the best
against the reference, and finish.

Every step reads the campaign's state (CampaignState, a fold over its events) and publishes events; the state
changes only when those events are folded in, so a planner restarted mid-campaign drives on from the stream.
"""
from __future__ import annotations

import asyncio
import json
import random
from typing import Callable, Coroutine

from kfactory.agents import persona_stage
from kfactory.claims.base import ClaimsError, ClaimsUnavailable
from kfactory.bus import events as ev
from kfactory.bus.consume import OUTAGE_WAIT_S, retrying
from kfactory.bus.origins import Origin
from kfactory.bus.topology import Stage
from kfactory.judge.order import BEST_TTL_S, best_key, device_budget, device_budget_spent, room, search_budget
from kfactory.judge.measure import available_baselines
from kfactory.observability import stagetime
from kfactory.observability import tracing as telemetry
from kfactory.platform.service import Service
from kfactory.problems import ProblemError
from kfactory.services.planner import coders
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.summary import campaign_summary
from kfactory.v1 import events_pb2 as pb

COMPARE_WAIT_S = 300.0
#: final comparisons that may find the campaign's result wrong, each making the next best the result, before it
#: finishes with the next best uncompared (a kernel wrong there is rare: several in a row say more of the problem
#: or its reference than of the kernels)
FINAL_TRIES = 3
#: how long past its time budget a campaign waits for its points in flight, and may still compare a next best
GRACE_S = 60.0
#: how long one re-timing of the finale may take before the campaign finishes without the rest (an engine's
#: bench is seconds; the benchmarker may wait for the device lease meanwhile)
FINALE_WAIT_S = 600.0


def past_grace(st: CampaignState) -> bool:
    """Whether a campaign with a time budget is GRACE_S past it: it waits for no more work then."""
    return bool(st.spec.budget_seconds) and st.elapsed() > st.spec.budget_seconds + GRACE_S


class CampaignDriver:
    """Runs each campaign this planner drives in a task of its own (`loops`)."""

    def __init__(self, svc: Service):
        self.svc = svc
        self.ctx, self.bus, self.claims, self.settings, self.log = svc.ctx, svc.bus, svc.claims, svc.settings, svc.log
        #: the task driving (or failing) each campaign, by campaign id
        self.loops: dict[str, asyncio.Task] = {}

    def launch(self, st: CampaignState, step: Coroutine) -> None:
        """Run `step` (driving, resuming or failing campaign `st`) as the campaign's task."""
        self.loops[st.id] = asyncio.create_task(step)

    def stop_all(self) -> None:
        """Cancel every campaign's task (the planner stops; a restarted one resumes them from the stream)."""
        for t in self.loops.values():
            t.cancel()

    async def drive(self, st: CampaignState) -> None:
        """Drive campaign `st` to its end. A bug in driving it fails the campaign with the reason, never the
        planner."""
        try:
            await self._propose_fixed(st)
            if await self._search_to_end(st):
                await self._finale(st)
                await self._compare(st)
                while st.in_flight() and not st.finishing():  # work sent back from its dead letter meanwhile
                    await self._wait_in_flight(st)
                    await self._compare(st)
            if failed := st.broken or st.strategy_error:  # broken may be set while it waited
                self.log.error("campaign failed", campaign=st.id, reason=failed)
                await self.finish(st, state="failed", reason=failed)
                return
            await self.finish(st)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in driving this campaign must not kill the planner: record it as failed
            self.log.exception("campaign failed", campaign=st.id)
            await self.finish(st, state="failed", reason=f"planner error: {type(e).__name__}: {e}")

    async def _search_to_end(self, st: CampaignState) -> bool:
        """Search, then wait for the points in flight; False when the campaign broke or its strategy failed
        before the wait. A search that ended on the goal goes on where the kernel that reached it was found wrong
        meanwhile (CampaignState._disqualify), as a planner restarted then would (_budget_left)."""
        while True:
            await self._search(st)
            if st.broken or st.strategy_error:
                return False
            on_goal = st.goal_reached() is not None
            await self._wait_in_flight(st)
            if not (on_goal and st.goal_reached() is None and self._budget_left(st)):
                return True

    def _budget_left(self, st: CampaignState) -> bool:
        if st.cancelled or st.broken or st.expired() or st.goal_reached() is not None:
            return False
        if st.showing_down or st.comparing:   # the search ended before: a restarted planner does not search again
            return False                      # (the kernel that reached the goal may have been found wrong since)
        if device_budget_spent(st, device_budget(st.spec, self.settings.device_seconds)):
            return False
        return not st.spec.budget_candidates or st.search_proposed() < st.spec.budget_candidates

    async def _fix_threshold(self, st: CampaignState) -> None:
        """Raise the screen's threshold (judge.order.best_key) past a kernel known to be wrong: the benchmarker set
        it to that kernel's score when it measured it, and a cheater's score would screen out every honest kernel
        slower than screen_factor times it. Kept for the next step when the claims store does not answer (logged)."""
        if not st.threshold_stale:
            return
        try:
            await self.claims.cache_put(best_key(st.id), repr(st.screen_threshold()).encode(), ttl_s=BEST_TTL_S)
        except ClaimsError as e:
            self.log.warning("cannot raise the screen's threshold past a kernel known to be wrong; trying again at "
                             "the next step", campaign=st.id, error=str(e))
            return
        st.threshold_stale = False

    async def _propose_fixed(self, st: CampaignState) -> None:
        problem = self.ctx.problem(st.spec.problem)
        target = st.spec.target.split(":")[0]
        if target in problem.spec.reference_kernel:
            source, flags, language, rule = problem.reference_kernel(target)
            await self.propose(st, "reference", "{}", Origin.REFERENCE.of(),
                               pb.ManualSource(name="reference", source=source, compile_flags=flags, language=language,
                                               launch_json=ev.canonical_json(rule) if rule else ""))
        for m in st.spec.manual_sources:
            origin = Origin.MANUAL.of(m.name)  # a manual kernel's family is its origin too
            await self.propose(st, origin, json.dumps({"manual": m.name}), origin, m)

    async def _search(self, st: CampaignState) -> None:
        """Hand out design work until the budget is spent: each slot goes to the coder the portfolio draws
        (kfactory/services/planner/coders.py): the template coder (the strategy's next point) or an agent persona."""
        rng = random.Random(st.spec.seed ^ 0xC0DE5)
        attempts = 0
        while self._budget_left(st) and (st.strategy is not None or coders.agents_on(st)):
            await self._fix_threshold(st)
            if st.in_flight() >= room(st, device_budget(st.spec, self.settings.device_seconds)):
                await self._wait_change(st)
                continue
            arm = st.coders.choose(coders.eligible(st, self.settings), rng, st.token_seconds)
            if arm is None:
                if st.in_flight():
                    await self._wait_change(st)
                    continue
                break
            if arm != coders.TEMPLATE:
                attempts += 1
                await self._propose_agent(st, arm, attempts)
                continue
            try:
                with stagetime.span("planning"):  # the strategy's model runs on the event loop: bookkeeping
                    prior = st.next_prior()
                    if prior is None and st.strategy is None:  # it failed while judging its warm start
                        break
                    point = prior or st.strategy.ask()
            except Exception as e:  # noqa: BLE001 (a strategy's failure fails its campaign, with the reason)
                st.strategy_failed("ask", e)
                break
            if point is None:
                st.template_exhausted = True
                continue
            await self.propose(st, point.family, point.params_json,
                               (Origin.WARM if prior else Origin.TEMPLATE).of(point.family))

    async def _propose_agent(self, st: CampaignState, persona: str, attempt: int) -> None:
        """Queue one agent task on the persona's work subject, with its parents and the campaign's device."""
        parents = coders.parents_for(st, persona, self.settings.llm_parents)
        problem = self.ctx.problem(st.spec.problem)
        first = st.candidates.get(parents[0])
        fams = problem.families_for(st.spec.target.split(":")[0])
        family = first.family if first is not None and first.family in problem.families else \
            (fams[0].name if fams else "")
        pp = coders.agent_point(st, persona, parents, family, attempt)
        if not await self._claim_once(f"{st.id}:point:{pp.point_id}"):
            return  # an earlier life of this planner proposed it; the next attempt gets another id
        event = ev.make_event(st.id, self.svc.name, pp.point_id, point_proposed=pp)
        st.apply(event)
        with telemetry.root_span(f"{self.svc.name} propose", **{"kf.campaign": st.id, "kf.point": pp.point_id,
                                                                "kf.origin": Origin.AGENT.of(persona)}):
            await self.bus.publish(event)
            await self.bus.send_work(persona_stage(persona), event)

    async def _claim_once(self, key: str) -> bool:
        """claims.claim_once, waited through an outage of the claims store (a restarted Redis) as the services'
        handlers are (bus.consume.OUTAGE_WAIT_S): a campaign fails for its own reasons, not for a second of
        Redis being away (tests/test_faults.py redis-wiped failed a campaign this way)."""
        return await retrying(lambda: self.claims.claim_once(key), (ClaimsUnavailable,), OUTAGE_WAIT_S, 0.2,
                              "claims store unavailable; retrying the point's claim", key=key)

    async def propose(self, st: CampaignState, family: str, params_json: str, origin: str,
                      manual: pb.ManualSource | None = None) -> None:
        """Propose one design point (or a fixed kernel, `manual`) once per campaign: publish it and queue its
        work for the template coder."""
        pid = ev.point_id(family, json.loads(params_json)) if manual is None else \
            ev.sha256_hex(origin + manual.source + manual.compile_flags)[:24]
        if not await self._claim_once(f"{st.id}:point:{pid}"):
            return  # another planner (or an earlier life of this one) proposed it already
        pp = pb.PointProposed(point_id=pid, family=family, params_json=params_json, strategy=st.spec.strategy,
                              problem=st.spec.problem, target=st.spec.target, origin=origin,
                              runner_threads=st.spec.threads)
        if manual is not None:
            pp.manual.CopyFrom(manual)
        event = ev.make_event(st.id, self.svc.name, pid, point_proposed=pp)
        st.apply(event)
        # the root of this point's trace: every stage's span for its candidate descends from it
        with telemetry.root_span(f"{self.svc.name} propose", **{"kf.campaign": st.id, "kf.point": pid,
                                                                "kf.origin": origin}):
            await self.bus.publish(event)
            await self.bus.send_work(Stage.CODER, event)

    async def _wait_change(self, st: CampaignState, timeout: float = 1.0) -> None:
        st.changed.clear()
        try:
            await asyncio.wait_for(st.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass  # no event for this campaign within `timeout`: the caller looks at its budget and clock again

    async def _wait_in_flight(self, st: CampaignState) -> None:
        while st.in_flight() and not (st.cancelled or st.broken):
            if past_grace(st):
                self.log.warning("giving up on in-flight points", campaign=st.id, in_flight=st.in_flight())
                return
            await self._wait_change(st)

    async def _finale(self, st: CampaignState) -> None:
        """The problem's timings after the search (CampaignState.finale: kfactory/engines/finale.py), one request at
        a time on the benchmarker's work subject, each after the answer to the one before is folded in (its
        Measured or Rejected event, or its dead letter). From the campaign's state alone: a restarted planner
        goes on with the first request still unanswered. A request unanswered for FINALE_WAIT_S ends the finale
        (logged); so does the campaign's device-time budget, where the search would stop (device_budget_spent);
        the campaign finishes with what it has."""
        fin = st.finale
        loop = asyncio.get_running_loop()
        budget = device_budget(st.spec, self.settings.device_seconds)
        while fin is not None and not (st.cancelled or st.broken or st.expired()):
            if device_budget_spent(st, budget):
                self.log.info("the device-time budget is spent: the campaign finishes without the rest of its "
                              "timing rounds", campaign=st.id, device_s=round(st.device_s, 3), budget_s=budget)
                return
            req = fin.next()
            if req is None:
                return
            key = (req.candidate.id, req.round)
            event = ev.make_event(st.id, self.svc.name, f"{req.candidate.id}:round{req.round}", verified=req)
            with telemetry.root_span(f"{self.svc.name} retime", **{"kf.campaign": st.id,
                                                                   "kf.candidate": req.candidate.id}):
                await self.bus.send_work(Stage.BENCHMARKER, event)
            deadline = loop.time() + FINALE_WAIT_S
            while key not in fin.answered and not (st.cancelled or st.broken):
                if loop.time() > deadline:
                    self.log.warning("a re-timing got no answer: the campaign finishes without the rest",
                                     campaign=st.id, candidate=req.candidate.id, round=req.round)
                    return
                await self._wait_change(st)

    async def _showdown(self, st: CampaignState) -> bool:
        """Time the search's best and its contenders (CampaignState.contenders: within Settings.showdown_margin of
        its score) interleaved at the shapes the objective scores (kfactory/judge/objective.py), once per search
        best and set of contenders; the fastest, where it is faster outside the noise, becomes the campaign's result
        (CampaignState.best). Each was measured alone, minutes apart: on a host whose load drifts, scores a few
        percent apart do not order kernels a few percent apart. Not for an engine (its finale
        decides), a replayed campaign (its timings are recordings: nothing to time together), or when the setting is
        under 2; a showdown unanswered within COMPARE_WAIT_S, or whose request was dead-lettered, is left (logged).
        True when the search's best is out: its answer found it wrong, or another campaign did meanwhile (then the
        next best has a showdown of its own)."""
        most = self.settings.showdown_contenders - 1
        pick = st.search_best()
        if st.finale is not None or most < 1 or pick is None or st.cancelled or pick.candidate.id not in st.artifacts \
                or any(t.mode == "replayed" for t in pick.timings):
            return False
        rivals = st.contenders(pick, self.settings.showdown_margin, most)
        if not rivals or (pick.candidate.id in st.showdowns and
                          {m.candidate.id for m in rivals} <= st.showdown_asked.get(pick.candidate.id, set())):
            return False  # nothing to time together, or decided already (a restarted planner folds it from the stream)
        req = pb.CompareRequest(candidate=pick.candidate, candidate_artifact=st.artifacts[pick.candidate.id],
                                contenders=[m.candidate for m in rivals],
                                contender_artifacts=[st.artifacts[m.candidate.id] for m in rivals])
        event = ev.make_event(st.id, self.svc.name, ev.showdown_key(req), compare_request=req)
        before = st.showdowns.get(pick.candidate.id)  # taken before the request: its answer may come at once
        if not await self._ask_benchmarker(st, event, "showdown", pick.candidate.id,
                                           lambda: st.showdowns.get(pick.candidate.id) is not before
                                           or pick.candidate.id in st.disqualified):  # learned wrong meanwhile
            self.log.warning("the showdown got no answer: the search's best stays the result", campaign=st.id,
                             candidate=pick.candidate.id)
            return False
        return pick.candidate.id in st.disqualified

    async def _compare(self, st: CampaignState) -> None:
        """The showdown and the final comparison of the campaign's result. One that finds its kernel wrong makes
        the next best the result, with a showdown and a final comparison of its own: after a showdown, until one
        holds; after a final comparison, FINAL_TRIES results in all (CampaignState.final_wrong: a restarted
        planner counts those before it), and after any final comparison whose result turned out wrong (found so
        there, or by another campaign meanwhile) none once the device budget is spent (the comparisons' device
        time counted) or the time budget's grace (GRACE_S past it, as for the points in flight) is over: the
        result is then the search's next best, with no showdown and no final comparison (the summary shows none)."""
        # a final comparison found its result out (this life's; or a restarted one's, learned wrong during it)
        compared = bool(st.comparing) and st.comparing in st.disqualified
        budget = device_budget(st.spec, self.settings.device_seconds)
        for _ in range(len(st.measured)):
            if (compared or st.final_wrong) and (len(st.final_wrong) >= FINAL_TRIES or past_grace(st)
                                                 or bool(budget) and st.device_s >= budget):
                self.log.warning("a compared result turned out wrong: the next best is not compared (FINAL_TRIES, "
                                 "the time budget's grace or the device budget)", campaign=st.id,
                                 found_wrong=len(st.final_wrong))
                return
            if await self._showdown(st):
                continue
            if not await self._final_compare(st):
                return
            compared = True

    async def _final_compare(self, st: CampaignState) -> bool:
        """The result timed against the reference kernel and the baselines at every optimisation shape; True when
        the result is out (found wrong there, or by another campaign meanwhile: CampaignState.disqualified)."""
        best = st.best()
        ref = st.candidates.get(st.reference_id)
        if st.cancelled or best is None or ref is None or ref.id not in st.artifacts:
            return False
        problem = self.ctx.problem(st.spec.problem)
        req = pb.CompareRequest(candidate=best.candidate, reference=ref,
                                baselines=available_baselines(problem, st.spec.target.split(":")[0]),
                                candidate_artifact=st.artifacts[best.candidate.id],
                                reference_artifact=st.artifacts[ref.id])
        event = ev.make_event(st.id, self.svc.name, f"compare:{best.candidate.id}", compare_request=req)
        want = {problem.shape_str(s) for s in problem.shapes("optimize")}
        await self._ask_benchmarker(st, event, "compare", best.candidate.id, lambda: (
            best.candidate.id in st.disqualified   # found wrong at one shape: the rest need not come
            or want <= {shape for shape, c in st.comparisons.items() if c.candidate_id == best.candidate.id}))
        return best.candidate.id in st.disqualified

    async def _ask_benchmarker(self, st: CampaignState, event: pb.Event, what: str, candidate: str,
                               answered: Callable[[], bool]) -> bool:
        """Send a compare request (a showdown's, the final comparison's) to the benchmarker and wait until
        `answered()`; False when no answer can come: its request was dead-lettered (before: a restarted planner
        folds that, and does not send it again; or meanwhile), the campaign was cancelled or broke, or
        COMPARE_WAIT_S passed."""
        if event.id in st.dead_compares:
            return False
        with telemetry.root_span(f"{self.svc.name} {what}", **{"kf.campaign": st.id, "kf.candidate": candidate}):
            await self.bus.publish(event)
            await self.bus.send_work(Stage.BENCHMARKER, event)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMPARE_WAIT_S
        while not answered():
            if loop.time() > deadline or st.cancelled or st.broken or event.id in st.dead_compares:
                return False
            await self._wait_change(st)
        return True

    def _problem_or_none(self, st: CampaignState):
        """The campaign's problem, or None when it no longer loads (its summary then names no problem shapes)."""
        try:
            return self.ctx.problem(st.spec.problem)
        except ProblemError:
            return None

    async def finish(self, st: CampaignState, state: str | None = None, reason: str = "") -> None:
        """Publish the campaign's end (once): its state, counts, best kernel and summary."""
        if st.finished is not None:
            return
        if state is None:
            state = "cancelled" if st.cancelled else "expired" if st.expired() and st.in_flight() else "completed"
            reason = st.cancelled or reason
        best = st.best()
        summary = campaign_summary(st, self._problem_or_none(st))
        if budget := device_budget(st.spec, self.settings.device_seconds):
            summary["device_seconds_budget"] = budget
            # what the search left for the comparisons, from how many earlier campaigns' (0: a share of the budget)
            summary["device_seconds_reserve"] = round(budget - search_budget(st, budget), 3)
            summary["device_seconds_reserve_campaigns"] = st.compare_reserve_campaigns
        fin = pb.CampaignFinished(state=state, reason=reason, counts=st.counts,
                                  best_candidate_id=best.candidate.id if best else "",
                                  summary_json=json.dumps(summary))
        event = ev.make_event(st.id, self.svc.name, "finish", campaign_finished=fin)
        st.apply(event, own=True)
        with telemetry.root_span(f"{self.svc.name} finish", **{"kf.campaign": st.id, "kf.state": state}):
            await self.bus.publish(event)
        self.log.info("campaign finished", campaign=st.id, state=state, counts=str(st.counts).replace("\n", " "))

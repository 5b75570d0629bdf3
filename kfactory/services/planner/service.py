"""The planner: campaigns, search strategies and budgets; hosts the Campaigns gRPC service.

Campaign state is a fold over the events stream: at start-up the planner replays the stream from its
beginning, so a restarted planner resumes unfinished campaigns where they were.
"""
from __future__ import annotations

import asyncio
import json
import random
import secrets
import time

import grpc

from kfactory.bus import deadletters
from kfactory.bus import events as ev
from kfactory.platform import security
from kfactory.observability import tracing as telemetry
from kfactory.evidence import trust
from kfactory.bus.outcomes import ack_quietly
from kfactory.bus.topology import EVENTS_STREAM
from kfactory.platform.grpcserver import start_server
from kfactory.observability import stagetime
from kfactory.judge.order import device_budget_spent, room
from kfactory.problems import ProblemError
from kfactory.platform.service import Service
from kfactory.strategies import Space
from kfactory.targets.cuda.nvml import NvmlUnavailable
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from kfactory.judge.verify import available_baselines
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner import coders, specs
from kfactory.services.planner.specs import SpecError  # noqa: F401 (the API answers it; tests import it here)
from kfactory.agents import persona_stage

COMPARE_WAIT_S = 300.0
GRACE_S = 60.0


class PlannerService(Service):
    name = "planner"

    def __init__(self, ctx, grpc_addr: str | None = None):
        super().__init__(ctx)
        self.grpc_addr = grpc_addr if grpc_addr is not None else ctx.settings.planner_addr
        self.campaigns: dict[str, CampaignState] = {}
        self.loops: dict[str, asyncio.Task] = {}
        self.grpc_port = 0
        self._server = None
        self.caught_up = asyncio.Event()
        #: requests to send back dead letters of campaigns this planner does not know: (campaign, DLQ sequence)
        self._stray_resends: set[tuple[str, int]] = set()
        self._resend_lock = asyncio.Lock()
        self._answering: set[asyncio.Task] = set()
        #: events on the stream this planner refused to fold in (kfactory/evidence/trust.py), since it started
        self.refused = 0

    async def run(self, stop: asyncio.Event) -> None:
        if self.grpc_addr:
            self._server, self.grpc_port = await start_server(
                self.grpc_addr, sgrpc.add_CampaignsServicer_to_server, "kfactory.v1.Campaigns", CampaignsApi(self),
                settings=self.settings)
        try:
            await self._follow(stop)
        finally:
            for t in self.loops.values():
                t.cancel()
            if self._server:
                await self._server.stop(grace=1)

    async def _follow(self, stop: asyncio.Event) -> None:
        last = await self.bus.last_seq(EVENTS_STREAM)
        if last == 0:
            self._caught_up()
        async for event, msg in self.bus.follow(None, stop=stop):
            t0 = time.perf_counter()
            with telemetry.consumer_span(self.name, msg.subject, msg.headers, event):
                self._fold(event)
            if self.caught_up.is_set() and event.HasField("resend_requested"):
                self._answer_later(event.campaign_id, event.resend_requested.dlq_seq)
            self.handled += 1
            await ack_quietly(msg)
            self.cost["handler"] += time.perf_counter() - t0
            if not self.caught_up.is_set() and msg.metadata.sequence.stream >= last:
                self._caught_up()

    def _fold(self, event: pb.Event) -> None:
        """Apply one event of the stream. No event may stop the fold: a restarted planner replays the stream
        and would meet the same event at every start, so the planner could never run again."""
        try:
            self._apply(event)
        except Exception as e:  # noqa: BLE001 (any bug folding one event fails its campaign, never the planner)
            self.log.exception("folding an event failed", event_id=event.id[:120])
            st = self.campaigns.get(event.campaign_id)
            if st is not None and not st.broken:
                st.broken = f"planner error folding event {event.id[:120]}: {type(e).__name__}: {e}"
                self._fail_broken(st)

    def _fail_broken(self, st: CampaignState) -> None:
        """Fail an unfinished campaign that cannot run (st.broken), once this planner has caught up: during
        the replay a later event of the stream may still show it finished."""
        if not self.caught_up.is_set() or st.finished is not None or st.driven:
            if st.driven:  # its driving task fails it at its next step
                st.changed.set()
            return
        st.driven = True
        self.log.error("campaign failed", campaign=st.id, reason=st.broken)
        self.loops[st.id] = asyncio.create_task(self._finish(st, state="failed", reason=st.broken))

    def _caught_up(self) -> None:
        self.caught_up.set()
        # requests made while this planner was down (or before this life replayed their answers)
        for cid, seq in sorted(self._stray_resends):
            self._answer_later(cid, seq)
        for cid, st in self.campaigns.items():
            for seq in sorted(st.resend_requests):
                self._answer_later(cid, seq)
            if st.finished is None and st.broken:
                self._fail_broken(st)
            elif st.finished is None and cid not in self.loops:
                self.log.info("resuming campaign", campaign=cid)
                st.driven = True
                self.loops[cid] = asyncio.create_task(self._resume(st))

    async def _resume(self, st: CampaignState) -> None:
        """Queue again the proposals without a candidate and the dead letters' work it accepted to send back (a
        resend is deduplicated), then drive the campaign."""
        for seq in list(st.resent.values()):
            if (record := await deadletters.fetch(self.bus, seq)) is not None:
                await deadletters.send_back(self.bus, record)
        for event in list(st.proposals.values()):
            origin = event.point_proposed.origin
            stage = persona_stage(origin.split(":", 1)[1]) if origin.startswith("agent:") else "coder"
            with telemetry.root_span(f"{self.name} propose", **{"kf.campaign": st.id, "kf.resumed": True}):
                await self.bus.send_work(stage, event)
        await self._drive(st)

    def _apply(self, event: pb.Event) -> None:
        cid = event.campaign_id
        if event.HasField("campaign_started") and cid not in self.campaigns:
            if why := trust.body_flaw(event):
                self._refuse(event, why)
                return
            self.campaigns[cid] = self._new_state(cid, event.campaign_started.spec)
            if self.campaigns[cid].broken:
                self._fail_broken(self.campaigns[cid])
        st = self.campaigns.get(cid)
        if st is not None:
            if why := st.apply(event):
                self._refuse(event, why)
        elif event.HasField("resend_requested"):
            self._stray_resends.add((cid, event.resend_requested.dlq_seq))
        elif event.HasField("resend_answered"):
            self._stray_resends.discard((cid, event.resend_answered.dlq_seq))

    # -- sending dead letters back ---------------------------------------------------------------
    def _answer_later(self, cid: str, seq: int) -> None:
        task = asyncio.create_task(self._answer_resend(cid, seq))
        self._answering.add(task)
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task) -> None:
        self._answering.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the request stays unanswered in the fold; the next life of the planner answers it
            self.log.error("answering a request to send a dead letter back failed", error=repr(task.exception()))

    async def _answer_resend(self, cid: str, seq: int) -> None:
        """Decide whether dead letter `seq` goes back to its stage (CampaignState.judge_resend), record the answer
        and, if yes, send it back. The decision and the point's return to flight happen with no await between
        them, so the campaign cannot finish in between and then miss the work's outcome."""
        async with self._resend_lock:
            st = self.campaigns.get(cid)
            if seq not in st.resend_requests if st is not None else (cid, seq) not in self._stray_resends:
                return  # answered meanwhile
            record = await deadletters.fetch(self.bus, seq)
            if st is None:
                answer = pb.ResendAnswered(dlq_seq=seq, reason=f"dead letter {seq}: no campaign {cid} is known "
                                                               "to the planner")
            else:
                answer = st.judge_resend(seq, record, self._finishing(st), self.bus.max_event_bytes)
            event = ev.make_event(cid, self.name, str(seq), resend_answered=answer)
            self._apply(event)
            await self.bus.publish(event)
            if answer.accepted:
                await deadletters.send_back(self.bus, record)
                self.log.info("dead letter sent back", campaign=cid, seq=seq, point=answer.point_id)

    def _refuse(self, event: pb.Event, why: str) -> None:
        self.refused += 1
        self.log.warning("refused an event", event_id=event.id[:120], producer=event.producer[:40], why=why)

    def _new_state(self, cid: str, spec: pb.CampaignSpec) -> CampaignState:
        """A started campaign's state. One whose problem no longer loads here (a package moved or deleted since
        it was submitted, or a name no planner knows) is `broken`: it is failed with the reason, not driven."""
        try:
            space, broken = self._space(spec), ""
        except ProblemError as e:
            space, broken = None, f"its problem cannot be loaded: {e}"
        st = CampaignState(cid, spec, pb.DeviceInfo(), space, broken=broken)
        st.agent_note = coders.agent_note(spec, self.settings)
        st.token_seconds = self.settings.llm_token_seconds
        return st

    def _problem_or_none(self, st: CampaignState):
        """The campaign's problem, or None when it no longer loads (its summary then names no problem shapes)."""
        try:
            return self.ctx.problem(st.spec.problem)
        except ProblemError:
            return None

    def _space(self, spec: pb.CampaignSpec) -> Space | None:
        problem = self.ctx.problem(spec.problem)
        fams = [f for f in problem.families_for(spec.target.split(":")[0])
                if not spec.families or f.name in spec.families]
        return Space(fams) if fams else None

    # -- submitting ----------------------------------------------------------------------------
    def validate(self, spec: pb.CampaignSpec) -> pb.CampaignSpec:
        """Fill defaults and refuse what cannot run, naming the field (specs.validate)."""
        spec, note = specs.validate(spec, self.settings, self.ctx.problem, self.ctx.target)
        if note:
            self.log.warning(note)
        return spec

    async def submit(self, spec: pb.CampaignSpec) -> str:
        """Validate, publish CampaignStarted and start driving the campaign; returns its id."""
        # in a thread: validating runs the problem's own reference and renders its templates (problems.check),
        # which must not stall the planner's event loop (its fold, its heartbeats, its consumers)
        spec = await asyncio.to_thread(self.validate, spec)
        await self.caught_up.wait()
        cid = "c" + secrets.token_hex(6)
        device = await self._device(spec.target)
        priors = await self._priors(spec, cid)
        started = ev.make_event(cid, self.name, "start",
                                campaign_started=pb.CampaignStarted(spec=spec, device=device, priors=priors))
        self._apply(started)
        self.campaigns[cid].driven = True
        with telemetry.root_span(f"{self.name} start", **{"kf.campaign": cid}):
            await self.bus.publish(started)
        self.loops[cid] = asyncio.create_task(self._drive(self.campaigns[cid]))
        return cid

    async def _device(self, target: str) -> pb.DeviceInfo:
        """The campaign's device as this process sees it. A planner on a node without a GPU (a cluster's
        planner pod) cannot see the GPU of a cuda campaign: the campaign then names the target and the
        architecture it asked for, and every measurement names the GPU it ran on (Measured.device)."""
        try:
            return await self.ctx.device(target)
        except NvmlUnavailable as e:
            name, _, option = target.partition(":")
            self.log.info("the campaign's GPU is not visible to the planner; the benchmarkers name it",
                          target=target, why=str(e))
            return pb.DeviceInfo(target=name, arch=option, model=f"{target} (GPU not visible to the planner)")

    async def _priors(self, spec: pb.CampaignSpec, cid: str) -> list[pb.Prior]:
        """Memory's priors for the campaign's problem and families (a warm start); none when the spec asks for
        a cold start or memory cannot be reached (the campaign then starts cold, and says so in the log)."""
        space = self._space(spec)
        if spec.warm_start <= 0 or space is None:
            return []
        addr = self.ctx.memory_addr or self.settings.memory_addr
        # every source's measurements: the strategy learns each earlier campaign's landscape (transfer.py); the
        # campaign proposes the best spec.warm_start of them first
        req = spb.PriorsRequest(problem=spec.problem, families=list(space.families), exclude_campaign=cid,
                                limit=max(spec.warm_start, self.settings.warm_evidence), every_source=True)
        try:
            async with security.channel(addr, self.settings) as ch:
                resp = await sgrpc.EvidenceStub(ch).Priors(req, timeout=5)
        except grpc.aio.AioRpcError as e:
            self.log.warning("memory unreachable: the campaign starts cold", addr=addr, code=e.code().name)
            return []
        return list(resp.priors)

    async def cancel(self, cid: str, reason: str) -> CampaignState:
        st = self.campaigns[cid]
        if st.finished is None:
            st.cancelled = reason or "cancelled by a user"
            st.changed.set()
        return st

    # -- driving a campaign --------------------------------------------------------------------
    async def _drive(self, st: CampaignState) -> None:
        try:
            await self._propose_fixed(st)
            await self._search(st)
            if not (st.broken or st.strategy_error):
                await self._wait_in_flight(st)
                await self._compare(st)
                while st.in_flight() and not self._finishing(st):  # work sent back from its dead letter meanwhile
                    await self._wait_in_flight(st)
                    await self._compare(st)
            if failed := st.broken or st.strategy_error:  # broken may be set while it waited
                self.log.error("campaign failed", campaign=st.id, reason=failed)
                await self._finish(st, state="failed", reason=failed)
                return
            await self._finish(st)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in driving this campaign must not kill the planner: record it as failed
            self.log.exception("campaign failed", campaign=st.id)
            await self._finish(st, state="failed", reason=f"planner error: {type(e).__name__}: {e}")

    def _expired(self, st: CampaignState) -> bool:
        return bool(st.spec.budget_seconds) and st.elapsed() >= st.spec.budget_seconds

    def _finishing(self, st: CampaignState) -> str:
        """Why the campaign ends without waiting for work in flight ("" when it waits for it)."""
        if st.cancelled:
            return f"cancelled: {st.cancelled}"
        if st.broken:
            return st.broken
        if st.strategy_error:
            return "its search strategy failed"
        return "its time budget is spent" if self._expired(st) else ""

    def _budget_left(self, st: CampaignState) -> bool:
        if st.cancelled or st.broken or self._expired(st):
            return False
        if device_budget_spent(st, self.settings.device_seconds):
            return False
        return not st.spec.budget_candidates or st.search_proposed() < st.spec.budget_candidates

    async def _propose_fixed(self, st: CampaignState) -> None:
        problem = self.ctx.problem(st.spec.problem)
        target = st.spec.target.split(":")[0]
        if target in problem.spec.reference_kernel:
            source, flags, language, rule = problem.reference_kernel(target)
            await self._propose(st, "reference", "{}", "reference",
                                pb.ManualSource(name="reference", source=source, compile_flags=flags, language=language,
                                                launch_json=ev.canonical_json(rule) if rule else ""))
        for m in st.spec.manual_sources:
            await self._propose(st, f"manual:{m.name}", json.dumps({"manual": m.name}), f"manual:{m.name}", m)

    async def _search(self, st: CampaignState) -> None:
        """Hand out design work until the budget is spent: each slot goes to the coder the portfolio draws
        (kfactory/services/planner/coders.py): the template coder (the strategy's next point) or an agent persona."""
        rng = random.Random(st.spec.seed ^ 0xC0DE5)
        attempts = 0
        while self._budget_left(st) and (st.strategy is not None or coders.agents_on(st)):
            if st.in_flight() >= room(st, self.settings.device_seconds):
                await self._wait_change(st)
                continue
            arm = st.coders.choose(coders.eligible(st, self.settings.llm_parents), rng, st.token_seconds)
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
            await self._propose(st, point.family, point.params_json,
                                f"{'warm' if prior else 'template'}:{point.family}")

    async def _propose_agent(self, st: CampaignState, persona: str, attempt: int) -> None:
        """Queue one agent task on the persona's work subject, with its parents and the campaign's device."""
        parents = coders.parents_for(st, persona, self.settings.llm_parents)
        problem = self.ctx.problem(st.spec.problem)
        first = st.candidates.get(parents[0])
        fams = problem.families_for(st.spec.target.split(":")[0])
        family = first.family if first is not None and first.family in problem.families else \
            (fams[0].name if fams else "")
        pp = coders.agent_point(st, persona, parents, family, attempt)
        if not await self.claims.claim_once(f"{st.id}:point:{pp.point_id}"):
            return  # an earlier life of this planner proposed it; the next attempt gets another id
        event = ev.make_event(st.id, self.name, pp.point_id, point_proposed=pp)
        st.apply(event)
        with telemetry.root_span(f"{self.name} propose", **{"kf.campaign": st.id, "kf.point": pp.point_id,
                                                            "kf.origin": f"agent:{persona}"}):
            await self.bus.publish(event)
            await self.bus.send_work(persona_stage(persona), event)

    async def _propose(self, st: CampaignState, family: str, params_json: str, origin: str,
                       manual: pb.ManualSource | None = None) -> None:
        pid = ev.point_id(family, json.loads(params_json)) if manual is None else \
            ev.sha256_hex(origin + manual.source + manual.compile_flags)[:24]
        if not await self.claims.claim_once(f"{st.id}:point:{pid}"):
            return  # another planner (or an earlier life of this one) proposed it already
        pp = pb.PointProposed(point_id=pid, family=family, params_json=params_json, strategy=st.spec.strategy,
                              problem=st.spec.problem, target=st.spec.target, origin=origin,
                              runner_threads=st.spec.threads)
        if manual is not None:
            pp.manual.CopyFrom(manual)
        event = ev.make_event(st.id, self.name, pid, point_proposed=pp)
        st.apply(event)
        # the root of this point's trace: every stage's span for its candidate descends from it
        with telemetry.root_span(f"{self.name} propose", **{"kf.campaign": st.id, "kf.point": pid,
                                                            "kf.origin": origin}):
            await self.bus.publish(event)
            await self.bus.send_work("coder", event)

    async def _wait_change(self, st: CampaignState, timeout: float = 1.0) -> None:
        st.changed.clear()
        try:
            await asyncio.wait_for(st.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _wait_in_flight(self, st: CampaignState) -> None:
        limit = (st.spec.budget_seconds + GRACE_S) if st.spec.budget_seconds else None
        while st.in_flight() and not (st.cancelled or st.broken):
            if limit and st.elapsed() > limit:
                self.log.warning("giving up on in-flight points", campaign=st.id, in_flight=st.in_flight())
                return
            await self._wait_change(st)

    async def _compare(self, st: CampaignState) -> None:
        best = st.best()
        ref = st.candidates.get(st.reference_id)
        if st.cancelled or best is None or ref is None or ref.id not in st.artifacts:
            return
        problem = self.ctx.problem(st.spec.problem)
        req = pb.CompareRequest(candidate=best.candidate, reference=ref, baselines=available_baselines(problem, st.spec.target.split(":")[0]),
                                candidate_artifact=st.artifacts[best.candidate.id],
                                reference_artifact=st.artifacts[ref.id])
        event = ev.make_event(st.id, self.name, f"compare:{best.candidate.id}", compare_request=req)
        with telemetry.root_span(f"{self.name} compare", **{"kf.campaign": st.id,
                                                            "kf.candidate": best.candidate.id}):
            await self.bus.publish(event)
            await self.bus.send_work("benchmarker", event)
        want = {problem.shape_str(s) for s in problem.shapes("optimize")}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMPARE_WAIT_S
        while loop.time() < deadline and not (st.cancelled or st.broken) and not want <= {
                shape for shape, c in st.comparisons.items() if c.candidate_id == best.candidate.id}:
            await self._wait_change(st)

    async def _finish(self, st: CampaignState, state: str | None = None, reason: str = "") -> None:
        if st.finished is not None:
            return
        if state is None:
            state = "cancelled" if st.cancelled else "expired" if self._expired(st) and st.in_flight() else "completed"
            reason = st.cancelled or reason
        best = st.best()
        problem = self._problem_or_none(st)
        summary = st.summary(problem)
        if self.settings.device_seconds:
            summary["device_seconds_budget"] = self.settings.device_seconds
        fin = pb.CampaignFinished(state=state, reason=reason, counts=st.counts,
                                  best_candidate_id=best.candidate.id if best else "",
                                  summary_json=json.dumps(summary))
        event = ev.make_event(st.id, self.name, "finish", campaign_finished=fin)
        st.apply(event, own=True)
        with telemetry.root_span(f"{self.name} finish", **{"kf.campaign": st.id, "kf.state": state}):
            await self.bus.publish(event)
        self.log.info("campaign finished", campaign=st.id, state=state, counts=str(st.counts).replace("\n", " "))

    def status(self, st: CampaignState) -> spb.CampaignStatus:
        counts, best = st.reported()
        return spb.CampaignStatus(id=st.id, spec=st.spec, state=st.state_name(), counts=counts,
                                  best_candidate_id=best.candidate.id if best else "",
                                  best_score_s=best.score_s if best else 0.0, elapsed_s=st.elapsed(),
                                  summary_json=st.finished.summary_json if st.finished else "", device=st.device)


class CampaignsApi(sgrpc.CampaignsServicer):
    """The Campaigns gRPC service."""

    def __init__(self, planner: PlannerService):
        self.p = planner

    async def Submit(self, request, context):
        try:
            cid = await self.p.submit(request.spec)
        except SpecError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return self.p.status(self.p.campaigns[cid])

    async def _get(self, cid: str, context) -> CampaignState:
        st = self.p.campaigns.get(cid)
        if st is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no campaign {cid!r}")
        return st

    async def Get(self, request, context):
        return self.p.status(await self._get(request.id, context))

    async def List(self, request, context):
        return spb.ListCampaignsResponse(campaigns=[self.p.status(s) for s in self.p.campaigns.values()])

    async def Cancel(self, request, context):
        st = await self._get(request.id, context)
        await self.p.cancel(st.id, request.reason)
        return self.p.status(st)

    async def Watch(self, request, context):
        await self._get(request.id, context)
        stop = asyncio.Event()
        async for event, msg in self.p.bus.follow(None, ev.event_subject("*", request.id), stop=stop):
            await msg.ack()
            yield event
            if event.HasField("campaign_finished"):
                stop.set()

"""The planner: campaigns, search strategies and budgets; hosts the Campaigns gRPC service.

PlannerService wires the planner's parts, each in a module of its own:
- replay.py: the fold over the events stream, and resuming campaigns after a restart;
- driver.py: driving each campaign (proposals, budgets, the final comparison, its end);
- resends.py: answering requests to send dead letters back;
- api.py: the Campaigns gRPC service; specs.py: checking a submitted spec; priors.py: what memory tells a new
  campaign (the warm start, the kernels other campaigns found wrong);
- campaign.py: one campaign's state, a fold over its events; summary.py: its summary.
"""
from __future__ import annotations

import asyncio
import secrets

from kfactory.bus import events as ev
from kfactory.bus.errors import TRANSIENT
from kfactory.engines.finale import finale_of
from kfactory.engines.stages import is_engine
from kfactory.judge import objective
from kfactory.judge.order import compare_reserve, device_budget
from kfactory.observability import tracing as telemetry
from kfactory.platform.grpcserver import start_server
from kfactory.platform.service import Service
from kfactory.problems import ProblemError
from kfactory.services.planner import coders, specs
from kfactory.services.planner.api import CampaignsApi
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.driver import CampaignDriver
from kfactory.services.planner.priors import from_memory
from kfactory.services.planner.replay import StreamReplay
from kfactory.services.planner.resends import ResendDesk
from kfactory.services.planner.specs import SpecError  # noqa: F401 (the API answers it; tests import it here)
from kfactory.services.planner.specs import StartNotPublished
from kfactory.strategies import Space
from kfactory.targets.cuda.nvml import NvmlUnavailable
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc


class PlannerService(Service):
    """The planner service: its campaigns (by id) and the parts that fold, drive and answer for them."""
    name = "planner"

    def __init__(self, ctx, grpc_addr: str | None = None):
        super().__init__(ctx)
        self.grpc_addr = grpc_addr if grpc_addr is not None else ctx.settings.planner_addr
        self.campaigns: dict[str, CampaignState] = {}
        self.grpc_port = 0
        self._server = None
        #: events on the stream this planner refused to fold in (kfactory/evidence/trust.py), since it started
        self.refused = 0
        self.driver = CampaignDriver(self)
        # the desk folds its answers in through the replay, made just below (hence the late-bound lambda)
        self.resends = ResendDesk(self, self.campaigns, lambda event: self.replay.apply(event))
        self.replay = StreamReplay(self, self.campaigns, self.driver, self.resends, self._new_state, self._refuse)

    @property
    def loops(self) -> dict[str, asyncio.Task]:
        """The task driving (or failing) each campaign, by campaign id."""
        return self.driver.loops

    @property
    def caught_up(self) -> asyncio.Event:
        """Set once this planner has folded the events stream up to where it ended at start-up."""
        return self.replay.caught_up

    async def run(self, stop: asyncio.Event) -> None:
        if self.grpc_addr:
            self._server, self.grpc_port = await start_server(
                self.grpc_addr, sgrpc.add_CampaignsServicer_to_server, "kfactory.v1.Campaigns", CampaignsApi(self),
                settings=self.settings)
        try:
            await self.replay.follow(stop)
        finally:
            self.driver.stop_all()
            if self._server:
                await self._server.stop(grace=1)

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
        if not broken:   # the problem's rule for its result (a broken campaign keeps the lowest score)
            problem = self.ctx.problem(spec.problem)
            st.winner = problem.winner
            st.problem_name = problem.name   # a path and a name of one package are one problem
            st.objective = None if is_engine(problem) else objective.spelled_out(problem)
            # an engine's timing rounds and showdown after the search (kfactory/engines/finale.py)
            st.finale = finale_of(spec) if is_engine(problem) else None
        st.agent_note = coders.agent_note(spec, self.settings)
        st.token_seconds = self.settings.llm_token_seconds
        return st

    def _space(self, spec: pb.CampaignSpec) -> Space | None:
        problem = self.ctx.problem(spec.problem)
        fams = [f for f in problem.families_for(spec.target.split(":")[0])
                if not spec.families or f.name in spec.families]
        return Space(fams, max_threads=spec.threads) if fams else None

    # -- submitting ----------------------------------------------------------------------------
    def validate(self, spec: pb.CampaignSpec) -> pb.CampaignSpec:
        """Fill defaults and refuse what cannot run, naming the field (specs.validate)."""
        spec, note = specs.validate(spec, self.settings, self.ctx.problem, self.ctx.target)
        if note:
            self.log.warning(note)
        return spec

    async def submit(self, spec: pb.CampaignSpec) -> str:
        """Validate, publish CampaignStarted and start driving the campaign; returns its id. Raises SpecError
        for a spec that cannot run, CheckUnavailable when the host was too busy to check the problem's reference
        (kfactory/problems/refcheck.py), StartNotPublished when the event bus does not take the start."""
        # in a thread: validating runs the problem's own reference and renders its templates (problems.check),
        # which must not stall the planner's event loop (its fold, its heartbeats, its consumers)
        spec = await asyncio.to_thread(self.validate, spec)
        await self.caught_up.wait()
        cid = "c" + secrets.token_hex(6)
        device = await self._device(spec.target)
        # the device budget a reserve for the showdown and final comparison is kept of; none for an engine, which
        # compares nothing: its finale (timing rounds, its own showdown) runs until the search's stop, the budget
        budget = 0.0 if is_engine(self.ctx.problem(spec.problem)) else device_budget(spec,
                                                                                      self.settings.device_seconds)
        told = await from_memory(self.ctx.memory_addr or self.settings.memory_addr, self.settings, self.log, spec,
                                 self._space(spec), cid, device, budget)
        reserve, evidence = compare_reserve(budget, told.comparison_costs, self.settings.compare_reserve,
                                            showdown=self.settings.showdown_contenders > 1)
        started = ev.make_event(cid, self.name, "start", campaign_started=pb.CampaignStarted(
            spec=spec, device=device, priors=told.priors, known_wrong=told.known_wrong, compare_reserve_s=reserve,
            compare_reserve_campaigns=evidence))
        self.replay.apply(started)
        st = self.campaigns[cid]
        st.driven = True
        try:
            with telemetry.root_span(f"{self.name} start", **{"kf.campaign": cid}):
                await self.bus.publish(started)
        except TRANSIENT as e:
            # NATS stayed unreachable through the publish's retries: the start may or may not be on the stream.
            # Read back already (an acknowledgement lost, not the message): the campaign runs. Otherwise it
            # leaves this planner's state (it would stay "running", never driven) and the client hears that
            # nothing started; should the start land after all (nats-py sends what it buffered once NATS is
            # back), the fold records the campaign as cancelled, never run, with the reason status shows.
            if cid not in self.replay.landed:
                reason = f"the event bus did not confirm the start ({type(e).__name__})"
                never_run = (f"never run: its submission was refused while NATS was unreachable (the start's "
                             f"publish: {type(e).__name__}), and the start reached the event bus only later")
                self.replay.abandon(cid, never_run)
                await self.replay.remember_abandoned(cid, never_run)
                raise StartNotPublished(f"campaign {cid}: {reason}; nothing was started (should the start still "
                                        "reach the event bus, `kfactory status` lists the campaign as cancelled, "
                                        "never run); submit it again once NATS answers") from e
            self.log.warning("the start's publish timed out but the stream holds it: the campaign runs",
                             campaign=cid, error=repr(e))
        self.driver.launch(st, self.driver.drive(st))
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

    async def cancel(self, cid: str, reason: str) -> CampaignState:
        """Ask campaign `cid` to end (its driver finishes it as cancelled at its next step)."""
        st = self.campaigns[cid]
        if st.finished is None:
            st.cancelled = reason or "cancelled by a user"
            st.changed.set()
        return st

    def status(self, st: CampaignState) -> spb.CampaignStatus:
        """The campaign's status as the Campaigns service answers it."""
        counts, best = st.reported()
        return spb.CampaignStatus(id=st.id, spec=st.spec, state=st.state_name(), counts=counts,
                                  best_candidate_id=best.candidate.id if best else "",
                                  best_score_s=best.score_s if best else 0.0, elapsed_s=st.elapsed(),
                                  summary_json=st.finished.summary_json if st.finished else "", device=st.device,
                                  reason=st.finished.reason if st.finished else "", after_finish=st.after_finish)

"""Memory: archives every event into SQLite and answers the Evidence gRPC service."""
from __future__ import annotations

import asyncio
import time

import grpc

from kfactory import report, telemetry
from kfactory.bus import ArtifactMissing, ack_quietly, term_quietly
from kfactory.grpcutil import start_server
from kfactory.problems import ProblemError
from kfactory.service import Service
from kfactory.spec_ranges import PRIORS_LIMIT, range_error
from kfactory.services.memory.archive import Archive
from kfactory.services.memory import lessons as lessons_mod
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc


class MemoryService(Service):
    name = "memory"

    def __init__(self, ctx, grpc_addr: str | None = None):
        super().__init__(ctx)
        self.grpc_addr = grpc_addr if grpc_addr is not None else ctx.settings.memory_addr
        self.archive = Archive(ctx.settings.archive(), self.problem_name)
        self.grpc_port = 0
        self.progress = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        server = None
        if self.grpc_addr:
            server, self.grpc_port = await start_server(
                self.grpc_addr, sgrpc.add_EvidenceServicer_to_server, "kfactory.v1.Evidence", EvidenceApi(self),
                settings=self.settings)
            self.ctx.memory_addr = f"127.0.0.1:{self.grpc_port}"
        try:
            async for event, msg in self.bus.follow("memory", stop=stop, refused=self._refused):
                t0 = time.perf_counter()
                if not await self._belongs(event):
                    await term_quietly(msg)  # a result for a campaign nobody started: never evidence of anything
                    continue
                with telemetry.consumer_span(self.name, msg.subject, msg.headers, event):
                    await asyncio.to_thread(self.archive.record, event)
                await ack_quietly(msg)  # a lost ack redelivers the event, which record() ignores (keyed by id)
                self.cost["handler"] += time.perf_counter() - t0
                self.handled += 1
                self.progress.set()
        finally:
            if server:
                await server.stop(grace=1)

    async def _refused(self, msg, why: Exception) -> None:
        """A message of the events stream that is no valid event: kept in the archive's `refused` table with
        the reason (its first bytes only), never among the events."""
        await asyncio.to_thread(self.archive.refuse, str(why), msg.subject, msg.metadata.sequence.stream,
                                bytes(msg.data))

    async def _belongs(self, event) -> bool:
        """Whether an event may enter the archive: its campaign was started (checked on the events stream, so
        the order memory sees events in does not matter), or it is a dead letter (kept whatever it claims)."""
        if event.HasField("dead_letter") or await self.bus.campaign_started(event.campaign_id):
            return True
        self.log.warning("event for a campaign nobody started: not archived", event_id=event.id[:80],
                         kind=event.WhichOneof("body") or "")
        return False

    def problem_name(self, locator: str) -> str:
        """A problem's name from its locator (built-in name or package path); unknown ones stay as given."""
        try:
            return self.ctx.problem(locator).name
        except ProblemError:
            return locator

    def report(self, campaign: str) -> tuple[str, bytes]:
        return report.build(self.archive.events(campaign=campaign))


def _entry(m, campaign: str, checks=()) -> spb.LeaderboardEntry:
    c = m.candidate
    return spb.LeaderboardEntry(candidate_id=c.id, campaign_id=campaign, problem=c.problem, family=c.family,
                                params_json=c.params_json, origin=c.origin, score_s=m.score_s, timings=m.timings,
                                device=m.device.model, checks=checks)


class EvidenceApi(sgrpc.EvidenceServicer):
    """The Evidence gRPC service over the archive."""

    def __init__(self, mem: MemoryService):
        self.m = mem

    async def Best(self, request, context):
        found = self.m.archive.best(self.m.problem_name(request.problem), request.shape, request.device)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no measurement of {request.problem!r} "
                                f"{request.shape or ''} {request.device or ''}".strip())
        return _entry(found[0], found[1], self.m.archive.checks(found[0].candidate.id, found[1]))

    async def Leaderboard(self, request, context):
        rows = self.m.archive.leaderboard(request.campaign_id, request.limit or 20)
        if not rows and not self.m.archive.counts_by_producer(request.campaign_id):
            # an empty leaderboard of a campaign the archive never saw would read as "it measured nothing"
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no campaign {request.campaign_id!r} in the archive "
                                "(kfactory status lists the campaigns)")
        return spb.LeaderboardResponse(entries=[_entry(m, request.campaign_id) for m, _ in rows])

    async def Candidate(self, request, context):
        events = self.m.archive.events(candidate=request.id)
        if not events:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no candidate {request.id!r}")
        first = next(e for e in events if e.HasField("candidate_created")) if any(
            e.HasField("candidate_created") for e in events) else events[0]
        cand = getattr(first, first.WhichOneof("body")).candidate
        try:
            source = (await self.m.bus.get_artifact(cand.source_digest)).decode()
        except ArtifactMissing:
            source = ""
        return spb.CandidateEvidence(candidate=cand, events=events, lineage=self.m.archive.lineage(cand.id),
                                     source=source)

    async def RegressionInputs(self, request, context):
        if not request.problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name the problem")
        inputs = self.m.archive.regressions(self.m.problem_name(request.problem))
        return spb.RegressionResponse(inputs=inputs)

    async def Priors(self, request, context):
        if not request.problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name the problem")
        if err := range_error("limit", request.limit, PRIORS_LIMIT):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, err)
        priors = self.m.archive.priors(self.m.problem_name(request.problem), list(request.families),
                                       request.exclude_campaign, request.limit or 8, request.every_source)
        return spb.PriorsResponse(priors=priors)

    async def Lessons(self, request, context):
        if not request.problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name the problem")
        items = await asyncio.to_thread(lessons_mod.lessons, self.m.archive, self.m.problem_name(request.problem),
                                        request.target, request.limit or 6)
        return spb.LessonsResponse(lessons=items, text=lessons_mod.as_text(items))

    async def Report(self, request, context):
        if not self.m.archive.events(campaign=request.campaign_id):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no campaign {request.campaign_id!r} in the archive")
        md, png = await asyncio.to_thread(self.m.report, request.campaign_id)
        return spb.ReportResponse(markdown=md, plot_png=png)

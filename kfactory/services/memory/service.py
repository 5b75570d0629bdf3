"""Memory: archives every event into SQLite, mirrors the artifacts the events name into the local workspace
(kfactory/evidence/workspace.py), and answers the Evidence gRPC service."""
from __future__ import annotations

import asyncio
import time

import grpc
import nats.errors

from kfactory.evidence import bundle as evidence_bundle
from kfactory.observability import tracing as telemetry
from kfactory.bus.errors import ArtifactMissing
from kfactory.bus.outcomes import ack_quietly, term_quietly
from kfactory.platform.grpcserver import start_server
from kfactory.problems import ProblemError
from kfactory.platform.service import Service
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import InvalidRequest, NotFound, Queries, check_filters
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from kfactory.evidence.workspace import Workspace, is_digest


class MemoryService(Service):
    name = "memory"

    def __init__(self, ctx, grpc_addr: str | None = None):
        super().__init__(ctx)
        self.grpc_addr = grpc_addr if grpc_addr is not None else ctx.settings.memory_addr
        self.archive = Archive(ctx.settings.archive(), self.problem_name)
        self.workspace = Workspace.of(ctx.settings)
        self.queries = Queries(self.archive, self.workspace.get)
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
                    # mirrored before it is archived: once the archive names an artifact, the workspace has it
                    # (unless the bus lost it), and a redelivery after a crash in between mirrors it again
                    for digest in artifacts_of(event):
                        await self.mirror(digest, about=event.id)
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
        """A campaign's report (markdown, plot PNG): Queries.report_of."""
        return self.queries.report_of(campaign)

    async def mirror(self, digest: str, about: str = "") -> bytes | None:
        """Copy an artifact from the bus's object store into the workspace unless it is there; its bytes when they
        came from the bus now, else None. An artifact the bus cannot give is a warning, never a failure of
        memory: the event is archived all the same (`kfactory best --candidate` then shows no source)."""
        if self.workspace.has(digest):
            return None
        if not is_digest(digest):  # no object's name: never looked up, never a path
            self.log.warning("an artifact digest that is no sha256: not kept", digest=digest[:80], about=about[:80])
            return None
        try:
            data = await self.bus.get_artifact(digest)
        except (ArtifactMissing, nats.errors.Error) as e:
            self.log.warning("artifact not in the bus's object store: not kept in the workspace", digest=digest,
                             about=about[:80], error=type(e).__name__)
            return None
        try:
            await asyncio.to_thread(self.workspace.put, data)
        except OSError as e:  # a full or read-only disk: the archive is memory's job, the copy a convenience
            self.log.warning("cannot keep an artifact in the workspace", digest=digest, path=str(self.workspace.root),
                             error=f"{type(e).__name__}: {e.strerror or e}")
        return data


def artifacts_of(event: pb.Event) -> list[str]:
    """The digests of what an event names in the object store that the workspace keeps: a new candidate's
    source (and an agent's prompt and reply), a compiled artifact."""
    if event.HasField("candidate_created"):
        c = event.candidate_created.candidate
        return [d for d in (c.source_digest, c.agent.prompt_digest, c.agent.reply_digest) if d]
    if event.HasField("compiled") and event.compiled.artifact_digest:
        return [event.compiled.artifact_digest]
    return []


class EvidenceApi(sgrpc.EvidenceServicer):
    """The Evidence gRPC service: memory's Queries (kfactory/services/memory/queries.py), their typed errors answered as
    NOT_FOUND and INVALID_ARGUMENT. Each runs in a thread: the archive serialises its connection with a lock, and
    a report or the lessons take long enough to stall the event loop."""

    def __init__(self, mem: MemoryService):
        self.m = mem

    async def _answer(self, query, request, context):
        try:
            return await asyncio.to_thread(query, request)
        except NotFound as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def Best(self, request, context):
        return await self._answer(self.m.queries.best, request, context)

    async def Leaderboard(self, request, context):
        return await self._answer(self.m.queries.leaderboard, request, context)

    async def Campaigns(self, request, context):
        return await self._answer(self.m.queries.campaigns, request, context)

    async def Candidate(self, request, context):
        found = await self._answer(self.m.queries.candidate, request, context)
        if not found.source and found.candidate.source_digest:  # not mirrored (yet): the bus may still hold it
            digest = found.candidate.source_digest
            data = await self.m.mirror(digest, about=found.candidate.id) or \
                await asyncio.to_thread(self.m.workspace.get, digest)  # or mirrored meanwhile
            found.source = data.decode() if data is not None else ""
        return found

    async def RegressionInputs(self, request, context):
        return await self._answer(self.m.queries.regression_inputs, request, context)

    async def Priors(self, request, context):
        return await self._answer(self.m.queries.priors, request, context)

    async def KnownWrong(self, request, context):
        return await self._answer(self.m.queries.known_wrong, request, context)

    async def ComparisonCost(self, request, context):
        return await self._answer(self.m.queries.comparison_cost, request, context)

    async def Lessons(self, request, context):
        return await self._answer(self.m.queries.lessons, request, context)

    async def Report(self, request, context):
        return await self._answer(self.m.queries.report, request, context)

    async def ExportBundle(self, request, context):
        """The archive's evidence as a bundle (kfactory/evidence/bundle.py), in chunks under gRPC's message limit; a
        mistyped target is INVALID_ARGUMENT, not an empty bundle."""
        try:
            check_filters(request.target)
            if request.require_known and request.problem:
                self.m.queries.problem(request.problem, require_known=True)
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        data = await asyncio.to_thread(lambda: evidence_bundle.dumps(evidence_bundle.export_bundle(
            self.m.archive, self.m.workspace.get, request.problem, request.target)))
        for start in range(0, len(data), evidence_bundle.CHUNK_BYTES):
            yield spb.BundleChunk(data=data[start:start + evidence_bundle.CHUNK_BYTES])

    async def ImportBundle(self, request_iterator, context):
        """Merge a bundle sent in chunks; a malformed one is INVALID_ARGUMENT, a conflicting one is answered with
        the reasons in `refused` (nothing of it kept)."""
        parts, size = [], 0
        async for chunk in request_iterator:
            size += len(chunk.data)
            if size > evidence_bundle.MAX_BUNDLE_BYTES:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"the bundle is over {evidence_bundle.MAX_BUNDLE_BYTES} bytes")
            parts.append(chunk.data)
        try:
            bundle = await asyncio.to_thread(evidence_bundle.loads, b"".join(parts))
            return await asyncio.to_thread(evidence_bundle.import_bundle, self.m.archive, self.m.workspace, bundle)
        except evidence_bundle.BundleError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not imported: {e}")

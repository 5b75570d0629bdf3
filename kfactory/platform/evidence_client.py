"""The one client of memory's Evidence gRPC service, for every part that asks memory something.

The planner (a warm start's priors), the agent coders (parents' evidence, lessons), the verifiers (regression
inputs) and the CLI (queries, evidence bundles) all dial memory through `EvidenceClient`: the secure profile's
TLS and token (platform/security.py), and one deadline policy: each query gets `settings.memory_timeout_s`;
a bundle transfer, whose size is the user's, gets none. What a caller does when memory cannot answer is the
caller's own (start cold, retry later, verify with the inputs known so far, tell the user): every failure
reaches it as the grpc.aio.AioRpcError it was.
"""
from __future__ import annotations

from typing import AsyncIterator

from kfactory.platform import security
from kfactory.platform.config import Settings
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc


class EvidenceClient:
    """A connection to memory's Evidence service at `addr`: `async with EvidenceClient(addr, settings) as memory:`
    then `await memory.Priors(request)` and the like, each query under the one deadline. One channel serves every
    call inside the block."""

    def __init__(self, addr: str, settings: Settings | None):
        """`settings` carry the secure profile and the deadline (None: plaintext, and Settings' default)."""
        self.addr = addr
        self.settings = settings
        self.timeout_s = (settings or Settings.model_construct()).memory_timeout_s
        self._channel = None
        self._stub: sgrpc.EvidenceStub | None = None

    async def __aenter__(self) -> EvidenceClient:
        self._channel = security.channel(self.addr, self.settings)
        self._stub = sgrpc.EvidenceStub(self._channel)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub = None

    @property
    def stub(self) -> sgrpc.EvidenceStub:
        if self._stub is None:
            raise RuntimeError("EvidenceClient is used inside `async with` only")
        return self._stub

    async def ask(self, method: str, request):
        """One query by its RPC name (e.g. "Best"), under the deadline."""
        return await getattr(self.stub, method)(request, timeout=self.timeout_s)

    async def Priors(self, request: spb.PriorsRequest) -> spb.PriorsResponse:
        return await self.ask("Priors", request)

    async def KnownWrong(self, request: spb.KnownWrongRequest) -> spb.KnownWrongResponse:
        return await self.ask("KnownWrong", request)

    async def ComparisonCost(self, request: spb.ComparisonCostRequest) -> spb.ComparisonCostResponse:
        return await self.ask("ComparisonCost", request)

    async def Lessons(self, request: spb.LessonsRequest) -> spb.LessonsResponse:
        return await self.ask("Lessons", request)

    async def Candidate(self, request: spb.CandidateRequest) -> spb.CandidateEvidence:
        return await self.ask("Candidate", request)

    async def RegressionInputs(self, request: spb.RegressionRequest) -> spb.RegressionResponse:
        return await self.ask("RegressionInputs", request)

    async def export_bundle(self, request: spb.ExportRequest) -> bytes:
        """An evidence bundle, streamed in chunks (no deadline: its size is the user's)."""
        return b"".join([c.data async for c in self.stub.ExportBundle(request)])

    async def import_bundle(self, chunks: AsyncIterator[spb.BundleChunk]) -> spb.ImportResult:
        """Send an evidence bundle in chunks (no deadline: its size is the user's); memory's answer."""
        return await self.stub.ImportBundle(chunks)

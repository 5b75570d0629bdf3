"""Regression inputs: fetched from memory's Evidence service before a verification, so every verifier
checks the inputs that once exposed a wrong kernel of the problem."""
from __future__ import annotations

import time

import grpc

from kfactory.judge.checks import RegressionInput
from kfactory.observability.log import get_logger
from kfactory.platform.evidence_client import EvidenceClient
from kfactory.v1 import services_pb2 as spb

log = get_logger("regressions")


class RegressionSource:
    """Asks memory for a problem's regression inputs, remembering the last answer for `ttl_s` and keeping
    it when memory cannot be reached (a verification then runs the inputs known so far, never fails)."""

    def __init__(self, addr_of, ttl_s: float = 2.0, settings=None):
        """`addr_of()` gives memory's gRPC address at call time (it may be bound after this starts); `settings`
        carry the secure profile's TLS and token, when there is one, and the queries' deadline
        (memory_timeout_s, kfactory/platform/evidence_client.py)."""
        self.addr_of, self.ttl_s = addr_of, ttl_s
        self.settings = settings
        self._known: dict[str, tuple[float, list[RegressionInput]]] = {}

    async def get(self, problem: str) -> list[RegressionInput]:
        at, known = self._known.get(problem, (0.0, []))
        if time.monotonic() - at < self.ttl_s:
            return known
        addr = self.addr_of()
        if not addr:
            return known
        try:
            async with EvidenceClient(addr, self.settings) as memory:
                resp = await memory.RegressionInputs(spb.RegressionRequest(problem=problem))
        except grpc.aio.AioRpcError as e:
            log.warning("memory unreachable; verifying with the regression inputs known so far",
                        addr=addr, code=e.code().name, known=len(known))
            self._known[problem] = (time.monotonic(), known)
            return known
        found = [RegressionInput.of(r) for r in resp.inputs]
        self._known[problem] = (time.monotonic(), found)
        return found

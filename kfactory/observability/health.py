"""gRPC health checking for every service process, for Kubernetes' gRPC liveness and readiness probes.

The overall status ("" service) is SERVING while the process's event loop answers: a wedged loop fails the
liveness probe. READY ("ready" service) is SERVING only while NATS is connected and every service task of the
process is still running, so a pod that lost its bus stops getting traffic and work until it reconnects.
"""
from __future__ import annotations

import asyncio
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

READY = "ready"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthBindError(RuntimeError):
    """The health port could not be bound."""


class HealthServer:
    """A gRPC server with only the health service; `watch()` keeps READY in step with `is_ready()`."""

    def __init__(self, addr: str, is_ready: Callable[[], bool], interval_s: float = 1.0):
        self.addr, self.is_ready, self.interval_s = addr, is_ready, interval_s
        self.server = grpc.aio.server()
        self.servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, self.server)
        self.port = 0

    async def start(self) -> int:
        """Bind and start; the overall status is SERVING, READY follows is_ready()."""
        try:
            self.port = self.server.add_insecure_port(self.addr)
        except RuntimeError as e:
            raise HealthBindError(f"cannot listen on {self.addr}: {e}; set KFACTORY_HEALTH_ADDR") from e
        if self.port == 0:
            raise HealthBindError(f"cannot listen on {self.addr} (in use?); set KFACTORY_HEALTH_ADDR")
        await self.server.start()
        await self.servicer.set("", SERVING)
        await self._update()
        return self.port

    async def _update(self) -> None:
        await self.servicer.set(READY, SERVING if self.is_ready() else NOT_SERVING)

    async def watch(self, stop: asyncio.Event) -> None:
        """Re-evaluate readiness every interval until stop is set; then report NOT_SERVING everywhere."""
        while not stop.is_set():
            await self._update()
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except asyncio.TimeoutError:
                continue
        await self.servicer.enter_graceful_shutdown()

    async def stop(self) -> None:
        await self.server.stop(grace=0.5)

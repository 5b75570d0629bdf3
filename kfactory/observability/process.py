"""Start a process's observability: tracing exporters, the metrics endpoint and the health server."""
from __future__ import annotations

import asyncio
from functools import partial
from typing import Callable

from kfactory.bus import events as ev
from kfactory.observability import tracing as telemetry
from kfactory.agents import PERSONAS, persona_stage
from kfactory.bus.topology import EVENTS_STREAM, WORK_STREAM
from kfactory.platform.config import Settings
from kfactory.observability.log import get_logger
from kfactory.observability import metrics
from kfactory.observability.health import HealthBindError, HealthServer

log = get_logger("observability")
#: what can go wrong starting observability: each says which setting to fix
SETUP_ERRORS = (telemetry.TelemetryConfigError, metrics.MetricsConfigError, HealthBindError)


def setup(settings: Settings, label: str) -> None:
    """Tracing for this process (once) and, when KFACTORY_METRICS_PORT is set, the /metrics endpoint."""
    telemetry.setup(settings, label)
    if settings.metrics_port is not None:
        port = metrics.serve(settings.metrics_port)
        log.info("metrics served", port=port)


async def start_health(settings: Settings, is_ready: Callable[[], bool],
                       stop: asyncio.Event) -> tuple[HealthServer, asyncio.Task] | None:
    """The gRPC health server on KFACTORY_HEALTH_ADDR (None when unset), kept current until stop is set."""
    if not settings.health_addr:
        return None
    server = HealthServer(settings.health_addr, is_ready)
    port = await server.start()
    log.info("health served", port=port)
    return server, asyncio.create_task(server.watch(stop))


def start_lag_poller(settings: Settings, bus, service: str, stop: asyncio.Event) -> asyncio.Task | None:
    """In the planner's process, with metrics on: read every stage's backlog (and memory's on the events stream).
    One process reports them all, so a stage whose pods are all down still shows its queue growing."""
    if service != "planner" or settings.metrics_port is None:
        return None
    readers: dict[str, metrics.LagReader] = {stage: partial(_stage_lag, stage)
                                             for stage in (*ev.STAGES, *(persona_stage(p) for p in PERSONAS))}
    readers["memory"] = _memory_lag
    return asyncio.create_task(metrics.poll_lag(bus.js, readers, settings.metrics_poll_s, stop))


async def _stage_lag(stage: str, js) -> tuple[int, int]:
    return await metrics.stage_backlog(js, WORK_STREAM, stage)


async def _memory_lag(js) -> tuple[int, int]:
    return await metrics.follower_backlog(js, EVENTS_STREAM, "memory")

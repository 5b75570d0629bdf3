"""The factory's metrics, exposed in Prometheus' text format on a port per process (KFACTORY_METRICS_PORT).

Work lag per stage, stage latency, candidates per second, device busy fraction, rejections by reason and LLM
tokens spent. The bus and the Service base class feed them, so a service's own code adds nothing; the coder's
agent consumers (kfactory/services/coder/agents.py) call `count_tokens()`, and so may any other code that spends tokens.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server

from kfactory.bus import events as ev
from kfactory.observability.log import get_logger
from kfactory.v1 import events_pb2 as pb

log = get_logger("metrics")
#: seconds over which the candidates-per-second and device-busy gauges are averaged
WINDOW_S = 60.0
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

STAGE_SECONDS = Histogram("kfactory_stage_seconds", "Time a stage spent on one message, by outcome",
                          ["stage", "outcome"], buckets=_LATENCY_BUCKETS)
QUEUE_SECONDS = Histogram("kfactory_queue_wait_seconds",
                          "Time from an event's creation to a stage taking it as work (first delivery or not)",
                          ["stage"], buckets=_LATENCY_BUCKETS)
WORK_SECONDS = Histogram("kfactory_work_seconds", "Time of a candidate's own work (compile, verify, measure)",
                         ["service", "work"], buckets=_LATENCY_BUCKETS)
MESSAGES = Counter("kfactory_stage_messages", "Messages a stage settled, by outcome (ack, nak, term, error)",
                   ["stage", "outcome"])
WORK_LAG = Gauge("kfactory_work_lag_messages", "Work messages of a stage not yet delivered to it", ["stage"])
ACK_PENDING = Gauge("kfactory_work_ack_pending", "Messages a stage's consumer holds unacknowledged", ["stage"])
REJECTIONS = Counter("kfactory_rejections", "Candidates rejected, by stage and typed reason", ["stage", "reason"])
DEVICE_BUSY = Counter("kfactory_device_busy_seconds", "Seconds a device lease was held", ["device"])
TOKENS = Counter("kfactory_llm_tokens", "LLM tokens spent by agent coders", ["coder", "model", "kind"])
CANDIDATES_PER_S = Gauge("kfactory_candidates_per_second",
                         f"Candidates a stage finished per second over the last {WINDOW_S:.0f} s", ["stage"])
BUSY_FRACTION = Gauge("kfactory_device_busy_fraction",
                      f"Fraction of the last {WINDOW_S:.0f} s a device lease was held", ["device"])


class MetricsConfigError(ValueError):
    """The metrics port cannot be served; the message says which."""


class WindowRate:
    """Events per second over a sliding window."""

    def __init__(self, window_s: float = WINDOW_S, clock=time.monotonic):
        self.window_s, self.clock = window_s, clock
        self.start = clock()
        self.times: deque[float] = deque()
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self.times.append(self.clock())

    def rate(self) -> float:
        now = self.clock()
        with self.lock:
            while self.times and self.times[0] < now - self.window_s:
                self.times.popleft()
            return len(self.times) / max(1e-9, min(self.window_s, now - self.start))


class BusyWindow:
    """The fraction of a sliding window during which something (a device lease) was held."""

    def __init__(self, window_s: float = WINDOW_S, clock=time.monotonic):
        self.window_s, self.clock = window_s, clock
        self.start = clock()
        self.spans: deque[tuple[float, float]] = deque()
        self.open: dict[int, float] = {}
        self.keys = itertools.count()
        self.lock = threading.Lock()

    def begin(self) -> int:
        """Mark the start of a holding; returns the key that end() takes."""
        with self.lock:
            key = next(self.keys)
            self.open[key] = self.clock()
            return key

    def end(self, key: int) -> float:
        """Mark its end; returns the seconds it was held."""
        with self.lock:
            t0, t1 = self.open.pop(key), self.clock()
            self.spans.append((t0, t1))
            return t1 - t0

    def fraction(self) -> float:
        now = self.clock()
        lo = max(self.start, now - self.window_s)
        with self.lock:
            while self.spans and self.spans[0][1] < lo:
                self.spans.popleft()
            held = sum(min(t1, now) - max(t0, lo) for t0, t1 in self.spans if t1 > lo)
            held += sum(now - max(t0, lo) for t0 in self.open.values())
        return min(1.0, held / max(1e-9, now - lo))


_rates: dict[str, WindowRate] = {}
_busy: dict[str, BusyWindow] = {}
_served: dict[int, int] = {}


def taken(stage: str, event: pb.Event) -> None:
    """A stage took a work message: how long it waited since its event was made (clocks of two hosts: NTP's
    error is far below the buckets')."""
    if event.time_unix_ns:
        QUEUE_SECONDS.labels(stage).observe(max(0.0, (time.time_ns() - event.time_unix_ns) / 1e9))


def stage_done(stage: str, outcome: str, seconds: float, candidate: bool) -> None:
    """One message settled by a stage."""
    STAGE_SECONDS.labels(stage, outcome).observe(seconds)
    MESSAGES.labels(stage, outcome).inc()
    if candidate and outcome == "ack":
        if stage not in _rates:
            _rates[stage] = WindowRate()
            CANDIDATES_PER_S.labels(stage).set_function(_rates[stage].rate)
        _rates[stage].tick()


def published(event: pb.Event) -> None:
    """Count what an event says about a rejection (typed reason and the stage that rejected)."""
    kind = ev.kind_of(event)
    if kind == "rejected":
        REJECTIONS.labels(event.rejected.stage or event.producer, pb.RejectReason.Name(event.rejected.reason)).inc()
    elif kind == "compile_failed":
        REJECTIONS.labels("compiler", pb.RejectReason.Name(event.compile_failed.reason)).inc()


def busy_window(device: str) -> BusyWindow:
    """The busy-fraction tracker of one device (its gauge is registered on first use)."""
    if device not in _busy:
        _busy[device] = BusyWindow()
        BUSY_FRACTION.labels(device).set_function(_busy[device].fraction)
    return _busy[device]


def count_tokens(coder: str, model: str, prompt: int = 0, completion: int = 0) -> None:
    """Account LLM tokens an agent coder spent (prompt and completion separately)."""
    if prompt:
        TOKENS.labels(coder, model, "prompt").inc(prompt)
    if completion:
        TOKENS.labels(coder, model, "completion").inc(completion)


def serve(port: int, host: str = "0.0.0.0") -> int:
    """Serve /metrics on host:port (0 picks a free port) once per process; returns the port."""
    if port in _served:
        return _served[port]
    try:
        server, _ = start_http_server(port, host, registry=REGISTRY)
    except OSError as e:
        raise MetricsConfigError(f"cannot serve metrics on {host}:{port}: {e.strerror}; set "
                                 "KFACTORY_METRICS_PORT to a free port") from e
    _served[port] = server.server_port
    return server.server_port


async def stage_backlog(js, stream: str, stage: str) -> tuple[int, int]:
    """(messages waiting to be delivered, messages delivered but not yet acknowledged) of a stage's work.

    Read from the work stream's per-subject counts (work-queue retention keeps a message until it is acked), so
    a stage whose consumer does not exist yet, or whose pods are all down, still shows its backlog."""
    info = await js.stream_info(stream, subjects_filter=f"{ev.WORK_PREFIX}.{stage}.>")
    stored = sum((info.state.subjects or {}).values())
    try:
        in_flight = (await js.consumer_info(stream, stage)).num_ack_pending or 0
    except nats.js.errors.NotFoundError:
        in_flight = 0
    return max(0, stored - in_flight), in_flight


async def follower_backlog(js, stream: str, consumer: str) -> tuple[int, int]:
    """(waiting, unacknowledged) of a durable consumer of the events stream (limits retention)."""
    info = await js.consumer_info(stream, consumer)
    return info.num_pending or 0, info.num_ack_pending or 0


#: reads one stage's backlog from JetStream: (waiting, unacknowledged)
LagReader = Callable[[Any], Awaitable[tuple[int, int]]]


async def poll_lag(js, readers: dict[str, LagReader], interval_s: float, stop: asyncio.Event) -> None:
    """Keep the lag gauges current until `stop` is set: `readers` maps a label to a coroutine function of js
    returning (waiting, unacknowledged). One that cannot answer now (NATS reconnecting, a consumer not made
    yet) leaves its gauges at their last reading."""
    while not stop.is_set():
        for label, read in readers.items():
            try:
                waiting, in_flight = await read(js)
            except nats.js.errors.NotFoundError as e:  # its consumer is not made yet: normal before its first pod
                log.debug("lag unavailable", stage=label, error=repr(e))
                continue
            except (nats.errors.Error, asyncio.TimeoutError) as e:  # NATS reconnecting, or a permission refused
                log.warning("lag unavailable", stage=label, error=repr(e))
                continue
            WORK_LAG.labels(label).set(waiting)
            ACK_PENDING.labels(label).set(in_flight)
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            continue

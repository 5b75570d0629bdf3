"""What every service shares: its connections, its counters, and the fenced stage lock around a message."""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from functools import lru_cache

import structlog

from kfactory.bus import events as ev
from kfactory.observability import tracing as telemetry
from kfactory.bus.base import Bus
from kfactory.bus.outcomes import Ack, Delivery, Nak, Outcome, Term
from kfactory.claims import Claims, LockTimeout
from kfactory.platform.config import Settings
from kfactory.judge.checks import InputPool
from kfactory.observability.log import get_logger
from kfactory.observability import metrics, stagetime
from kfactory.problems import Problem, load_problem
from kfactory.judge.regressions import RegressionSource
from kfactory.sandbox.parent import HarnessError
from kfactory.targets import Session, Target, get_target
from kfactory.v1 import events_pb2 as pb


@dataclass
class Context:
    """Connections and configuration a service runs with (one per process, shared by in-process services)."""
    settings: Settings
    bus: Bus
    claims: Claims
    _targets: dict[str, Target] = field(default_factory=dict)
    #: where this process's own memory service answers gRPC, once it does ("" = use settings.memory_addr)
    memory_addr: str = ""

    _device_locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def target(self, spec: str) -> Target:
        if spec not in self._targets:
            self._targets[spec] = get_target(spec, self.settings)
        return self._targets[spec]

    async def device(self, spec: str) -> pb.DeviceInfo:
        """The target's device info. The first call may measure the device's ceilings for seconds: it runs
        in a thread (the event loop keeps serving the bus) and only once per target."""
        lock = self._device_locks.setdefault(spec, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self.target(spec).device)

    @staticmethod
    def problem(name: str) -> Problem:
        return _problem(name)


@lru_cache(maxsize=64)
def _problem(name: str) -> Problem:
    return load_problem(name)


@dataclass
class Held:
    """The device time one piece of work used: seconds its device lease was held (set when the lease ends). The
    events report it (Verified.seconds, Measured.seconds, Comparison.seconds, a rejection's figures) and a
    campaign's device-second budget counts it (kfactory/judge/order.py device_seconds)."""
    seconds: float = 0.0


class Service:
    """A service consuming one work stage (or, with stage None, something else in run())."""
    name = ""
    stage: str | None = None

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.bus, self.claims, self.settings = ctx.bus, ctx.claims, ctx.settings
        self.handled = 0
        self.log = get_logger(self.name)
        # seconds spent: in handlers in all, in the candidate's own work (compile/verify/measure), and
        # waiting for a device lease; handler - work - wait is what the harness itself costs
        self.cost = {"handler": 0.0, "work": 0.0, "wait": 0.0}

    async def setup(self) -> None:
        """Check wiring at start-up (not at the first message)."""

    async def run(self, stop: asyncio.Event) -> None:
        await self.setup()
        if self.stage:
            await self.bus.consume(self.stage, self._handle, self.settings.workers, stop)

    async def _handle(self, d: Delivery) -> Outcome:
        cand = ev.candidate_of(d.event)
        t0 = time.perf_counter()
        with structlog.contextvars.bound_contextvars(campaign=d.event.campaign_id, service=self.name,
                                                     candidate=cand.id[:12] if cand else ""):
            try:
                if not await self.bus.campaign_started(d.event.campaign_id):
                    return Term(f"unknown campaign {d.event.campaign_id!r}: the events stream has no start of it; "
                                "submit campaigns through the planner", pb.UNKNOWN_CAMPAIGN)
                if cancelled := await self._cancelled(d.event.campaign_id):
                    return cancelled
                outcome = await self.handle(d)
            except HarnessError as e:
                outcome = self.internal_error(e)
            finally:
                self.cost["handler"] += time.perf_counter() - t0
        if isinstance(outcome, Ack):
            self.handled += 1
        return outcome

    async def _cancelled(self, campaign_id: str) -> Term | None:
        """The work's fate when its campaign was cancelled: not done (its user asked the campaign to stop, and
        its counts stopped there; work begun before the cancellation still ends and is recorded), else None."""
        finished = await self.bus.campaign_finished(campaign_id)
        if finished is None or finished.state != "cancelled":
            return None
        return Term(f"campaign {campaign_id} was cancelled ({finished.reason or 'no reason given'}): work of it not "
                    "begun is not done", pb.CAMPAIGN_CANCELLED)

    def internal_error(self, e: HarnessError) -> Term:
        """The harness failed (a bug in the runner or the judge, not the candidate): logged with its traceback (and
        the runner child's), and the work dead-lettered at once (cause HARNESS_FAILED), publishing no verdict for
        the candidate. Retrying would run the same code again; the dead letter can be sent back once it is fixed."""
        self.log.exception("harness error: the work is dead-lettered, no verdict is recorded", error=str(e),
                           child_traceback=e.traceback)
        return Term(f"harness error in {self.name}: {e}", pb.HARNESS_FAILED)

    async def handle(self, d: Delivery) -> Outcome:
        raise TypeError(f"service {self.name} consumes {self.stage} but does not handle messages")

    @contextlib.asynccontextmanager
    async def stage_lock(self, d: Delivery, item: str):
        """Hold a fenced, renewed lock on (campaign, stage, item) while working on it.

        Yields the lock, or None when another worker holds it (the caller naks): a redelivered message never
        runs twice at once. `still_ours()` tells whether a result may still be written.
        """
        key = f"{d.event.campaign_id}:{self.stage}:{item}"
        async with contextlib.AsyncExitStack() as stack:
            try:
                lock = await stack.enter_async_context(
                    self.claims.hold(key, ttl_s=self.settings.ack_wait_s, wait_s=0))
            except LockTimeout:
                lock = None
            yield lock

    async def work(self, fn, *args, part: str = ""):
        """Run the candidate's own work (compile, verify, measure) in a thread, accounting its time; `part`
        names it in the stage-time ledger (kfactory.observability.stagetime; default: the function's name)."""
        t0 = time.perf_counter()
        work = part or getattr(fn, "__name__", "work")
        try:
            with telemetry.child_span(f"{self.name} {work}", **{"kf.work": work}):
                return await asyncio.to_thread(stagetime.wrapped(work, fn), *args)
        finally:
            self.cost["work"] += time.perf_counter() - t0
            metrics.WORK_SECONDS.labels(self.name, work).observe(time.perf_counter() - t0)

    @contextlib.asynccontextmanager
    async def device(self, device_id: str):
        """Hold the device lease (one measurement at a time per device), accounting the wait; yields a Held whose
        `seconds`, once the block ends, are the device time the work used (the lease held, not waited for)."""
        t0 = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack:
            with telemetry.child_span(f"{self.name} device-lease wait", **{"kf.device": device_id}):
                await stack.enter_async_context(self.claims.device_lease(device_id, ttl_s=self.settings.ack_wait_s))
            self.cost["wait"] += time.perf_counter() - t0
            stagetime.add("lease wait", time.perf_counter() - t0)
            busy = metrics.busy_window(device_id)
            key = busy.begin()
            held = Held()
            try:
                yield held
            finally:
                held.seconds = busy.end(key)
                metrics.DEVICE_BUSY.labels(device_id).inc(held.seconds)

    async def still_ours(self, lock) -> bool:
        """Fencing: a result may be written only while our token is the newest for the key."""
        return await self.claims.latest_fence(lock.key) == lock.fence

    def busy(self) -> Nak:
        """Another worker holds this item's lock. Come back once its lock would have expired: a holder that
        died (or lost its claims store for a moment) must not make us spend every delivery while it expires."""
        return Nak(max(self.settings.nak_delay_s, self.settings.ack_wait_s), "another worker holds this item's lock")


class RunnerService(Service):
    """A service that runs kernels: one runner-backed session per (problem, target, threads), and input pools."""

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.sessions: dict[tuple, Session] = {}
        self.pools: dict[str, InputPool] = {}
        self.regressions = RegressionSource(lambda: ctx.memory_addr or ctx.settings.memory_addr,
                                            settings=ctx.settings)

    def session(self, cand: pb.Candidate):
        key = (cand.problem, cand.target, cand.runner_threads)
        if key not in self.sessions:
            threads = cand.runner_threads or self.settings.threads
            self.sessions[key] = self.ctx.target(cand.target).session(self.ctx.problem(cand.problem), threads)
        return self.sessions[key]

    def pool(self, problem: str) -> InputPool:
        if problem not in self.pools:
            self.pools[problem] = InputPool(self.ctx.problem(problem), self.settings.input_reuse)
        return self.pools[problem]

    async def verification_pool(self, problem: str) -> InputPool:
        """The problem's input pool with memory's current regression inputs."""
        pool = self.pool(problem)
        pool.regressions = await self.regressions.get(self.ctx.problem(problem).name)
        return pool

    async def close(self) -> None:
        for s in self.sessions.values():
            s.close()

"""Starting services: one alone (`kfactory serve NAME`) or all six in one process (`kfactory run`)."""
from __future__ import annotations

import asyncio
import importlib
import signal
import traceback
from dataclasses import dataclass, field

from kfactory.judge import numerics as compare
from kfactory.observability import tracing as telemetry
from kfactory.bus.base import Bus
from kfactory.claims import open_claims
from kfactory.platform.config import Settings
from kfactory.observability.log import get_logger
from kfactory.observability import process as observability
from kfactory.platform.service import Context, Service

SERVICE_NAMES = ("planner", "coder", "compiler", "verifier", "benchmarker", "memory")
log = get_logger("app")


class WiringError(RuntimeError):
    """A service cannot start: a dependency is unreachable or misconfigured. The message says which."""


def service_class(name: str) -> type[Service]:
    if name not in SERVICE_NAMES:
        raise WiringError(f"unknown service {name!r}; one of: {', '.join(SERVICE_NAMES)}")
    mod = importlib.import_module(f"kfactory.services.{name}.service")
    return next(c for c in vars(mod).values() if isinstance(c, type) and issubclass(c, Service)
                and c is not Service and c.name == name)


async def open_context(settings: Settings, name: str) -> Context:
    """Connect to NATS and the claims store, failing fast with a message that names what is missing."""
    from kfactory.bus.errors import BusUnavailable
    from kfactory.platform import security
    from kfactory.claims import ClaimsError

    try:
        bus = await open_bus(settings, f"kfactory-{name}")
    except BusUnavailable as e:
        raise WiringError(str(e)) from e
    bus.max_event_bytes = settings.max_event_bytes
    bus.handler_timeout_s = settings.handler_timeout_s
    if settings.nats_user in security.PERMISSIONS:  # refuse at once what the server would refuse silently
        bus.may_publish = security.publish_subjects(settings.nats_user)
    try:
        claims = open_claims(security.redis_url(settings))
        await claims.ping()
    except (ClaimsError, ValueError) as e:  # unreachable, or refused (AUTH): the message says which
        await bus.close()
        raise WiringError(f"claims store: {e}; set KFACTORY_REDIS_URL / --redis-url (and KFACTORY_REDIS_PASSWORD "
                          "where Redis demands AUTH), or leave it unset for in-process claims (single process "
                          "only)") from e
    return Context(settings, bus, claims)


async def open_bus(settings: Settings, name: str) -> Bus:
    """The bus settings.bus names: NATS JetStream at settings.nats_url, or the in-process bus (kfactory/bus/memory.py,
    its broker 'default': every service of this process shares it). Raises BusUnavailable."""
    if settings.bus == "memory":
        from kfactory.bus.memory import MemoryBus

        return await MemoryBus.connect("memory://", name, ack_wait_s=settings.ack_wait_s,
                                       max_deliver=settings.max_deliver)
    from kfactory.bus.jetstream import NatsBus

    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    return await NatsBus.connect(settings.nats_url, name, user=settings.nats_user, password=password,
                                 ack_wait_s=settings.ack_wait_s, max_deliver=settings.max_deliver,
                                 replicas=settings.stream_replicas)


@dataclass
class Running:
    """Services running as tasks of this process."""
    ctx: Context
    services: dict[str, Service]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        for name, svc in self.services.items():
            self.tasks.append(asyncio.create_task(svc.run(self.stop), name=f"kf-{name}"))
            self.tasks[-1].add_done_callback(self._died)

    def _died(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("service stopped with an error", task=task.get_name(), error=repr(exc),
                      where="".join(traceback.format_exception(exc)[-6:]))
            self.stop.set()

    def ready(self) -> bool:
        """Connected to NATS, and every service task still running (the health server's READY)."""
        return self.ctx.bus.connected and bool(self.tasks) and not any(t.done() for t in self.tasks)

    def failed(self) -> BaseException | None:
        for t in self.tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return t.exception()
        return None

    async def shutdown(self) -> None:
        self.stop.set()
        done, pending = await asyncio.wait(self.tasks, timeout=5)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for svc in self.services.values():
            close = getattr(svc, "close", None)
            if close:
                await close()
        await self.ctx.claims.close()
        await self.ctx.bus.close()


async def _check_role(ctx: Context, user: str | None, names) -> None:
    """Refuse to start services whose NATS user may not do their work: the server would drop each refused
    call silently, and the service would fail later with a timeout instead of this message."""
    from kfactory.platform import security

    if user not in security.PERMISSIONS:
        return  # not one of the service users (no auth, or an admin): the server decides
    missing = security.not_permitted(user, [n for n in names if n in security.PERMISSIONS])
    if missing:
        await ctx.claims.close()
        await ctx.bus.close()
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise WiringError(f"NATS user {user!r} may not publish to {shown}, which {' and '.join(names)} "
                          f"need{'s' if len(names) == 1 else ''}: give each service its own user (KFACTORY_NATS_USER "
                          "and _PASSWORD; kfactory/platform/security.py PERMISSIONS)")


async def start_services(settings: Settings, names=SERVICE_NAMES, grpc: bool = True) -> Running:
    """Start the named services in this process over one connection set."""
    label = "+".join(names) if len(names) < 6 else "all"
    try:
        observability.setup(settings, label)
    except observability.SETUP_ERRORS as e:
        raise WiringError(str(e)) from e
    ctx = await open_context(settings, label)
    await _check_role(ctx, settings.nats_user, names)
    ctx.bus.roles = tuple(names)  # work they send goes only where the topology routes it (send_work checks)
    compare.ONE_PASS = settings.compare_one_pass  # the judge's comparison, process-wide (kfactory/judge/numerics.py)
    services = {}
    for n in names:
        cls = service_class(n)
        if grpc or n not in ("planner", "memory"):
            services[n] = cls(ctx)
        else:  # no public servers; memory still answers this process's verifiers on a loopback port
            # (planner and memory, the two services that host gRPC, take grpc_addr; the base class does not)
            services[n] = cls(ctx, grpc_addr="127.0.0.1:0" if n == "memory" else "")  # type: ignore[call-arg]
    running = Running(ctx, services)
    running.start()
    return running


#: what `serve` warns of without a claims store: its replicas would each claim the same work (the planner's
#: points, the benchmarker's device leases), and nothing else would say so
IN_PROCESS_CLAIMS = ("claims are in-process (KFACTORY_REDIS_URL unset): deduplication, locks and device leases hold "
                     "within this process only; run one replica of each service, or set KFACTORY_REDIS_URL to share "
                     "them between replicas")


async def serve(name: str, settings: Settings) -> None:
    """Run one service until SIGTERM or SIGINT."""
    if settings.bus != "nats":
        raise WiringError(f"`serve` runs one service of several processes, which share a bus only through NATS: "
                          f"set KFACTORY_BUS=nats (not {settings.bus!r})")
    running = await start_services(settings, (name,))
    try:
        health = await observability.start_health(settings, running.ready, running.stop)
        lag = observability.start_lag_poller(settings, running.ctx.bus, name, running.stop)
    except observability.SETUP_ERRORS as e:
        await running.shutdown()
        raise WiringError(str(e)) from e
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, running.stop.set)
    log.info("service started", service=name, nats=settings.nats_url, redis=bool(settings.redis_url))
    if not settings.redis_url:
        log.warning(IN_PROCESS_CLAIMS, service=name)
    await running.stop.wait()
    err = running.failed()
    if health is not None:
        await health[1]
        await health[0].stop()
    if lag is not None:
        await lag
    await running.shutdown()
    telemetry.shutdown()
    if err is not None:
        raise err

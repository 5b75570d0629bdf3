"""The bus in this process's memory: the same interface and contract as NatsBus (tests/test_bus_contract.py runs
one suite on both), for unit tests and single-process runs that need no server.

A `Broker` plays the server: three streams (work with work-queue retention, events and dead letters with limits
retention), each deduplicating by Nats-Msg-Id within its window, durable consumers and the artifact store. Buses
opened on the same broker name (`memory://NAME`) share it, as services connected to one nats-server do; it lives
until `forget(NAME)`, so services stopped and started again meet what they left, as after a restart.

Work messages are delivered in order to one worker of the stage at a time; an ack or a term removes one, a nak
makes it due again after its delay, and one not settled within ack_wait (in_progress() extends it) is delivered
again, until max_deliver deliveries, after which it stays on the stream undelivered, as on NATS.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncGenerator

from kfactory.bus import consume as consuming
from kfactory.bus import events as ev
from kfactory.bus.artifacts import MemoryArtifacts
from kfactory.bus.base import Bus, Refused, Stored
from kfactory.bus.errors import NoStream
from kfactory.bus.outcomes import Handler, Message
from kfactory.bus.topology import DLQ_STREAM, EVENTS_STREAM, WORK_STREAM, stream_of, subject_matches
from kfactory.v1 import events_pb2 as pb

#: NATS's default max_payload: the same messages are too large on both buses
MAX_PAYLOAD = 1 << 20
#: how long an idle consumer sleeps before it looks again for work that became due (a nak's delay, an expired
#: ack_wait) or for its stop; a publish wakes it at once
POLL_S = 0.1
#: the duplicate windows of the streams (NATS: kfactory's 600 s on work and events, the server's 2 min default
#: on the dead letters)
WINDOWS = {WORK_STREAM: 600.0, EVENTS_STREAM: 600.0, DLQ_STREAM: 120.0}

_BROKERS: dict[str, Broker] = {}


def broker(name: str) -> Broker:
    """The broker called `name`, made on first use."""
    return _BROKERS.setdefault(name, Broker())


def forget(name: str) -> None:
    """Drop the broker called `name` and everything it holds (a test's teardown)."""
    _BROKERS.pop(name, None)


def _now() -> float:
    return asyncio.get_running_loop().time()


class _Signal:
    """Wakes every waiter when something changed (a publish, a nak, an ack)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._event.wait(), max(0.0, timeout))
        except TimeoutError:
            return


@dataclass
class _Entry:
    """A stored message, and (on the work stream) its one consumer's delivery state."""
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    deliveries: int = 0
    due: float = 0.0              # not delivered before this (a nak's delay)
    deadline: float | None = None  # in flight until this (ack_wait), then due again


@dataclass
class _Stream:
    name: str
    entries: dict[int, _Entry] = field(default_factory=dict)
    last: int = 0
    seen: dict[str, float] = field(default_factory=dict)  # Nats-Msg-Id -> when it was stored

    def add(self, subject: str, data: bytes, headers: dict[str, str], now: float) -> bool:
        """Store a message; False when its Nats-Msg-Id was stored within the duplicate window."""
        window = WINDOWS[self.name]
        while self.seen and now - next(iter(self.seen.values())) >= window:  # oldest first: insertion order
            del self.seen[next(iter(self.seen))]
        msg_id = headers.get("Nats-Msg-Id")
        if msg_id is not None and msg_id in self.seen:
            return False
        if msg_id is not None:
            self.seen[msg_id] = now
        self.last += 1
        self.entries[self.last] = _Entry(self.last, subject, bytes(data), dict(headers))
        return True


@dataclass
class _Follower:
    """A consumer of the events stream: where it has read to, and what it was handed and has not yet acked."""
    filter: str
    next_seq: int = 1
    pending: dict[int, float] = field(default_factory=dict)    # seq -> redelivered after this
    delivered: dict[int, int] = field(default_factory=dict)    # seq -> deliveries


class Broker:
    """The server of the in-memory bus: streams, durable followers, artifacts, and a signal for waiters."""

    def __init__(self) -> None:
        self.streams = {name: _Stream(name) for name in (WORK_STREAM, EVENTS_STREAM, DLQ_STREAM)}
        self.followers: dict[str, _Follower] = {}
        self.artifacts = MemoryArtifacts()
        self.max_payload = MAX_PAYLOAD
        self.changed = _Signal()


@dataclass
class _Seq:
    stream: int


@dataclass
class _Meta:
    num_delivered: int
    sequence: _Seq


class MemoryMsg:
    """A delivered message with the surface of nats-py's Msg (kfactory.bus.outcomes.Message)."""

    def __init__(self, entry: _Entry, deliveries: int, settle):
        self.subject, self.data, self.headers = entry.subject, entry.data, entry.headers
        self.metadata = _Meta(deliveries, _Seq(entry.seq))
        self._settle = settle

    async def ack(self) -> None:
        self._settle("ack", 0.0)

    async def nak(self, delay: float | None = None) -> None:
        self._settle("nak", delay or 0.0)

    async def term(self) -> None:
        self._settle("term", 0.0)

    async def in_progress(self) -> None:
        self._settle("progress", 0.0)


class MemoryBus(Bus):
    """A bus on a Broker of this process (see the module docstring)."""

    def __init__(self, name: str, broker_name: str = "default", ack_wait_s: float = 30.0, max_deliver: int = 5):
        super().__init__(name, ack_wait_s, max_deliver)
        self.broker = broker(broker_name)
        self._closed = False

    @classmethod
    async def connect(cls, url: str, name: str, *, ack_wait_s: float = 30.0, max_deliver: int = 5) -> MemoryBus:
        """A bus on the broker the URL names (memory://NAME; memory:// alone is the broker 'default')."""
        return cls(name, url.removeprefix("memory://") or "default", ack_wait_s, max_deliver)

    @property
    def connected(self) -> bool:
        return not self._closed

    def max_payload(self) -> int:
        return self.broker.max_payload

    async def ensure(self) -> None:
        """Nothing to create: a broker has its streams from the start."""

    async def close(self) -> None:
        self._closed = True
        self.broker.changed.notify()

    async def _publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        name = stream_of(subject)
        if name is None:
            raise NoStream(f"no stream holds {subject!r}: kfactory publishes only under "
                           f"{ev.WORK_PREFIX}, {ev.EVT_PREFIX} and {ev.DLQ_PREFIX}")
        if self.broker.streams[name].add(subject, data, headers, _now()):
            self.broker.changed.notify()

    # -- reading streams -----------------------------------------------------------------------------
    async def stored(self, stream: str, subject: str) -> list[Stored]:
        return [Stored(e.seq, e.subject, e.data) for e in list(self.broker.streams[stream].entries.values())
                if subject_matches(subject, e.subject)]

    async def last_seq(self, stream: str) -> int:
        return self.broker.streams[stream].last

    async def _next_on_subject(self, stream: str, subject: str, seq: int) -> Stored | None:
        for e in list(self.broker.streams[stream].entries.values()):
            if e.seq >= seq and subject_matches(subject, e.subject):
                return Stored(e.seq, e.subject, e.data)
        return None

    async def _get(self, stream: str, seq: int) -> bytes | None:
        entry = self.broker.streams[stream].entries.get(seq)
        return entry.data if entry is not None else None

    async def _delete(self, stream: str, seq: int) -> None:
        self.broker.streams[stream].entries.pop(seq, None)

    # -- consuming work ------------------------------------------------------------------------------
    async def consume(self, stage: str, handler: Handler, workers: int = 1,
                      stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        await asyncio.gather(*(self._worker(stage, handler, stop) for _ in range(workers)))

    async def _worker(self, stage: str, handler: Handler, stop: asyncio.Event) -> None:
        prefix = f"{ev.WORK_PREFIX}.{stage}."
        while not stop.is_set() and not self._closed:
            msg, wake = self._take_work(prefix)
            if msg is None:
                await self.broker.changed.wait(min(POLL_S, wake))
                continue
            await consuming.handle(self, stage, msg, handler)

    def _take_work(self, prefix: str) -> tuple[MemoryMsg | None, float]:
        """The next due work message under `prefix`, marked in flight; else (None, seconds until one may be)."""
        now, wake = _now(), POLL_S
        stream = self.broker.streams[WORK_STREAM]
        for e in stream.entries.values():
            if not e.subject.startswith(prefix) or e.deliveries >= self.max_deliver and e.deadline is None:
                continue
            if e.deadline is not None and e.deadline > now:
                wake = min(wake, e.deadline - now)
            elif e.deliveries >= self.max_deliver:
                e.deadline = None  # its last delivery expired unsettled: it stays, delivered no more (NATS)
            elif e.due > now:
                wake = min(wake, e.due - now)
            else:
                e.deliveries, e.deadline = e.deliveries + 1, now + self.ack_wait_s
                return MemoryMsg(e, e.deliveries, lambda how, delay, e=e: self._settle_work(e, how, delay)), 0.0
        return None, wake

    def _settle_work(self, e: _Entry, how: str, delay: float) -> None:
        """What an ack, nak, term or heartbeat does to a work message (an old delivery's too, as on NATS)."""
        stream = self.broker.streams[WORK_STREAM]
        if how in ("ack", "term"):
            stream.entries.pop(e.seq, None)  # work-queue retention: settled work leaves the stream
        elif how == "nak":
            e.deadline, e.due = None, _now() + delay
        elif e.deadline is not None:  # in progress: ack_wait starts again
            e.deadline = _now() + self.ack_wait_s
        self.broker.changed.notify()

    # -- following the events stream -------------------------------------------------------------------
    async def follow(self, durable: str | None, filter_subject: str = f"{ev.EVT_PREFIX}.>",
                     stop: asyncio.Event | None = None, refused: Refused | None = None,
                     ) -> AsyncGenerator[tuple[pb.Event, Message], None]:
        state = (self.broker.followers.setdefault(durable, _Follower(filter_subject)) if durable
                 else _Follower(filter_subject))
        stop = stop or asyncio.Event()
        while not stop.is_set() and not self._closed:
            msgs, wake = self._take_events(state)
            if not msgs:
                await self.broker.changed.wait(min(POLL_S, wake))
                continue
            for msg in msgs:
                if (event := await consuming.decoded(self, msg, refused)) is not None:
                    yield event, msg

    def _take_events(self, f: _Follower, batch: int = 64) -> tuple[list[MemoryMsg], float]:
        """Up to `batch` events for a follower: first those whose ack_wait ran out, then new ones in order."""
        now, wake = _now(), POLL_S
        out: list[MemoryMsg] = []
        entries = self.broker.streams[EVENTS_STREAM].entries
        for seq, deadline in sorted(f.pending.items()):
            if deadline > now:
                wake = min(wake, deadline - now)
            elif seq in entries and len(out) < batch:
                out.append(self._hand(f, entries[seq], now))
        for seq in range(f.next_seq, self.broker.streams[EVENTS_STREAM].last + 1):
            if len(out) >= batch:
                break
            f.next_seq = seq + 1
            if seq in entries and subject_matches(f.filter, entries[seq].subject):
                out.append(self._hand(f, entries[seq], now))
        return out, wake

    def _hand(self, f: _Follower, e: _Entry, now: float) -> MemoryMsg:
        f.pending[e.seq] = now + self.ack_wait_s
        f.delivered[e.seq] = f.delivered.get(e.seq, 0) + 1
        return MemoryMsg(e, f.delivered[e.seq], lambda how, delay, s=e.seq: self._settle_event(f, s, how, delay))

    def _settle_event(self, f: _Follower, seq: int, how: str, delay: float) -> None:
        if how in ("ack", "term"):
            f.pending.pop(seq, None)
            f.delivered.pop(seq, None)
        elif seq in f.pending:
            f.pending[seq] = _now() + (delay if how == "nak" else self.ack_wait_s)
        self.broker.changed.notify()

    # -- artifacts -----------------------------------------------------------------------------------
    async def put_artifact(self, data: bytes) -> str:
        return await self.broker.artifacts.put(data)

    async def get_artifact(self, digest: str) -> bytes:
        return await self.broker.artifacts.get(digest)

"""A work message's fate, made explicit: a handler returns Ack, Nak(delay), Term(reason, cause) or Leave.

The consuming machinery (kfactory/bus/consume.py) turns the outcome into the message's ack, nak with delay, or term
after publishing a dead letter with the reason; an exception in a handler is retried with backoff and dead-lettered
on its last allowed delivery. `Message` is what both buses hand over: a NATS message or an in-memory one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from kfactory.bus.errors import TRANSIENT
from kfactory.observability.log import get_logger
from kfactory.v1 import events_pb2 as pb

log = get_logger("bus")


@dataclass(frozen=True)
class Ack:
    """Done: the result is published."""


@dataclass(frozen=True)
class Nak:
    """Not now (a resource is busy or a transient failure): redeliver after delay_s. The reason says what it
    waits for; it becomes the dead letter's reason if the message runs out of deliveries."""
    delay_s: float = 1.0
    reason: str = "still busy"


@dataclass(frozen=True)
class Term:
    """Can never succeed: dead-letter with this reason (words, for people) and cause (a DeadLetterCause, for
    tools: `kfactory dead-letters --cause`) and stop redelivering."""
    reason: str
    cause: pb.DeadLetterCause


@dataclass(frozen=True)
class Leave:
    """This delivery is stale: a newer holder of the item's fenced lock is handling the message. Neither ack nor
    nak it: the server applies an old delivery's ack to the message, which would remove it from under its
    current holder (and lose it if that holder then died)."""


Outcome = Ack | Nak | Term | Leave


class Sequence(Protocol):
    @property
    def stream(self) -> int: ...


class Metadata(Protocol):
    @property
    def num_delivered(self) -> int: ...

    @property
    def sequence(self) -> Sequence: ...


class Message(Protocol):
    """One delivered message, as nats-py's Msg has it (the in-memory bus's MemoryMsg has the same surface)."""
    @property
    def subject(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> dict[str, str] | None: ...

    @property
    def metadata(self) -> Metadata: ...

    async def ack(self) -> None: ...

    async def nak(self, delay: float | None = None) -> None: ...

    async def term(self) -> None: ...

    async def in_progress(self) -> None: ...


@dataclass
class Delivery:
    """One work message handed to a handler."""
    event: pb.Event
    subject: str
    deliveries: int
    _msg: Message

    async def in_progress(self) -> None:
        """Tell the server the work is still running, so ack_wait does not expire."""
        await self._msg.in_progress()


Handler = Callable[[Delivery], Awaitable[Outcome]]


async def ack_quietly(msg: Message) -> None:
    """Ack a message; when the connection is down the ack is lost and the server redelivers the message after
    ack_wait, which an idempotent consumer absorbs (so a lost ack is logged, not raised)."""
    try:
        await msg.ack()
    except TRANSIENT as e:
        log.warning("ack failed; the message will be redelivered", subject=msg.subject, error=repr(e))


async def term_quietly(msg: Message) -> None:
    """Term a message; when the connection is down the term is lost and the server redelivers the message after
    ack_wait, to be refused again (so a lost term is logged, not raised)."""
    try:
        await msg.term()
    except TRANSIENT as e:
        log.warning("term failed; the message will be redelivered", subject=msg.subject, error=repr(e))

"""The bus interface every service uses, and what both implementations share.

`Bus` is the one interface: publish results on the events stream, queue work for a stage, consume a stage's work
with explicit outcomes (kfactory/bus/consume.py), follow the events stream from its start, dead letters, the
artifact store, and a campaign's start and end read from the stream. Two implementations pass one contract suite
(tests/test_bus_contract.py): `NatsBus` (kfactory/bus/jetstream.py) on NATS JetStream, for every deployment, and
`MemoryBus` (kfactory/bus/memory.py), in this process only, for unit tests and single-process runs.

An implementation supplies the transport (the abstract methods); publishing with its checks, the wiring check
against the topology, dead letters and the campaign lookups are written once, here.
"""
from __future__ import annotations

import asyncio
import contextvars
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import AsyncGenerator, Awaitable, Callable

from kfactory.bus import events as ev
from kfactory.bus import topology
from kfactory.bus.errors import NotInTopology, PayloadTooLarge, PublishNotPermitted
from kfactory.bus.outcomes import Handler, Message
from kfactory.observability import metrics
from kfactory.observability import tracing as telemetry
from kfactory.v1 import events_pb2 as pb

#: the most of a dead message's bytes its dead letter keeps
DLQ_PAYLOAD_MAX = 256 << 10
#: a handler still running after this long is stuck (settings.handler_timeout_s): without a limit its heartbeats
#: would keep the message, and the consumer's worker, for ever
HANDLER_TIMEOUT_S = 1800.0

traceparent: contextvars.ContextVar[str] = contextvars.ContextVar("traceparent", default="")
Refused = Callable[[Message, ev.BadEvent], Awaitable[None]]


def new_traceparent(trace_id: str | None = None) -> str:
    """A W3C traceparent; a candidate's trace id derives from its id so its journey is one trace."""
    tid = (trace_id or secrets.token_hex(16))[:32].ljust(32, "0")
    return f"00-{tid}-{secrets.token_hex(8)}-01"


@dataclass(frozen=True)
class Stored:
    """One message as a stream holds it: its sequence there, its subject and its bytes."""
    seq: int
    subject: str
    data: bytes


def dead_letter_of(stage: str, subject: str, data: bytes, reason: str, deliveries: int,
                   cause: pb.DeadLetterCause) -> pb.DeadLetter:
    """The dead letter of work message `data`: its payload cut to DLQ_PAYLOAD_MAX (a dead letter must itself fit
    in a message), and the point, candidate and timing round the work was about read from the whole message (a
    cut payload no longer decodes; see DeadLetter)."""
    if len(data) > DLQ_PAYLOAD_MAX:
        reason += f" (payload cut to its first {DLQ_PAYLOAD_MAX} of {len(data)} bytes)"
    dl = pb.DeadLetter(stage=stage, subject=subject, reason=reason, deliveries=deliveries,
                       payload=data[:DLQ_PAYLOAD_MAX], payload_bytes=len(data), cause=cause)
    if (inner := ev.decoded(data)) is not None and (work := ev.work_of(inner)) is not None:
        dl.point_id, dl.candidate_id = work[0], work[1].id if work[1] is not None else ""
        dl.round = inner.verified.round if inner.HasField("verified") else 0
    return dl


class Bus(ABC):
    """kfactory's message bus: work queues, the events stream, dead letters and the artifact store."""

    def __init__(self, name: str, ack_wait_s: float = 30.0, max_deliver: int = 5):
        self.name = name
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        #: work messages larger than this are dead-lettered undecoded (settings.max_event_bytes)
        self.max_event_bytes = ev.MAX_EVENT_BYTES
        #: a handler running longer is cancelled and its message retried (settings.handler_timeout_s)
        self.handler_timeout_s = HANDLER_TIMEOUT_S
        #: the subjects this connection's NATS user may publish to (wildcards as NATS has them); None: unchecked
        self.may_publish: list[str] | None = None
        #: the topology roles (services) this connection sends work for; None: unchecked (tests, tools)
        self.roles: tuple[str, ...] | None = None
        self._started: set[str] = set()
        #: campaigns whose CampaignFinished this bus has read (a campaign finishes once: remembered)
        self._finished: dict[str, pb.CampaignFinished] = {}

    # -- the transport: what an implementation supplies --------------------------------------------
    @property
    @abstractmethod
    def connected(self) -> bool:
        """Whether the bus can carry messages now (the health server's READY)."""

    @abstractmethod
    def max_payload(self) -> int:
        """The largest message (headers and payload) the server takes; 0: no limit known."""

    @abstractmethod
    async def ensure(self) -> None:
        """Create the streams and the artifact bucket if missing (idempotent across services)."""

    @abstractmethod
    async def close(self) -> None:
        """Flush what was published and close."""

    @abstractmethod
    async def _publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Store a message on the stream that holds `subject`; a repeat of its Nats-Msg-Id within the duplicate
        window is dropped. Raises PayloadTooLarge where the server refuses the size."""

    @abstractmethod
    async def consume(self, stage: str, handler: Handler, workers: int = 1,
                      stop: asyncio.Event | None = None) -> None:
        """Run `workers` competing consumers of the stage's work (one durable consumer per stage, shared by every
        replica) until `stop` is set; each message goes through kfactory.bus.consume.handle."""

    @abstractmethod
    def follow(self, durable: str | None, filter_subject: str = f"{ev.EVT_PREFIX}.>",
               stop: asyncio.Event | None = None, refused: Refused | None = None,
               ) -> AsyncGenerator[tuple[pb.Event, Message], None]:
        """Yield (event, msg) from the events stream from its start; the caller acks each msg.

        With a durable name, a restarted follower resumes where it stopped; without, it replays everything.
        A message that is no valid event is never yielded (kfactory.bus.consume.decoded refuses it)."""

    @abstractmethod
    async def stored(self, stream: str, subject: str) -> list[Stored]:
        """Every message stored on `stream` under `subject` (wildcards allowed), oldest first."""

    @abstractmethod
    async def last_seq(self, stream: str) -> int:
        """The sequence of the last message stored on `stream` (0 when it never held one)."""

    @abstractmethod
    async def _next_on_subject(self, stream: str, subject: str, seq: int) -> Stored | None:
        """The first message on `subject` at or after sequence `seq`, or None."""

    @abstractmethod
    async def _get(self, stream: str, seq: int) -> bytes | None:
        """The message at `seq` on `stream`, or None when there is none there."""

    @abstractmethod
    async def _delete(self, stream: str, seq: int) -> None:
        """Remove the message at `seq` from `stream`; one that is not there is no error."""

    @abstractmethod
    async def put_artifact(self, data: bytes) -> str:
        """Store bytes under their sha256 (returned); storing the same bytes twice is a no-op."""

    @abstractmethod
    async def get_artifact(self, digest: str) -> bytes:
        """Fetch an artifact by digest; raises ArtifactMissing."""

    # -- publishing ---------------------------------------------------------------------------------
    def _headers(self, msg_id: str) -> dict[str, str]:
        # the current span's context when there is one, so the consumer's span becomes its child
        return {"Nats-Msg-Id": msg_id,
                "traceparent": telemetry.current_traceparent() or traceparent.get() or new_traceparent()}

    async def publish(self, event: pb.Event) -> None:
        """Publish a result on the events stream; a retry with the same event id is dropped."""
        subject = ev.event_subject(ev.kind_of(event), event.campaign_id)
        await self._publish(subject, event.SerializeToString(), self._headers(event.id))
        metrics.published(event)

    async def send_work(self, stage: str, event: pb.Event) -> None:
        """Queue an event as work for a stage (one replica of its consumer takes it). Raises NotInTopology when
        this connection's roles do not send work to `stage` (kfactory/bus/topology.py ROLES)."""
        if self.roles is not None and not topology.may_queue(self.roles, stage):
            raise NotInTopology(f"{'+'.join(self.roles)} does not queue work for stage {stage!r}: the route is not "
                                "in kfactory/bus/topology.py ROLES (add it there, and the permissions follow)")
        await self._publish(ev.work_subject(stage, event.campaign_id), event.SerializeToString(),
                            self._headers(f"work.{stage}:{event.id}"))

    async def requeue(self, subject: str, data: bytes, msg_id: str) -> None:
        """Put a serialized work message back on its work subject (a dead letter sent back by deadletters.py)."""
        await self._publish(subject, data, self._headers(msg_id))

    def _require(self, subject: str) -> None:
        """Raise PublishNotPermitted unless this service's NATS user may publish to `subject` (a JetStream API
        call is a publish too): the server would drop it, and the caller would see only a timeout."""
        if self.may_publish is not None and not any(topology.subject_matches(p, subject)
                                                    for p in self.may_publish):
            raise PublishNotPermitted(f"{self.name} may not publish to {subject}: its NATS user's permissions "
                                      "(kfactory/platform/security.py PERMISSIONS) do not include it")

    async def _publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Check the permissions and the size, then publish. The server counts headers and payload against
        max_payload (nats-py checks the payload alone) and closes the connection of a client that sends more:
        checked here, with what was too large in the error."""
        self._require(subject)
        size, limit = len(data) + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 12, self.max_payload()
        if limit and size > limit:
            raise PayloadTooLarge(too_large(subject, data, size, limit))
        await self._publish_raw(subject, data, headers)

    # -- dead letters -------------------------------------------------------------------------------
    async def dead_letter(self, stage: str, subject: str, data: bytes, reason: str, deliveries: int,
                          campaign_id: str, work_seq: int = 0,
                          cause: pb.DeadLetterCause = pb.DEAD_LETTER_CAUSE_UNSPECIFIED) -> None:
        """Record a message that can never succeed: on the DLQ stream and as an event memory archives, with its
        reason (words) and `cause` (a DeadLetterCause).
        `work_seq` is the message's sequence on the work stream: work sent back from the dead letters is a new
        message with the same bytes, and if it dies again that is a second dead letter, not a duplicate of the
        first (a redelivery of the same message, as after a crash between here and its term, still is)."""
        dl = dead_letter_of(stage, subject, data, reason, deliveries, cause)
        key = ev.sha256_hex(f"{subject}:{work_seq}:".encode() + data)[:24]
        event = ev.make_event(campaign_id or "unknown", self.name, key, dead_letter=dl)
        await self._publish(f"{ev.DLQ_PREFIX}.{stage}.{campaign_id or 'unknown'}", event.SerializeToString(),
                            self._headers(event.id))
        await self.publish(event)

    async def get_dead_letter(self, seq: int) -> bytes | None:
        """The stored dead-letter event at `seq` on the DLQ stream, or None when there is none there."""
        self._require(f"$JS.API.STREAM.MSG.GET.{topology.DLQ_STREAM}")
        return await self._get(topology.DLQ_STREAM, seq)

    async def delete_dead_letter(self, seq: int) -> None:
        """Remove the dead letter at `seq` from the DLQ stream; one that is gone already stays gone."""
        self._require(f"$JS.API.STREAM.MSG.DELETE.{topology.DLQ_STREAM}")
        await self._delete(topology.DLQ_STREAM, seq)

    # -- a campaign's lifecycle, read from the events stream ------------------------------------------
    async def campaign_started(self, campaign_id: str) -> bool:
        """Whether the events stream holds the campaign's CampaignStarted (remembered once it does): work for a
        campaign nobody started is refused, not done."""
        if campaign_id in self._started:
            return True
        if await self._lifecycle(campaign_id, "campaign_started") is None:
            return False
        self._started.add(campaign_id)
        return True

    async def campaign_finished(self, campaign_id: str) -> pb.CampaignFinished | None:
        """The campaign's CampaignFinished from the events stream, or None while it has not finished."""
        if campaign_id in self._finished:
            return self._finished[campaign_id]
        event = await self._lifecycle(campaign_id, "campaign_finished")
        if event is None:
            return None
        self._finished[campaign_id] = event.campaign_finished
        return event.campaign_finished

    async def _lifecycle(self, campaign_id: str, kind: str) -> pb.Event | None:
        """The first believable event of `kind` (the planner's start or end of the campaign) on its subject: a
        message there that is no valid event, or not the planner's (kfactory/evidence/trust.py), is passed over,
        so that bytes published on the subject neither start nor end a campaign."""
        from kfactory.evidence import trust

        subject, seq = ev.event_subject(kind, campaign_id), 1
        while (found := await self._next_on_subject(topology.EVENTS_STREAM, subject, seq)) is not None:
            try:
                event = ev.decode_event(found.data, subject, max(self.max_event_bytes, ev.MAX_EVENT_BYTES))
            except ev.BadEvent:
                event = None  # not an event at all: the next message on the subject may be the planner's
            if event is not None and not trust.body_flaw(event):
                return event
            seq = found.seq + 1
        return None


def too_large(subject: str, data: bytes, size: int, limit: int) -> str:
    """Why a message cannot be published (PayloadTooLarge): its size, the limit, its largest field where it is an
    event, and what to do."""
    try:
        name, field_size = _largest_field(ev.decode_event(data, max_bytes=len(data)))
        field = f" (its largest field: {name}, {field_size} bytes)" if name else ""
    except ev.BadEvent:  # not an event (a requeued payload that never decoded): its size says enough
        field = ""
    return (f"the message for {subject} is {size} bytes, over the NATS server's max_payload of {limit} bytes"
            f"{field}: it can never be sent as it is; make it smaller (keep large data in the artifact store and "
            "send its digest), or raise max_payload on the server")


def _largest_field(msg, path: str = "") -> tuple[str, int]:
    """(dotted path, bytes) of the largest field of a protobuf message, looking into singular message fields (a
    repeated field counts as a whole)."""
    best = ("", -1)
    for fd, value in msg.ListFields():
        name = f"{path}.{fd.name}" if path else fd.name
        if fd.is_repeated:
            found = (name, sum(len(v) if isinstance(v, (str, bytes)) else
                               v.ByteSize() if hasattr(v, "ByteSize") else 8 for v in value))
        elif fd.message_type is not None:
            found = _largest_field(value, name)
        else:
            found = (name, len(value) if isinstance(value, (str, bytes)) else 8)
        best = max(best, found, key=lambda x: x[1])
    return best

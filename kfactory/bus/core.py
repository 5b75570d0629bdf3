"""The message bus: NATS JetStream work queues, the events stream, dead letters and the artifact store.

Every message's fate is explicit: a handler returns Ack, Nak(delay) or Term(reason); an exception in a
handler is logged and nak'ed with delay, and on its last allowed delivery it is dead-lettered and term'ed.
"""
from __future__ import annotations

import asyncio
import contextvars
import secrets
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

import nats
import nats.errors
import nats.js.errors
from nats.js.api import (AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType,
                         StreamConfig)

from kfactory.bus import events as ev
from kfactory.observability import tracing as telemetry
from kfactory.claims.base import ClaimsUnavailable
from kfactory.observability.log import get_logger
from kfactory.observability import metrics
from kfactory.v1 import events_pb2 as pb

WORK_STREAM = "KF_WORK"
EVENTS_STREAM = "KF_EVENTS"
DLQ_STREAM = "KF_DLQ"
ARTIFACT_BUCKET = "kf-artifacts"
DUPLICATE_WINDOW_S = 600.0
#: the most of a dead message's bytes its dead letter keeps
DLQ_PAYLOAD_MAX = 256 << 10

#: errors that mean "NATS is briefly unreachable" (a restart, a reconnect), not "this request is wrong":
#: publishes are retried on them (safe: every publish carries a Nats-Msg-Id) and pull loops wait them out
TRANSIENT = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.StaleConnectionError,
             nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError,
             nats.js.errors.ServiceUnavailableError, asyncio.TimeoutError)
#: how long a publish keeps retrying through an outage before it gives up (raises)
PUBLISH_RETRY_S = 60.0
#: errors of a handler that mean a dependency (NATS, the claims store) is briefly unreachable
#: (nats' own TimeoutError only: a builtin TimeoutError from the handler's own work is not an outage)
OUTAGE = tuple(e for e in TRANSIENT if e is not asyncio.TimeoutError) + (ClaimsUnavailable,)
#: how long a handler is retried in place through such an outage before the message is nak'ed
OUTAGE_WAIT_S = 60.0
#: a handler still running after this long is stuck (settings.handler_timeout_s): without a limit its heartbeats
#: would keep the message, and the consumer's worker, for ever
HANDLER_TIMEOUT_S = 1800.0

log = get_logger("bus")
traceparent: contextvars.ContextVar[str] = contextvars.ContextVar("traceparent", default="")


class BusUnavailable(RuntimeError):
    """NATS could not be reached or JetStream is not enabled there."""


class HandlerStuck(RuntimeError):
    """A handler ran past the bus's handler_timeout_s and was cancelled; its message is retried like any failed
    delivery (nak with backoff, dead-lettered after max_deliver) and the message says where it waited."""


class PublishNotPermitted(PermissionError):
    """This service's NATS user may not publish to the subject (security.PERMISSIONS says so). Checked before
    publishing: the server refuses such a message without a typed error (nats-py sees a publish timeout), so
    without the check a misconfigured role cost a minute of retries per message and left only a timeout."""


class PayloadTooLarge(ValueError):
    """A message over the NATS server's max_payload: it can never be published as it is, however often it is
    tried, so a handler that made it has its work dead-lettered at once with this reason (what was too large)."""


class ArtifactMissing(KeyError):
    """No artifact with that digest in the object store."""


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
    """Can never succeed: dead-letter with this reason and stop redelivering."""
    reason: str


@dataclass(frozen=True)
class Leave:
    """This delivery is stale: a newer holder of the item's fenced lock is handling the message. Neither ack nor
    nak it: the server applies an old delivery's ack to the message, which would remove it from under its
    current holder (and lose it if that holder then died)."""


Outcome = Ack | Nak | Term | Leave


@dataclass
class Delivery:
    """One work message handed to a handler."""
    event: pb.Event
    subject: str
    deliveries: int
    _msg: object

    async def in_progress(self) -> None:
        """Tell the server the work is still running, so ack_wait does not expire."""
        await self._msg.in_progress()


Handler = Callable[[Delivery], Awaitable[Outcome]]


def new_traceparent(trace_id: str | None = None) -> str:
    """A W3C traceparent; a candidate's trace id derives from its id so its journey is one trace."""
    tid = (trace_id or secrets.token_hex(16))[:32].ljust(32, "0")
    return f"00-{tid}-{secrets.token_hex(8)}-01"


class Bus:
    """A connection to NATS JetStream with kfactory's streams, consumers and artifact bucket."""

    def __init__(self, nc, name: str, ack_wait_s: float = 30.0, max_deliver: int = 5):
        self.nc = nc
        self.js = nc.jetstream()
        self.name = name
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        #: work messages larger than this are dead-lettered undecoded (settings.max_event_bytes)
        self.max_event_bytes = ev.MAX_EVENT_BYTES
        #: a handler running longer is cancelled and its message retried (settings.handler_timeout_s)
        self.handler_timeout_s = HANDLER_TIMEOUT_S
        self._started: set[str] = set()
        self._objects = None
        #: copies of each stream and of the artifact bucket when this bus creates them (3 on a 3-server cluster)
        self.replicas = 1
        #: the subjects this connection's NATS user may publish to (wildcards as NATS has them); None: unchecked
        self.may_publish: list[str] | None = None

    @classmethod
    async def connect(cls, url: str, name: str, *, user: str | None = None, password: str | None = None,
                      ack_wait_s: float = 30.0, max_deliver: int = 5, timeout_s: float = 5.0,
                      replicas: int = 1) -> "Bus":
        """Connect and make sure the streams exist; raises BusUnavailable with the URL when it cannot."""
        try:
            # nats-py keeps retrying an initial connect when reconnects are allowed: probe first
            await _probe(url, timeout_s)
        except (OSError, asyncio.TimeoutError) as e:
            raise _unreachable(url, e) from e
        await _handshake(url, user, password, timeout_s)
        try:
            nc = await asyncio.wait_for(
                nats.connect(url, name=name, user=user, password=password, connect_timeout=timeout_s,
                             max_reconnect_attempts=-1, allow_reconnect=True,
                             error_cb=_log_error, reconnected_cb=_log_reconnect), timeout_s * 3)
        except (OSError, nats.errors.Error, asyncio.TimeoutError) as e:
            raise _unreachable(url, e) from e
        bus = cls(nc, name, ack_wait_s, max_deliver)
        bus.replicas = replicas
        try:
            await bus.ensure()
        except nats.js.errors.ServiceUnavailableError as e:
            await nc.close()
            raise BusUnavailable(f"NATS at {url} has no JetStream: start it with -js") from e
        return bus

    async def ensure(self) -> None:
        """Create the streams and the artifact bucket if missing (idempotent across services)."""
        await self._stream(StreamConfig(name=WORK_STREAM, subjects=[f"{ev.WORK_PREFIX}.>"],
                                        retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
                                        duplicate_window=DUPLICATE_WINDOW_S, num_replicas=self.replicas))
        await self._stream(StreamConfig(name=EVENTS_STREAM, subjects=[f"{ev.EVT_PREFIX}.>"],
                                        retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                                        duplicate_window=DUPLICATE_WINDOW_S, num_replicas=self.replicas))
        await self._stream(StreamConfig(name=DLQ_STREAM, subjects=[f"{ev.DLQ_PREFIX}.>"],
                                        retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                                        num_replicas=self.replicas))
        try:
            self._objects = await self.js.object_store(ARTIFACT_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            self._objects = await self.js.create_object_store(ARTIFACT_BUCKET, storage=StorageType.FILE,
                                                              replicas=self.replicas)

    async def _stream(self, cfg: StreamConfig) -> None:
        try:
            await self.js.stream_info(cfg.name)
        except nats.js.errors.NotFoundError:
            try:
                await self.js.add_stream(cfg)
            except nats.js.errors.BadRequestError:  # another service created it between our two calls
                await self.js.stream_info(cfg.name)

    async def close(self) -> None:
        """Flush what was published and close. (Draining would wait out every idle pull request.)"""
        if not self.nc.is_closed:
            try:
                await self.nc.flush(timeout=2)
            except (nats.errors.Error, asyncio.TimeoutError) as e:
                log.warning("flush before close failed", error=repr(e))
            await self.nc.close()

    # -- publishing --------------------------------------------------------------------------------
    def _headers(self, msg_id: str) -> dict[str, str]:
        # the current span's context when there is one, so the consumer's span becomes its child
        return {"Nats-Msg-Id": msg_id,
                "traceparent": telemetry.current_traceparent() or traceparent.get() or new_traceparent()}

    async def publish(self, event: pb.Event) -> None:
        """Publish a result on the events stream; a retry with the same event id is dropped by the server."""
        subject = ev.event_subject(ev.kind_of(event), event.campaign_id)
        await self._publish_retrying(subject, event.SerializeToString(), self._headers(event.id))
        metrics.published(event)

    async def send_work(self, stage: str, event: pb.Event) -> None:
        """Queue an event as work for a stage (work-queue retention: one replica takes it)."""
        await self._publish_retrying(ev.work_subject(stage, event.campaign_id), event.SerializeToString(),
                                     self._headers(f"work.{stage}:{event.id}"))

    def _require(self, subject: str) -> None:
        """Raise PublishNotPermitted unless this service's NATS user may publish to `subject` (a JetStream API
        call is a publish too): the server would drop it, and the caller would see only a timeout."""
        if self.may_publish is not None and not any(subject_matches(p, subject) for p in self.may_publish):
            raise PublishNotPermitted(f"{self.name} may not publish to {subject}: its NATS user's permissions "
                                      "(kfactory/platform/security.py PERMISSIONS) do not include it")

    async def get_dead_letter(self, seq: int) -> bytes | None:
        """The stored dead-letter event at `seq` on the DLQ stream, or None when there is none there."""
        self._require(f"$JS.API.STREAM.MSG.GET.{DLQ_STREAM}")
        try:
            return (await self.js.get_msg(DLQ_STREAM, seq)).data
        except nats.js.errors.NotFoundError:
            return None

    async def delete_dead_letter(self, seq: int) -> None:
        """Remove the dead letter at `seq` from the DLQ stream; one that is gone already stays gone."""
        self._require(f"$JS.API.STREAM.MSG.DELETE.{DLQ_STREAM}")
        try:
            await self.js.delete_msg(DLQ_STREAM, seq)
        except nats.js.errors.APIError:
            # the server refuses to delete a message that is not there (JSStreamMsgDeleteFailedF); gone is what
            # was wanted, as after an earlier attempt that deleted it once it had queued the same work
            if await self.get_dead_letter(seq) is not None:
                raise

    async def _publish_retrying(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Publish, retrying through a NATS outage for up to PUBLISH_RETRY_S: the Nats-Msg-Id header makes a
        retry of a publish that did reach the server a no-op, so nothing is stored twice."""
        self._require(subject)
        # the server counts headers and payload against max_payload (nats-py checks the payload alone) and closes
        # the connection of a client that sends more: checked here, with what was too large in the error
        size, limit = len(data) + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 12, self.nc.max_payload
        if limit and size > limit:
            raise PayloadTooLarge(too_large(subject, data, size, limit))
        try:
            await _retrying(lambda: self.js.publish(subject, data, headers=headers), TRANSIENT, PUBLISH_RETRY_S,
                            0.1, "publish failed, retrying", subject=subject)
        except nats.errors.MaxPayloadError as e:  # a server with a smaller max_payload since we connected
            raise PayloadTooLarge(too_large(subject, data, size, self.nc.max_payload)) from e

    async def dead_letter(self, stage: str, subject: str, data: bytes, reason: str, deliveries: int,
                          campaign_id: str, work_seq: int = 0) -> None:
        """Record a message that can never succeed: on the DLQ stream and as an event memory archives.
        `work_seq` is the message's sequence on the work stream: work sent back from the dead letters is a new
        message with the same bytes, and if it dies again that is a second dead letter, not a duplicate of the
        first (a redelivery of the same message, as after a crash between here and its term, still is)."""
        if len(data) > DLQ_PAYLOAD_MAX:  # a dead letter must itself fit in a message
            reason += f" (payload cut to its first {DLQ_PAYLOAD_MAX} of {len(data)} bytes)"
        dl = pb.DeadLetter(stage=stage, subject=subject, reason=reason, deliveries=deliveries,
                           payload=data[:DLQ_PAYLOAD_MAX], payload_bytes=len(data))
        key = ev.sha256_hex(f"{subject}:{work_seq}:".encode() + data)[:24]
        event = ev.make_event(campaign_id or "unknown", self.name, key, dead_letter=dl)
        await self._publish_retrying(f"{ev.DLQ_PREFIX}.{stage}.{campaign_id or 'unknown'}",
                                     event.SerializeToString(), self._headers(event.id))
        await self.publish(event)

    async def requeue(self, subject: str, data: bytes, msg_id: str) -> None:
        """Put a serialized work message back on its work subject (a dead letter sent back by deadletters.py)."""
        await self._publish_retrying(subject, data, self._headers(msg_id))

    # -- consuming ---------------------------------------------------------------------------------
    async def consume(self, stage: str, handler: Handler, workers: int = 1,
                      stop: asyncio.Event | None = None) -> None:
        """Run `workers` competing pull loops on the stage's durable consumer until `stop` is set."""
        cfg = ConsumerConfig(durable_name=stage, ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s,
                             max_deliver=self.max_deliver, max_ack_pending=1000,
                             filter_subject=f"{ev.WORK_PREFIX}.{stage}.>")
        stop = stop or asyncio.Event()
        # one pull subscription per worker: concurrent fetches on one subscription share its inbox
        subs = [await self.js.pull_subscribe(f"{ev.WORK_PREFIX}.{stage}.>", durable=stage, stream=WORK_STREAM,
                                             config=cfg) for _ in range(workers)]
        try:
            await asyncio.gather(*(self._pull_loop(stage, sub, handler, stop) for sub in subs))
        finally:
            for sub in subs:
                await _quiet_unsubscribe(sub)

    async def _pull_loop(self, stage: str, sub, handler: Handler, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                msgs = await sub.fetch(1, timeout=0.5)
            except (nats.errors.TimeoutError, asyncio.TimeoutError):
                continue
            except nats.errors.ConnectionClosedError:
                return
            except TRANSIENT as e:  # reconnecting: the subscription is restored with the connection
                log.warning("fetch failed, waiting for NATS", stage=stage, error=repr(e))
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await self._handle(stage, msg, handler)

    async def _handle(self, stage: str, msg, handler: Handler) -> None:
        deliveries = msg.metadata.num_delivered
        campaign = msg.subject.rsplit(".", 1)[-1]
        try:
            event = ev.decode_event(msg.data, msg.subject, self.max_event_bytes)
        except ev.BadEvent as e:  # can never succeed: no retry, the reason goes with it
            await self.dead_letter(stage, msg.subject, msg.data, str(e), deliveries, campaign,
                                   msg.metadata.sequence.stream)
            await msg.term()
            return
        t0 = asyncio.get_running_loop().time()
        metrics.taken(stage, event)
        with telemetry.consumer_span(stage, msg.subject, msg.headers, event, **{"kf.deliveries": deliveries}) as span:
            outcome, failed = await self._handle_event(stage, msg, event, deliveries, handler)
            name = "error" if failed else type(outcome).__name__.lower()
            telemetry.mark_outcome(span, name, getattr(outcome, "reason", ""))
        metrics.stage_done(stage, name, asyncio.get_running_loop().time() - t0, ev.candidate_of(event) is not None)

    async def _handle_event(self, stage: str, msg, event: pb.Event, deliveries: int,
                            handler: Handler) -> tuple[Outcome, bool]:
        """Run the handler and settle the message; returns (outcome, whether the handler raised)."""
        token = traceparent.set(telemetry.current_traceparent() or (msg.headers or {}).get("traceparent", ""))
        failed = False
        try:
            outcome = await self._run_through_outages(Delivery(event, msg.subject, deliveries, msg), handler)
        except asyncio.CancelledError:
            await _quiet_nak(msg, 0)
            raise
        except PublishNotPermitted as e:  # the same on every delivery, until the deployment's roles change
            log.error("handler may not publish its result", stage=stage, subject=msg.subject, error=str(e))
            failed = True
            outcome = Term(str(e))
        except PayloadTooLarge as e:  # the same bytes on every delivery: retrying cannot make them fit
            log.error("handler's result is too large to publish", stage=stage, subject=msg.subject, error=str(e))
            failed = True
            outcome = Term(f"{stage}: {e}")
        except HandlerStuck as e:  # logged where it was cancelled, with where it waited
            failed = True
            outcome = self._retry_later(f"handler stuck: {e}", deliveries)
        except Exception as e:  # a bug or an outage in our own code: retry, then dead-letter
            log.exception("handler failed", stage=stage, subject=msg.subject, deliveries=deliveries)
            failed = True
            outcome = self._retry_later(f"handler error: {e!r}", deliveries)
        finally:
            traceparent.reset(token)
        try:
            await self._settle(stage, msg, event, outcome, deliveries)
        except TRANSIENT as e:  # the ack (or nak) was lost with the connection: the server redelivers after
            # ack_wait and the handler, idempotent, publishes nothing new the second time
            log.warning("settling a message failed; it will be redelivered", stage=stage, subject=msg.subject,
                        outcome=type(outcome).__name__, error=repr(e))
        return outcome, failed

    def _retry_later(self, reason: str, deliveries: int) -> Outcome:
        """A failed delivery's fate: again after a doubling delay, or its dead letter on the last delivery."""
        if deliveries >= self.max_deliver:
            return Term(f"{reason} (after {deliveries} deliveries)")
        return Nak(min(30.0, 0.5 * 2 ** deliveries), reason)

    async def _run_through_outages(self, delivery: Delivery, handler: Handler) -> Outcome:
        """Run the handler; while NATS or the claims store is briefly unreachable, run it again in place (it is
        idempotent) instead of spending the message's deliveries on an outage that is not its fault."""
        return await _retrying(lambda: self._run_with_heartbeat(delivery, handler), OUTAGE, OUTAGE_WAIT_S, 0.2,
                               "a dependency is unreachable; retrying the message in place",
                               between=lambda: _quiet_in_progress(delivery), subject=delivery.subject)

    async def _run_with_heartbeat(self, delivery: Delivery, handler: Handler) -> Outcome:
        """Run the handler, telling the server it is in progress every ack_wait/3; past handler_timeout_s it is
        cancelled and HandlerStuck is raised."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(handler(delivery))
        deadline, beat = loop.time() + self.handler_timeout_s, max(0.5, self.ack_wait_s / 3)
        while True:
            try:
                done, _ = await asyncio.wait({task}, timeout=max(0.0, min(beat, deadline - loop.time())))
            except asyncio.CancelledError:
                # the service is stopping: the handler must stop with it, not run on against a closed claims
                # store or bus (its message stays unacked and is delivered again)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise
            if done:
                return task.result()
            if loop.time() >= deadline:
                raise await _cancel_stuck(task, self.handler_timeout_s, delivery.subject)
            await _quiet_in_progress(delivery)

    async def _settle(self, stage: str, msg, event: pb.Event, outcome: Outcome, deliveries: int) -> None:
        if isinstance(outcome, Leave):
            return  # if no newer delivery exists after all, ack_wait redelivers it and the work is redone
        if isinstance(outcome, Ack):
            await msg.ack()
        elif isinstance(outcome, Nak):
            if deliveries >= self.max_deliver:
                await self.dead_letter(stage, msg.subject, msg.data,
                                       f"{outcome.reason} after {deliveries} deliveries (max_deliver)",
                                       deliveries, event.campaign_id, msg.metadata.sequence.stream)
                await msg.term()
            else:
                await msg.nak(delay=outcome.delay_s)
        else:
            await self.dead_letter(stage, msg.subject, msg.data, outcome.reason, deliveries, event.campaign_id,
                                   msg.metadata.sequence.stream)
            await msg.term()

    async def follow(self, durable: str | None, filter_subject: str = f"{ev.EVT_PREFIX}.>",
                     stop: asyncio.Event | None = None,
                     refused: Callable[[object, ev.BadEvent], Awaitable[None]] | None = None,
                     ) -> AsyncIterator[tuple[pb.Event, object]]:
        """Yield (event, msg) from the events stream from its start; the caller acks each msg.

        With a durable name, a restarted follower resumes where it stopped; without, it replays everything.
        A message that is no valid event (events.decode_event: not protobuf, no body, a body of another kind
        than its subject's, ...) is never yielded: it is logged, handed to `refused` (msg, why) where given,
        and term'ed, so that no follower ever folds it and a replay meets it again only to refuse it again.
        """
        cfg = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s,
                             deliver_policy=DeliverPolicy.ALL, filter_subject=filter_subject,
                             max_ack_pending=10000, durable_name=durable,
                             inactive_threshold=None if durable else 300.0)
        # a busy server (or a busy host) can answer the consumer's creation late: that is no reason to end the
        # follower (the planner or memory) for good
        sub = await _retrying(lambda: self.js.pull_subscribe(filter_subject, durable=durable, stream=EVENTS_STREAM,
                                                             config=cfg),
                              TRANSIENT, PUBLISH_RETRY_S, 0.2, "creating the events consumer failed, retrying")
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(64, timeout=0.3)
                except (nats.errors.TimeoutError, asyncio.TimeoutError):
                    continue
                except TRANSIENT as e:
                    log.warning("fetch of events failed, waiting for NATS", error=repr(e))
                    await asyncio.sleep(0.5)
                    continue
                for msg in msgs:
                    try:
                        # the size limit of work (max_event_bytes) is not the events': a dead letter carries a
                        # work message and its reason, so it can be larger than any work message
                        event = ev.decode_event(msg.data, msg.subject, max(self.max_event_bytes, ev.MAX_EVENT_BYTES))
                    except ev.BadEvent as e:
                        log.error("refused an event on the events stream", subject=msg.subject[:200],
                                  seq=msg.metadata.sequence.stream, why=str(e)[:500])
                        if refused is not None:
                            await refused(msg, e)
                        await term_quietly(msg)
                        continue
                    yield event, msg
        finally:
            if not durable:
                await _quiet_unsubscribe(sub)

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
        event = await self._lifecycle(campaign_id, "campaign_finished")
        return event.campaign_finished if event is not None else None

    async def _lifecycle(self, campaign_id: str, kind: str) -> pb.Event | None:
        """The first believable event of `kind` (the planner's start or end of the campaign) on its subject: a
        message there that is no valid event, or not the planner's (kfactory/evidence/trust.py), is passed over, so that
        bytes published on the subject neither start nor end a campaign."""
        from kfactory.evidence import trust

        subject, seq = ev.event_subject(kind, campaign_id), 1
        while True:
            try:
                msg = await self.js.get_msg(EVENTS_STREAM, seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return None
            try:
                event = ev.decode_event(msg.data or b"", subject, max(self.max_event_bytes, ev.MAX_EVENT_BYTES))
            except ev.BadEvent:
                event = None  # not an event at all: the next message on the subject may be the planner's
            if event is not None and not trust.body_flaw(event):
                return event
            seq = msg.seq + 1

    # -- artifacts ---------------------------------------------------------------------------------
    async def put_artifact(self, data: bytes) -> str:
        """Store bytes under their sha256; storing the same bytes twice is a no-op."""
        digest = ev.sha256_hex(data)
        try:
            await self._objects.get_info(digest)
            return digest
        except nats.js.errors.ObjectNotFoundError:
            await self._objects.put(digest, data)
            return digest

    async def get_artifact(self, digest: str) -> bytes:
        """Fetch an artifact by digest; raises ArtifactMissing."""
        try:
            res = await self._objects.get(digest)
        except nats.js.errors.ObjectNotFoundError as e:
            raise ArtifactMissing(digest) from e
        return res.data


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


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether a NATS subject matches a subscription-style pattern: `*` is one token, a final `>` one or more."""
    pt, st = pattern.split("."), subject.split(".")
    for i, tok in enumerate(pt):
        if tok == ">":
            return i == len(pt) - 1 and len(st) > i
        if i >= len(st) or (tok != "*" and tok != st[i]):
            return False
    return len(pt) == len(st)


async def _probe(url: str, timeout_s: float) -> None:
    """Open and close a TCP connection to the first server of the URL (raises OSError/TimeoutError)."""
    from urllib.parse import urlparse

    first = urlparse(url.split(",")[0])
    _, writer = await asyncio.wait_for(asyncio.open_connection(first.hostname or "127.0.0.1", first.port or 4222),
                                       timeout_s)
    writer.close()
    await writer.wait_closed()


async def _retrying(call, errors: tuple, budget_s: float, first_delay: float, what: str, between=None, **log_ctx):
    """await call(), again after a doubling delay (at most 2 s) while it raises one of `errors`, for up to
    budget_s; then the error is raised. `between` (a coroutine function) runs after each wait."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + budget_s, first_delay
    while True:
        try:
            return await call()
        except errors as e:
            if loop.time() + delay > deadline:
                raise
            log.warning(what, error=repr(e), retry_in_s=delay, **log_ctx)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
            if between is not None:
                await between()


async def _cancel_stuck(task: asyncio.Task, limit_s: float, subject: str) -> HandlerStuck:
    """Cancel a handler that ran past its limit; log, and return as the error, the awaits it was suspended in
    (innermost last): a handler that never returns is a missing timeout somewhere, and this names the place."""
    where = await_chain(task)
    task.cancel()
    # a handler that swallows its cancellation is abandoned here, not waited for: the worker must go on
    await asyncio.wait({task}, timeout=5.0)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it again as never retrieved
    log.error("handler stuck: cancelled", subject=subject, limit_s=limit_s, awaiting=where)
    return HandlerStuck(f"it ran past {limit_s:g} s (KFACTORY_HANDLER_TIMEOUT_S) and was cancelled while awaiting "
                        + (" > ".join(where[-3:]) if where else "nothing it could name"))


def await_chain(task: asyncio.Task) -> list[str]:
    """'function (file:line)' for each coroutine a suspended task is awaiting through, outermost first."""
    out, coro = [], task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        out.append(f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


async def ack_quietly(msg) -> None:
    """Ack a message; when the connection is down the ack is lost and the server redelivers the message after
    ack_wait, which an idempotent consumer absorbs (so a lost ack is logged, not raised)."""
    try:
        await msg.ack()
    except TRANSIENT as e:
        log.warning("ack failed; the message will be redelivered", subject=msg.subject, error=repr(e))


async def term_quietly(msg) -> None:
    """Term a message; when the connection is down the term is lost and the server redelivers the message after
    ack_wait, to be refused again (so a lost term is logged, not raised)."""
    try:
        await msg.term()
    except TRANSIENT as e:
        log.warning("term failed; the message will be redelivered", subject=msg.subject, error=repr(e))


async def _quiet_in_progress(delivery: Delivery) -> None:
    try:
        await delivery.in_progress()
    except TRANSIENT as e:  # NATS away: if it stays away past ack_wait the message is redelivered (idempotent)
        log.warning("heartbeat failed", subject=delivery.subject, error=repr(e))


async def _handshake(url: str, user: str | None, password: str | None, timeout_s: float) -> None:
    """One connect without retries: a server that answers but refuses our CONNECT (no or wrong credentials in
    the secure profile) is told apart from one that cannot be reached, instead of being retried for ever."""
    try:
        nc = await asyncio.wait_for(nats.connect(url, user=user, password=password, connect_timeout=timeout_s,
                                                 allow_reconnect=False, max_reconnect_attempts=0,
                                                 error_cb=_ignore_error), timeout_s * 2)
    except (OSError, asyncio.TimeoutError, nats.errors.TimeoutError) as e:
        raise _unreachable(url, e) from e
    except nats.errors.Error as e:  # reachable (the probe passed) yet refused at the protocol level
        who = f"user {user!r}" if user else "no user"
        raise BusUnavailable(f"NATS at {url} refused the connection ({who}): set KFACTORY_NATS_USER and "
                             "KFACTORY_NATS_PASSWORD to this service's credentials") from e
    await nc.close()


def _unreachable(url: str, e: BaseException) -> BusUnavailable:
    return BusUnavailable(f"cannot reach NATS at {url}: {e!r}; start nats-server -js or set "
                          "KFACTORY_NATS_URL / --nats-url")


async def _ignore_error(e: Exception) -> None:
    """The handshake's refusals are raised by connect(); the callback need not print them too."""


async def _quiet_nak(msg, delay: float) -> None:
    try:
        await msg.nak(delay=delay)
    except nats.errors.Error as e:  # connection gone: the server redelivers after ack_wait anyway
        log.warning("nak failed", error=repr(e))


async def _quiet_unsubscribe(sub) -> None:
    try:
        await sub.unsubscribe()
    except nats.errors.Error as e:
        log.debug("unsubscribe failed", error=repr(e))


async def _log_error(e: Exception) -> None:
    log.warning("nats error", error=repr(e))


async def _log_reconnect() -> None:
    log.info("nats reconnected")


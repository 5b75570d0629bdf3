"""The bus on NATS JetStream: streams with work-queue and limits retention, durable pull consumers, and the
artifact object store. What every deployment runs (one process, several, or Kubernetes); the transport behind
the interface in kfactory/bus/base.py."""
from __future__ import annotations

import asyncio
from functools import partial
from typing import AsyncGenerator

import nats
import nats.errors
import nats.js.errors
from nats.js.api import (AckPolicy, ConsumerConfig, DeliverPolicy, RetentionPolicy, StorageType,
                         StreamConfig)

from kfactory.bus import consume as consuming
from kfactory.bus import events as ev
from kfactory.bus.artifacts import ObjectStoreArtifacts
from kfactory.bus.base import Bus, Refused, Stored
from kfactory.bus.errors import TRANSIENT, BusUnavailable, PayloadTooLarge
from kfactory.bus.outcomes import Handler, Message, log
from kfactory.bus.topology import DLQ_STREAM, EVENTS_STREAM, WORK_STREAM
from kfactory.v1 import events_pb2 as pb

DUPLICATE_WINDOW_S = 600.0
#: how long a publish keeps retrying through an outage before it gives up (raises)
PUBLISH_RETRY_S = 60.0
#: how long a read of stored messages (stored()) keeps retrying a get through an outage before it gives up
READ_RETRY_S = 10.0
#: the JetStream API's error code for "no message found" (a subject with nothing at or after the sequence); a
#: missing stream is another 404, 10059
NO_MESSAGE = 10037


class NatsBus(Bus):
    """A connection to NATS JetStream with kfactory's streams, consumers and artifact bucket."""

    def __init__(self, nc, name: str, ack_wait_s: float = 30.0, max_deliver: int = 5):
        super().__init__(name, ack_wait_s, max_deliver)
        self.nc = nc
        self.js = nc.jetstream()
        self._artifacts: ObjectStoreArtifacts | None = None
        #: copies of each stream and of the artifact bucket when this bus creates them (3 on a 3-server cluster)
        self.replicas = 1

    @classmethod
    async def connect(cls, url: str, name: str, *, user: str | None = None, password: str | None = None,
                      ack_wait_s: float = 30.0, max_deliver: int = 5, timeout_s: float = 5.0,
                      replicas: int = 1) -> NatsBus:
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

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    def max_payload(self) -> int:
        return self.nc.max_payload

    async def ensure(self) -> None:
        await self._stream(StreamConfig(name=WORK_STREAM, subjects=[f"{ev.WORK_PREFIX}.>"],
                                        retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE,
                                        duplicate_window=DUPLICATE_WINDOW_S, num_replicas=self.replicas))
        await self._stream(StreamConfig(name=EVENTS_STREAM, subjects=[f"{ev.EVT_PREFIX}.>"],
                                        retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                                        duplicate_window=DUPLICATE_WINDOW_S, num_replicas=self.replicas))
        await self._stream(StreamConfig(name=DLQ_STREAM, subjects=[f"{ev.DLQ_PREFIX}.>"],
                                        retention=RetentionPolicy.LIMITS, storage=StorageType.FILE,
                                        num_replicas=self.replicas))
        self._artifacts = await ObjectStoreArtifacts.open(self.js, self.replicas)

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
            try:
                await self.nc.close()
            except (ConnectionError, nats.errors.Error) as e:
                # the server went away (a service stopped during an outage): the connection is gone either way,
                # and what the flush above could not send is lost with it
                log.warning("closing the NATS connection failed: the server is unreachable", error=repr(e))

    async def _publish_raw(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Publish, retrying through a NATS outage for up to PUBLISH_RETRY_S: the Nats-Msg-Id header makes a
        retry of a publish that did reach the server a no-op, so nothing is stored twice."""
        try:
            await consuming.retrying(lambda: self.js.publish(subject, data, headers=headers), TRANSIENT,
                                     PUBLISH_RETRY_S, 0.1, "publish failed, retrying", subject=subject)
        except nats.errors.MaxPayloadError as e:  # a server with a smaller max_payload since we connected
            from kfactory.bus.base import too_large

            size = len(data) + sum(len(k) + len(v) + 4 for k, v in headers.items()) + 12
            raise PayloadTooLarge(too_large(subject, data, size, self.nc.max_payload)) from e

    # -- reading streams -----------------------------------------------------------------------------
    async def stored(self, stream: str, subject: str) -> list[Stored]:
        # the stream's messages got one by one (STREAM.MSG.GET, the next on the subject, wildcards too): the
        # server says where they end. A consumer's fetch took 0.5 s without an answer for the end, which a busy
        # server or a paused client could fake (a list of dead letters came back short), its acks took work off
        # a work-queue stream, and a work-queue stream refuses a second consumer on the same subjects. About
        # 0.7 ms a message locally; the lists read here (dead letters, resend requests) are short, and no longer
        # wait 0.5 s at their end. The walk stops at the stream's last message when it began (a stream that keeps
        # growing would not end it); each get rides out a brief outage as a publish does, then BusUnavailable.
        self._require(f"$JS.API.STREAM.MSG.GET.{stream}")
        out: list[Stored] = []
        try:
            last = await consuming.retrying(lambda: self.last_seq(stream), TRANSIENT, READ_RETRY_S, 0.1,
                                            "reading the stream's state failed, retrying", stream=stream)
            seq = 1
            while seq <= last:
                found = await consuming.retrying(partial(self._next_on_subject, stream, subject, seq), TRANSIENT,
                                                 READ_RETRY_S, 0.1, "reading a stored message failed, retrying",
                                                 stream=stream)
                if found is None or found.seq > last:
                    break
                out.append(found)
                seq = found.seq + 1
        except TRANSIENT as e:
            raise BusUnavailable(f"NATS did not answer while reading stream {stream} ({subject}): {e!r}; is it "
                                 "running? ask again once it answers") from e
        return out

    async def last_seq(self, stream: str) -> int:
        return (await self.js.stream_info(stream)).state.last_seq

    async def _next_on_subject(self, stream: str, subject: str, seq: int) -> Stored | None:
        try:
            msg = await self.js.get_msg(stream, seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError as e:
            if e.err_code != NO_MESSAGE:   # the stream itself is missing: not an empty subject
                raise
            return None
        return Stored(msg.seq, msg.subject or subject, msg.data or b"")

    async def _get(self, stream: str, seq: int) -> bytes | None:
        try:
            return (await self.js.get_msg(stream, seq)).data
        except nats.js.errors.NotFoundError:
            return None

    async def _delete(self, stream: str, seq: int) -> None:
        try:
            await self.js.delete_msg(stream, seq)
        except nats.js.errors.APIError:
            # the server refuses to delete a message that is not there (JSStreamMsgDeleteFailedF); gone is what
            # was wanted, as after an earlier attempt that deleted it once it had queued the same work
            if await self._get(stream, seq) is not None:
                raise

    # -- consuming ---------------------------------------------------------------------------------
    async def consume(self, stage: str, handler: Handler, workers: int = 1,
                      stop: asyncio.Event | None = None) -> None:
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
                await consuming.handle(self, stage, msg, handler)

    async def follow(self, durable: str | None, filter_subject: str = f"{ev.EVT_PREFIX}.>",
                     stop: asyncio.Event | None = None, refused: Refused | None = None,
                     ) -> AsyncGenerator[tuple[pb.Event, Message], None]:
        cfg = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s,
                             deliver_policy=DeliverPolicy.ALL, filter_subject=filter_subject,
                             max_ack_pending=10000, durable_name=durable,
                             inactive_threshold=None if durable else 300.0)
        # a busy server (or a busy host) can answer the consumer's creation late: that is no reason to end the
        # follower (the planner or memory) for good
        sub = await consuming.retrying(
            lambda: self.js.pull_subscribe(filter_subject, durable=durable, stream=EVENTS_STREAM, config=cfg),
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
                    if (event := await consuming.decoded(self, msg, refused)) is not None:
                        yield event, msg
        finally:
            if not durable:
                await _quiet_unsubscribe(sub)

    # -- artifacts ---------------------------------------------------------------------------------
    async def put_artifact(self, data: bytes) -> str:
        assert self._artifacts is not None, "ensure() opens the artifact bucket"
        return await self._artifacts.put(data)

    async def get_artifact(self, digest: str) -> bytes:
        assert self._artifacts is not None, "ensure() opens the artifact bucket"
        return await self._artifacts.get(digest)


async def _probe(url: str, timeout_s: float) -> None:
    """Open and close a TCP connection to the first server of the URL (raises OSError/TimeoutError)."""
    from urllib.parse import urlparse

    first = urlparse(url.split(",")[0])
    _, writer = await asyncio.wait_for(asyncio.open_connection(first.hostname or "127.0.0.1", first.port or 4222),
                                       timeout_s)
    writer.close()
    await writer.wait_closed()


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


async def _quiet_unsubscribe(sub) -> None:
    try:
        await sub.unsubscribe()
    except nats.errors.Error as e:
        log.debug("unsubscribe failed", error=repr(e))


async def _log_error(e: Exception) -> None:
    log.warning("nats error", error=repr(e))


async def _log_reconnect() -> None:
    log.info("nats reconnected")

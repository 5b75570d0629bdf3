"""The bus against a real nats-server: fates of messages, dedup, dead letters, artifacts."""
from __future__ import annotations

import asyncio

import pytest

from kfactory.bus import events as ev
from kfactory.bus.errors import ArtifactMissing, BusUnavailable, PublishNotPermitted
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.outcomes import Ack, Nak, Term
from kfactory.v1 import events_pb2 as pb

from bus_helpers import consume_until as _run, work as _work


async def _connect(url: str, **kw) -> NatsBus:
    return await NatsBus.connect(url, "test", **kw)


async def _events(bus: NatsBus, cid: str) -> list[pb.Event]:
    out = []
    stop = asyncio.Event()

    async def collect():
        async for e, msg in bus.follow(None, ev.event_subject("*", cid), stop=stop):
            out.append(e)
            await msg.ack()

    task = asyncio.create_task(collect())
    await asyncio.sleep(1.0)
    stop.set()
    await task
    return out


async def test_unreachable_nats_is_a_clear_error():
    with pytest.raises(BusUnavailable, match="cannot reach NATS at nats://127.0.0.1:1"):
        await NatsBus.connect("nats://127.0.0.1:1", "test", timeout_s=1)


async def test_ack_delivers_once_and_competing_consumers_share(nats_url):
    a, b = await _connect(nats_url), await _connect(nats_url)
    for i in range(20):
        await a.send_work("coder", _work("c1", f"p{i}"))
    seen: list[str] = []

    async def handler(d):
        seen.append(d.event.point_proposed.point_id)
        return Ack()

    stop = asyncio.Event()
    tasks = [asyncio.create_task(x.consume("coder", handler, 2, stop)) for x in (a, b)]
    async with asyncio.timeout(20):
        while len(seen) < 20:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.gather(*tasks)
    assert sorted(seen) == sorted(f"p{i}" for i in range(20))  # each exactly once
    await a.close(); await b.close()


async def test_duplicate_publish_is_dropped(nats_url):
    bus = await _connect(nats_url)
    e = _work("c2", "same")
    await bus.send_work("coder", e)
    await bus.send_work("coder", e)  # a retried publish: same Nats-Msg-Id
    seen = []

    async def handler(d):
        seen.append(d.event.id)
        return Ack()

    await _run(bus, "coder", handler, lambda: len(seen) >= 1)
    await asyncio.sleep(0)
    assert seen == [e.id]
    await bus.close()


async def test_nak_redelivers_then_dead_letters_at_max_deliver(nats_url):
    bus = await _connect(nats_url, max_deliver=3)
    await bus.send_work("compiler", _work("c3", "busy"))
    deliveries = []

    async def handler(d):
        deliveries.append(d.deliveries)
        return Nak(0.05, "waiting for the device lease")

    await _run(bus, "compiler", handler, lambda: len(deliveries) >= 3)
    events = await _events(bus, "c3")
    assert deliveries == [1, 2, 3]
    dead = [e.dead_letter for e in events if e.HasField("dead_letter")]
    assert len(dead) == 1 and dead[0].stage == "compiler" and dead[0].deliveries == 3
    assert dead[0].reason == "waiting for the device lease after 3 deliveries (max_deliver)"
    await bus.close()


async def test_term_dead_letters_with_the_reason(nats_url):
    bus = await _connect(nats_url)
    await bus.send_work("verifier", _work("c4", "poison"))
    calls = []

    async def handler(d):
        calls.append(1)
        return Term("can never succeed: unknown campaign")

    await _run(bus, "verifier", handler, lambda: calls)
    events = await _events(bus, "c4")
    dead = [e.dead_letter for e in events if e.HasField("dead_letter")]
    assert [d.reason for d in dead] == ["can never succeed: unknown campaign"]
    assert pb.Event.FromString(dead[0].payload).point_proposed.point_id == "poison"
    await bus.close()


async def test_a_result_the_role_may_not_publish_is_refused_at_once_and_dead_lettered(nats_url):
    """A verifier (by its permissions) whose handler publishes a measurement: refused before it reaches the
    server, and the work message is dead-lettered on its first delivery with the subject named."""
    from kfactory.platform.security import publish_subjects
    bus = await _connect(nats_url)
    await bus.send_work("verifier", _work("c6", "overreach"))
    bus.may_publish = publish_subjects("verifier")
    calls = []

    async def handler(d):
        calls.append(d.deliveries)
        await bus.publish(ev.make_event("c6", "test", "m", measured=pb.Measured(score_s=1.0)))
        return Ack()

    await _run(bus, "verifier", handler, lambda: calls)
    with pytest.raises(PublishNotPermitted, match="may not publish to kf.v1.evt.measured.c6"):
        await bus.publish(ev.make_event("c6", "test", "m2", measured=pb.Measured(score_s=2.0)))
    await bus.publish(ev.make_event("c6", "test", "v", verified=pb.Verified(seconds=1.0)))  # its own kind
    bus.may_publish = None
    events = await _events(bus, "c6")
    dead = [e.dead_letter for e in events if e.HasField("dead_letter")]
    assert calls == [1] and len(dead) == 1 and dead[0].deliveries == 1
    assert "may not publish to kf.v1.evt.measured.c6" in dead[0].reason
    assert [e.WhichOneof("body") for e in events if not e.HasField("dead_letter")] == ["verified"]
    await bus.close()


async def test_malformed_message_is_dead_lettered(nats_url):
    bus = await _connect(nats_url)
    await bus.js.publish(ev.work_subject("coder", "c5"), b"\xff\xff not protobuf")
    called = []

    async def handler(d):
        called.append(d)
        return Ack()

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("coder", handler, 1, stop))
    await asyncio.sleep(1.0)
    stop.set()
    await task
    events = await _events(bus, "c5")
    assert not called
    assert any(e.HasField("dead_letter") and "malformed" in e.dead_letter.reason for e in events)
    await bus.close()


async def test_handler_exception_is_retried_not_lost(nats_url):
    bus = await _connect(nats_url, max_deliver=5)
    await bus.send_work("coder", _work("c6", "flaky"))
    attempts = []

    async def handler(d):
        attempts.append(d.deliveries)
        if len(attempts) < 2:
            raise RuntimeError("transient bug")
        return Ack()

    await _run(bus, "coder", handler, lambda: len(attempts) >= 2)
    assert attempts == [1, 2]
    await bus.close()


async def test_long_work_heartbeats_past_ack_wait(nats_url):
    bus = await _connect(nats_url, ack_wait_s=1.0)
    await bus.send_work("benchmarker", _work("c7", "slow"))
    calls = []

    async def handler(d):
        calls.append(d.deliveries)
        await asyncio.sleep(3.0)  # three ack_waits: in_progress() keeps it ours
        return Ack()

    await _run(bus, "benchmarker", handler, lambda: calls)
    await asyncio.sleep(3.5)
    assert calls == [1]
    await bus.close()


async def _never_returns() -> None:
    await asyncio.Event().wait()  # an await with no timeout on something that never happens


async def test_a_stuck_handler_is_cancelled_named_and_retried_and_the_worker_goes_on(nats_url):
    """A handler that never returns would keep its message (and its worker) for ever by heartbeats: past
    handler_timeout_s it is cancelled, the await it hung in is named, the message is retried and, at
    max_deliver, dead-lettered with that reason; the worker meanwhile takes the next message."""
    bus = await _connect(nats_url, max_deliver=2, ack_wait_s=1.0)
    bus.handler_timeout_s = 1.0
    await bus.send_work("coder", _work("c8", "stuck"))
    await bus.send_work("coder", _work("c8", "fine"))
    calls, cancelled = [], []

    async def handler(d):
        key = d.event.point_proposed.point_id
        calls.append((key, d.deliveries))
        if key == "fine":
            return Ack()
        try:
            await _never_returns()
        except asyncio.CancelledError:
            cancelled.append(d.deliveries)
            raise

    await _run(bus, "coder", handler, lambda: len(cancelled) >= 2)
    events = await _events(bus, "c8")
    assert [c for c in calls if c[0] == "stuck"] == [("stuck", 1), ("stuck", 2)] and cancelled == [1, 2]
    assert ("fine", 1) in calls and calls.index(("fine", 1)) < calls.index(("stuck", 2))
    dead = [e.dead_letter for e in events if e.HasField("dead_letter")]
    assert len(dead) == 1 and dead[0].deliveries == 2
    assert dead[0].reason.startswith("handler stuck: it ran past 1 s (KFACTORY_HANDLER_TIMEOUT_S) and was "
                                     "cancelled while awaiting ")
    assert " > _never_returns (" in dead[0].reason and " > Event.wait (" in dead[0].reason
    assert dead[0].reason.endswith("(after 2 deliveries)")
    await bus.close()


async def test_artifacts_by_digest(nats_url):
    bus = await _connect(nats_url)
    data = bytes(range(256)) * 5000
    digest = await bus.put_artifact(data)
    assert digest == ev.sha256_hex(data)
    assert await bus.put_artifact(data) == digest
    assert await bus.get_artifact(digest) == data
    with pytest.raises(ArtifactMissing):
        await bus.get_artifact("0" * 64)
    await bus.close()


async def test_trace_context_travels_in_headers(nats_url):
    from kfactory.bus.base import traceparent

    bus = await _connect(nats_url)
    token = traceparent.set("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")
    await bus.send_work("coder", _work("c8", "traced"))
    traceparent.reset(token)
    seen = []

    async def handler(d):
        seen.append(traceparent.get())
        return Ack()

    await _run(bus, "coder", handler, lambda: seen)
    assert seen[0].startswith("00-" + "ab" * 16)
    await bus.close()

"""Contract suite for buses: every test runs on the in-memory bus and on NATS JetStream (a real nats-server).

What the services rely on: work delivered once to one of competing consumers, deduplicated publishes, the fate of
every outcome (ack, nak with delay, term, leave), redelivery after ack_wait, dead letters after max_deliver, the
events stream replayed from its start (and resumed by a durable follower), a campaign's start read from it, the
artifact store, and the checks before publishing (permissions, topology, size). A new bus implementation joins
by adding its name to tests/conftest.py connect_bus.
"""
from __future__ import annotations

import asyncio

import pytest

from kfactory.bus import events as ev
from kfactory.bus.errors import ArtifactMissing, NotInTopology, PayloadTooLarge, PublishNotPermitted
from kfactory.bus.outcomes import Ack, Leave, Nak, Term
from kfactory.bus.topology import DLQ_STREAM, EVENTS_STREAM, WORK_STREAM
from kfactory.v1 import events_pb2 as pb

from bus_helpers import consume_until as _run, events_until, work as _work


def _dead(events: list[pb.Event]) -> list[pb.DeadLetter]:
    return [e.dead_letter for e in events if e.HasField("dead_letter")]


async def _dead_letters(bus, cid: str, n: int = 1) -> list[pb.DeadLetter]:
    return _dead(await events_until(bus, cid, lambda evs: len(_dead(evs)) >= n))


async def test_ack_delivers_once_and_competing_consumers_share(connect_bus):
    a, b = await connect_bus("a"), await connect_bus("b")
    for i in range(20):
        await a.send_work("coder", _work("c1", f"p{i}"))
    seen: list[str] = []

    async def handler(d):
        seen.append(d.event.point_proposed.point_id)
        await asyncio.sleep(0.01)
        return Ack()

    stop = asyncio.Event()
    tasks = [asyncio.create_task(x.consume("coder", handler, 2, stop)) for x in (a, b)]
    async with asyncio.timeout(20):
        while len(seen) < 20:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*tasks)
    assert sorted(seen) == sorted(f"p{i}" for i in range(20))  # each exactly once


async def test_duplicate_publish_is_dropped(connect_bus):
    bus = await connect_bus()
    e = _work("c2", "same")
    await bus.send_work("coder", e)
    await bus.send_work("coder", e)  # a retried publish: same Nats-Msg-Id
    await bus.publish(ev.make_event("c2", "test", "x", verified=pb.Verified(seconds=1.0)))
    await bus.publish(ev.make_event("c2", "test", "x", verified=pb.Verified(seconds=1.0)))
    seen = []

    async def handler(d):
        seen.append(d.event.id)
        return Ack()

    await _run(bus, "coder", handler, lambda: len(seen) >= 1)
    await _run(bus, "coder", handler, lambda: True)  # one more look: nothing else comes
    assert seen == [e.id]
    assert await bus.last_seq(EVENTS_STREAM) == 1


async def test_nak_waits_its_delay_then_dead_letters_at_max_deliver(connect_bus):
    bus = await connect_bus(max_deliver=3)
    await bus.send_work("compiler", _work("c3", "busy"))
    deliveries, times = [], []

    async def handler(d):
        deliveries.append(d.deliveries)
        times.append(asyncio.get_running_loop().time())
        return Nak(0.3, "waiting for the device lease")

    await _run(bus, "compiler", handler, lambda: len(deliveries) >= 3)
    dead = await _dead_letters(bus, "c3")
    assert deliveries == [1, 2, 3]
    assert all(b - a >= 0.25 for a, b in zip(times, times[1:]))  # not before the nak's delay
    assert len(dead) == 1 and dead[0].stage == "compiler" and dead[0].deliveries == 3
    assert dead[0].reason == "waiting for the device lease after 3 deliveries (max_deliver)"
    assert dead[0].cause == pb.DELIVERIES_EXHAUSTED


async def test_term_dead_letters_with_the_reason_and_the_dlq_keeps_it(connect_bus):
    bus = await connect_bus()
    await bus.send_work("verifier", _work("c4", "poison"))
    calls = []

    async def handler(d):
        calls.append(1)
        return Term("can never succeed: unknown campaign", pb.UNKNOWN_CAMPAIGN)

    await _run(bus, "verifier", handler, lambda: calls)
    dead = await _dead_letters(bus, "c4")
    assert [(d.reason, d.cause) for d in dead] == [("can never succeed: unknown campaign", pb.UNKNOWN_CAMPAIGN)]
    assert pb.Event.FromString(dead[0].payload).point_proposed.point_id == "poison"
    stored = await bus.stored(DLQ_STREAM, f"{ev.DLQ_PREFIX}.*.c4")
    assert len(stored) == 1 and stored[0].subject == f"{ev.DLQ_PREFIX}.verifier.c4"
    assert await bus.get_dead_letter(stored[0].seq) == stored[0].data
    await bus.delete_dead_letter(stored[0].seq)
    await bus.delete_dead_letter(stored[0].seq)  # gone stays gone
    assert await bus.get_dead_letter(stored[0].seq) is None
    assert await bus.stored(DLQ_STREAM, f"{ev.DLQ_PREFIX}.>") == []


async def test_an_unsettled_delivery_comes_again_after_ack_wait(connect_bus):
    """Leave (a stale holder's delivery) neither acks nor naks: ack_wait runs out and the message comes again."""
    bus = await connect_bus(ack_wait_s=1.0)
    await bus.send_work("coder", _work("c9", "left"))
    calls = []

    async def handler(d):
        calls.append((d.deliveries, asyncio.get_running_loop().time()))
        return Leave() if d.deliveries == 1 else Ack()

    await _run(bus, "coder", handler, lambda: len(calls) >= 2)
    assert [c[0] for c in calls] == [1, 2] and calls[1][1] - calls[0][1] >= 0.9


async def test_a_result_the_role_may_not_publish_is_refused_at_once_and_dead_lettered(connect_bus):
    """A verifier (by its permissions) whose handler publishes a measurement: refused before it reaches the
    server, and the work message is dead-lettered on its first delivery with the subject named."""
    from kfactory.platform.security import publish_subjects
    bus = await connect_bus()
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
    events = await events_until(bus, "c6", lambda evs: len(evs) >= 2)
    dead = _dead(events)
    assert calls == [1] and len(dead) == 1 and dead[0].deliveries == 1
    assert "may not publish to kf.v1.evt.measured.c6" in dead[0].reason
    assert [e.WhichOneof("body") for e in events if not e.HasField("dead_letter")] == ["verified"]


async def test_work_off_the_topology_is_refused_and_dead_lettered_at_once(connect_bus):
    """A verifier sends work only to the benchmarker (kfactory/bus/topology.py ROLES): work for the coder is a
    wiring bug, refused before it is sent, and a handler making it has its message dead-lettered at once."""
    bus = await connect_bus()
    await bus.send_work("verifier", _work("c10", "v"))
    bus.roles = ("verifier",)
    with pytest.raises(NotInTopology, match="verifier does not queue work for stage 'coder'"):
        await bus.send_work("coder", _work("c10", "x"))
    calls = []

    async def handler(d):
        calls.append(d.deliveries)
        await bus.send_work("benchmarker", d.event)  # on its route
        await bus.send_work("compiler", d.event)     # off it
        return Ack()

    await _run(bus, "verifier", handler, lambda: calls)
    dead = await _dead_letters(bus, "c10")
    assert calls == [1] and "does not queue work for stage 'compiler'" in dead[0].reason
    assert len(await bus.stored(WORK_STREAM, ev.work_subject("benchmarker", "c10"))) == 1


async def test_stored_lists_a_stream_as_often_as_asked_and_takes_nothing_from_it(connect_bus):
    """stored() on NATS read through a consumer: it ended at its first 0.5 s without an answer (a paused client
    got a short list of dead letters), its acks took work off the work-queue stream, and a second read there
    was refused while the first one's consumer lingered. Now: every message, twice the same, and the work it
    listed is still delivered."""
    bus = await connect_bus()
    for i in range(3):
        await bus.send_work("benchmarker", _work("c11", f"p{i}"))
    subject = ev.work_subject("benchmarker", "c11")
    first = await bus.stored(WORK_STREAM, subject)
    assert [m.subject for m in first] == [subject] * 3 and await bus.stored(WORK_STREAM, subject) == first
    assert [pb.Event.FromString(m.data).point_proposed.point_id for m in first] == ["p0", "p1", "p2"]
    got = []

    async def handler(d):
        got.append(d.event.point_proposed.point_id)
        return Ack()
    await _run(bus, "benchmarker", handler, lambda: len(got) >= 3)
    assert sorted(got) == ["p0", "p1", "p2"]


async def test_malformed_message_is_dead_lettered(connect_bus):
    bus = await connect_bus()
    await bus._publish_raw(ev.work_subject("coder", "c5"), b"\xff\xff not protobuf", {})
    called = []

    async def handler(d):
        called.append(d)
        return Ack()

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("coder", handler, 1, stop))
    dead = await _dead_letters(bus, "c5")
    stop.set()
    await task
    assert not called and "malformed" in dead[0].reason


async def test_handler_exception_is_retried_not_lost(connect_bus):
    bus = await connect_bus(max_deliver=5)
    await bus.send_work("coder", _work("c6", "flaky"))
    attempts = []

    async def handler(d):
        attempts.append(d.deliveries)
        if len(attempts) < 2:
            raise RuntimeError("transient bug")
        return Ack()

    await _run(bus, "coder", handler, lambda: len(attempts) >= 2)
    assert attempts == [1, 2]


async def test_long_work_heartbeats_past_ack_wait(connect_bus):
    """A handler running longer than ack_wait keeps its message by heartbeats (in_progress every
    max(0.5, ack_wait/3), kfactory/bus/consume.py): it is not delivered again, not even to an idle competing worker.

    Two workers, because with one a redelivery would wait for the busy worker and be settled by its ack. ack_wait is
    2 s, so a redelivery needs the test to be paused for over 1.3 s between two heartbeats (0.67 s apart); the
    handler runs 1.5 ack_waits, so without heartbeats its message would come again while it runs."""
    ack_wait = 2.0
    bus = await connect_bus(ack_wait_s=ack_wait)
    await bus.send_work("benchmarker", _work("c7", "slow"))
    calls, done = [], []

    async def handler(d):
        calls.append(d.deliveries)
        await asyncio.sleep(ack_wait * 1.5)
        done.append(d.deliveries)
        return Ack()

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("benchmarker", handler, 2, stop))
    try:
        async with asyncio.timeout(20):
            while not done:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert calls == [1] and done == [1]


async def _never_returns() -> None:
    await asyncio.Event().wait()  # an await with no timeout on something that never happens


async def test_a_stuck_handler_is_cancelled_named_and_retried_and_the_worker_goes_on(connect_bus):
    """A handler that never returns would keep its message (and its worker) for ever by heartbeats: past
    handler_timeout_s it is cancelled, the await it hung in is named, the message is retried and, at
    max_deliver, dead-lettered with that reason; the worker meanwhile takes the next message."""
    # ack_wait longer than the handler's time limit: the first delivery ends by the limit (and its nak), not by
    # ack_wait running out between two heartbeats (0.67 s apart) while the test is paused
    bus = await connect_bus(max_deliver=2, ack_wait_s=2.0)
    bus.handler_timeout_s = 1.0
    await bus.send_work("coder", _work("c8", "stuck"))
    await bus.send_work("coder", _work("c8", "fine"))
    calls, cancelled, cancelled_before_fine = [], [], []

    async def handler(d):
        key = d.event.point_proposed.point_id
        calls.append((key, d.deliveries))
        if key == "fine":
            cancelled_before_fine.append(len(cancelled))
            return Ack()
        try:
            await _never_returns()
        except asyncio.CancelledError:
            cancelled.append(d.deliveries)
            raise

    # "fine" usually comes between the two deliveries of "stuck" (the nak delays the second by 1 s), but only by
    # timing: what the single worker guarantees is that it takes "fine" at all, so wait for both
    await _run(bus, "coder", handler, lambda: len(cancelled) >= 2 and ("fine", 1) in calls)
    dead = await _dead_letters(bus, "c8")
    assert [c for c in calls if c[0] == "stuck"] == [("stuck", 1), ("stuck", 2)] and cancelled == [1, 2]
    assert [c for c in calls if c[0] == "fine"] == [("fine", 1)]
    assert calls[0] == ("stuck", 1) and cancelled_before_fine[0] >= 1  # the one worker was freed by the cancel
    assert len(dead) == 1 and dead[0].deliveries == 2
    assert dead[0].reason.startswith("handler stuck: it ran past 1 s (KFACTORY_HANDLER_TIMEOUT_S) and was "
                                     "cancelled while awaiting ")
    assert " > _never_returns (" in dead[0].reason and " > Event.wait (" in dead[0].reason
    assert dead[0].reason.endswith("(after 2 deliveries)") and dead[0].cause == pb.DELIVERIES_EXHAUSTED


async def test_artifacts_by_digest(connect_bus):
    bus, other = await connect_bus(), await connect_bus("other")
    data = bytes(range(256)) * 5000
    digest = await bus.put_artifact(data)
    assert digest == ev.sha256_hex(data)
    assert await bus.put_artifact(data) == digest
    assert await other.get_artifact(digest) == data  # another service of the same deployment reads it
    with pytest.raises(ArtifactMissing):
        await bus.get_artifact("0" * 64)


async def test_trace_context_travels_in_headers(connect_bus):
    from kfactory.bus.base import traceparent

    bus = await connect_bus()
    token = traceparent.set("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01")
    await bus.send_work("coder", _work("c8", "traced"))
    traceparent.reset(token)
    seen = []

    async def handler(d):
        seen.append(traceparent.get())
        return Ack()

    await _run(bus, "coder", handler, lambda: seen)
    assert seen[0].startswith("00-" + "ab" * 16)


def _verified(cid: str, key: str) -> pb.Event:
    return ev.make_event(cid, "verifier", key, verified=pb.Verified(seconds=1.0))


async def test_events_replay_from_the_start_and_a_durable_follower_resumes(connect_bus):
    bus = await connect_bus()
    for i in range(2):
        await bus.publish(_verified("e1", f"k{i}"))

    async def read(durable: str | None, n: int) -> list[str]:
        """The first `n` events a follower is handed (each acked; none other is, so none is left pending)."""
        out, stop = [], asyncio.Event()
        async with asyncio.timeout(10):
            async for event, msg in bus.follow(durable, stop=stop):
                out.append(event.id)
                await msg.ack()
                if len(out) >= n:
                    stop.set()
        return out

    assert await read("archive", 2) == ["e1:verified:k0", "e1:verified:k1"]
    for i in range(2, 4):
        await bus.publish(_verified("e1", f"k{i}"))
    assert await read("archive", 2) == ["e1:verified:k2", "e1:verified:k3"]  # where it stopped
    assert await read(None, 4) == [f"e1:verified:k{i}" for i in range(4)]  # a replay: all of it, in order
    assert await bus.last_seq(EVENTS_STREAM) == 4


async def test_a_follower_refuses_what_is_no_event(connect_bus):
    bus = await connect_bus()
    await bus._publish_raw(ev.event_subject("verified", "e2"), b"\xff not an event", {})
    await bus.publish(_verified("e2", "ok"))
    refused = []

    async def refuse(msg, why):
        refused.append(str(why))

    stop, got = asyncio.Event(), []
    async with asyncio.timeout(10):
        async for event, msg in bus.follow(None, ev.event_subject("*", "e2"), stop=stop, refused=refuse):
            got.append(event.id)
            await msg.ack()
            stop.set()
    assert got == ["e2:verified:ok"] and len(refused) == 1 and "malformed" in refused[0]


async def test_a_campaign_starts_only_with_the_planners_start_event(connect_bus):
    bus = await connect_bus()
    assert not await bus.campaign_started("s1")
    await bus._publish_raw(ev.event_subject("campaign_started", "s1"), b"\xff forged", {})
    forged = ev.make_event("s1", "coder", "forged", campaign_started=pb.CampaignStarted())  # not the planner's
    await bus.publish(forged)
    assert not await bus.campaign_started("s1")
    await bus.publish(ev.make_event("s1", "planner", "start", campaign_started=pb.CampaignStarted()))
    assert await bus.campaign_started("s1")
    assert await bus.campaign_finished("s1") is None


async def test_a_message_over_max_payload_is_refused_with_its_largest_field(connect_bus):
    bus = await connect_bus()
    big = ev.make_event("p1", "coder", "big", candidate_created=pb.CandidateCreated(
        candidate=pb.Candidate(params_json="x" * (bus.max_payload() + 10))))
    with pytest.raises(PayloadTooLarge, match="its largest field: candidate_created.candidate.params_json"):
        await bus.send_work("compiler", big)
    assert await bus.stored("KF_WORK", ev.work_subject("compiler", "p1")) == []

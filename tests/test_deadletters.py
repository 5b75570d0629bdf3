"""Dead letters against a real nats-server: listed with their reasons, sent back to their stage once the cause is
fixed, taken off the list, and refused with a reason when the message itself is gone or its campaign has
finished. Whether a running campaign's dead letter goes back is its planner's answer:
tests/test_faults_dead_letters.py asks a real planner, tests/test_planner_state.py checks its judgement; here no
planner runs, and the request waits."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from kfactory.bus import events as ev
from nats.js.api import ConsumerConfig, DeliverPolicy

from kfactory.bus.jetstream import NatsBus
from kfactory.bus.outcomes import Ack, Term
from kfactory.bus.topology import EVENTS_STREAM
from kfactory.bus.deadletters import NoAnswer, NotReplayable, fetch, list_dead_letters, replay, send_back
from kfactory.v1 import events_pb2 as pb

from bus_helpers import consume_until, work


async def test_a_dead_letter_is_listed_sent_back_once_and_handled(nats_url):
    bus = await NatsBus.connect(nats_url, "test")
    for cid, key in (("camp-a", "p1"), ("camp-a", "p2"), ("camp-b", "p3")):
        await bus.send_work("compiler", work(cid, key))
    seen: list[str] = []

    async def broken(d):  # a compiler with a bug: every message fails for good
        seen.append(d.event.point_proposed.point_id)
        return Term("can never succeed: a bug in the handler", pb.HARNESS_FAILED)

    await consume_until(bus, "compiler", broken, lambda: len(seen) == 3)
    letters = await list_dead_letters(bus)
    assert [(r.campaign_id, r.letter.stage, r.letter.reason) for r in letters] == \
        [("camp-a", "compiler", "can never succeed: a bug in the handler")] * 2 + \
        [("camp-b", "compiler", "can never succeed: a bug in the handler")]
    only_a = await list_dead_letters(bus, campaign="camp-a")
    assert [r.seq for r in only_a] == [r.seq for r in letters[:2]]

    sent = [await send_back(bus, r) for r in only_a]  # the bug is fixed: campaign a's work goes back
    assert [e.point_proposed.point_id for e in sent] == ["p1", "p2"]
    handled: list[pb.Event] = []

    async def fixed(d):
        handled.append(d.event)
        return Ack()

    await consume_until(bus, "compiler", fixed, lambda: len(handled) == 2)
    assert [e.id for e in handled] == [e.id for e in sent]  # the same events, ids and all
    left = await list_dead_letters(bus)
    assert [r.campaign_id for r in left] == ["camp-b"]  # sent back means off the list
    assert await fetch(bus, only_a[0].seq) is None and (await fetch(bus, left[0].seq)).campaign_id == "camp-b"
    await send_back(bus, only_a[0])  # again (a planner that died half way): queued once, within the window
    await asyncio.sleep(0.3)
    assert len(handled) == 2  # nothing sent twice
    await bus.close()


async def test_a_dead_letter_whose_payload_was_cut_or_undecodable_is_not_sent_back(nats_url):
    bus = await NatsBus.connect(nats_url, "test")
    await bus.ensure()
    big = work("camp-c", "huge")
    big.point_proposed.params_json = "x" * (300 << 10)  # over the DLQ's 256 KiB payload limit
    await bus.dead_letter("compiler", ev.work_subject("compiler", "camp-c"), big.SerializeToString(),
                          "handler error", 5, "camp-c")
    await bus.dead_letter("coder", ev.work_subject("coder", "camp-c"), b"\xff\xff not protobuf",
                          "malformed protobuf", 1, "camp-c")
    cut, garbage = await list_dead_letters(bus, campaign="camp-c")
    assert cut.letter.payload_bytes > len(cut.letter.payload)
    # the cut payload no longer decodes, but the letter names its point (read from the whole message): the
    # campaign learns that point ended
    assert ev.dead_work(cut.letter) == ("huge", None) and ev.dead_work(garbage.letter) is None
    with pytest.raises(NotReplayable, match=r"kept only 262144 of its \d+ bytes"):
        await replay(bus, cut)
    with pytest.raises(NotReplayable, match="cannot be sent back as it is: malformed protobuf"):
        await replay(bus, garbage)
    with pytest.raises(NotReplayable, match="kept only"):
        await send_back(bus, cut)
    assert len(await list_dead_letters(bus, campaign="camp-c")) == 2  # both stay listed
    await bus.close()


async def test_a_dead_letter_of_a_finished_campaign_is_not_sent_back(nats_url):
    """Its campaign's counts and best are final: the result of the work would belong to no campaign."""
    bus = await NatsBus.connect(nats_url, "test")
    await bus.ensure()
    for cid in ("camp-e", "camp-f"):
        await bus.dead_letter("compiler", ev.work_subject("compiler", cid), work(cid, "p1").SerializeToString(),
                              "handler error", 5, cid)
    await bus.publish(ev.make_event("camp-e", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed")))
    done, running = await list_dead_letters(bus, campaign="camp-e") + await list_dead_letters(bus, campaign="camp-f")
    with pytest.raises(NotReplayable, match="campaign camp-e has finished \\(completed\\), so its results are final"):
        await replay(bus, done)
    with pytest.raises(NoAnswer, match=f"dead letter {running.seq}: the planner did not answer within 0.5 s"):
        await replay(bus, running, wait_s=0.5)  # no planner runs here: the request waits for one
    requests = await _events(bus, "resend_requested")
    assert [(e.campaign_id, e.resend_requested.dlq_seq) for e in requests] == [("camp-f", running.seq)]  # one
    assert [r.campaign_id for r in await list_dead_letters(bus)] == ["camp-e", "camp-f"]  # both still listed
    await bus.close()


async def _events(bus: NatsBus, kind: str) -> list[pb.Event]:
    sub = await bus.js.pull_subscribe(ev.event_subject(kind, "*"), stream=EVENTS_STREAM,
                                      config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    try:
        return [pb.Event.FromString(m.data) for m in await sub.fetch(100, timeout=0.5)]
    except asyncio.TimeoutError:
        return []
    finally:
        await sub.unsubscribe()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kfactory.cli.main", "dead-letters", *args], capture_output=True,
                          text=True, timeout=60)


def test_the_cli_lists_and_sends_back(nats_url):
    async def plant():
        bus = await NatsBus.connect(nats_url, "test")
        await bus.ensure()
        event = work("camp-d", "p9")
        await bus.dead_letter("verifier", ev.work_subject("verifier", "camp-d"), event.SerializeToString(),
                              "handler error after 5 deliveries: boom", 5, "camp-d")
        await bus.close()

    asyncio.run(plant())
    listed = _cli("--nats-url", nats_url, "--stage", "verifier")
    assert listed.returncode == 0, listed.stderr
    assert "1 dead letter(s) of stage verifier" in listed.stdout
    # written without a cause (as before causes were recorded): listed as unspecified
    assert "verifier camp-d unspecified after 5 deliveries: handler error after 5 deliveries: boom" in listed.stdout
    asked = _cli("--nats-url", nats_url, "--replay", "--answer-timeout", "1")
    assert asked.returncode == 1, asked  # no planner answers here
    assert "not sent back: dead letter 1: the planner did not answer within 1.0 s (is it running?)" in asked.stdout
    listed = _cli("--nats-url", nats_url).stdout
    assert listed.startswith("1 dead letter(s)") and "asked for before; the planner has not answered yet" in listed


def test_the_cli_says_when_the_server_cannot_be_reached():
    """Exit 69 (EX_UNAVAILABLE), as a gRPC service that cannot be reached: the same command may succeed later."""
    r = _cli("--nats-url", "nats://127.0.0.1:1")
    assert r.returncode == 69 and r.stderr.startswith("kfactory:") and "127.0.0.1:1" in r.stderr

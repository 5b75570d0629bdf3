"""Poison messages and dead letters in a running factory (six processes, a real nats-server with file storage,
a real redis-server): messages that can never succeed are dead-lettered with their reason, poison and forged
events stop neither the planner nor memory, and work sent back from the dead letters mid-campaign (even by a
planner that died after accepting the resend) ends in its campaign once. The other faults (kills, server
restarts, pauses) are tests/test_faults.py's.

One factory serves every test of the module (tests/fault_campaign.py; its own, not test_faults.py's); each test
runs its own campaign on the replay target, paced so that work is in flight when the fault strikes.
"""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest

from kfactory.bus import events as ev
from kfactory.evidence import report
from kfactory.bus.jetstream import NatsBus
from kfactory.claims import open_claims
from kfactory.bus.deadletters import DeadLetterRecord, list_dead_letters
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from fault_campaign import (BUDGET, campaign_spec, counts_in_archive, fault_rig, finish_and_check,  # noqa: E402
                            mid_campaign, wait_for)
from fault_plant import Plant  # noqa: E402


@pytest.fixture(scope="module")
def rig(tmp_path_factory, host_ceilings):
    with fault_rig(tmp_path_factory, host_ceilings) as r:
        yield r


def test_poison_messages_are_dead_lettered_with_their_reason(rig):
    plant, nats_srv, redis_srv, space = rig
    cid = plant.submit(campaign_spec(space))
    mid_campaign(plant, cid, measured=1)
    locked = asyncio.run(_poison(nats_srv.url, redis_srv.url, cid, space))
    finish_and_check(plant, cid)
    reasons: list = []
    # the locked one is nak'ed as busy for max_deliver x ack_wait before it is dead-lettered
    wait_for(lambda: reasons.__setitem__(slice(None), asyncio.run(_dead_letters(nats_srv.url, cid)))
              or len(reasons) == 3,
              "three dead letters", timeout=30)
    assert any(r.stage == "compiler" and r.reason.startswith("malformed protobuf") for r in reasons), reasons
    assert any(r.stage == "verifier" and "not in the artifact store" in r.reason for r in reasons), reasons
    busy = [r for r in reasons if r.stage == "benchmarker" and "max_deliver" in r.reason]
    assert busy and busy[0].deliveries == 4, reasons  # KFACTORY_MAX_DELIVER=4 deliveries, then dead-lettered
    assert pb.Event.FromString(busy[0].payload).verified.candidate.id == locked
    wait_for(lambda: counts_in_archive(plant, cid).get("dead_letter") == 3, "memory archiving them", 10)
    time.sleep(0.5)
    assert counts_in_archive(plant, cid)["dead_letter"] == 3  # memory archived each one, once


def test_poison_and_forged_events_stop_neither_the_planner_nor_memory(rig):
    """Mid-campaign, on the events stream: 0 bytes, a bodiless event, an event of a kind no schema knows, a
    CampaignStarted naming a problem that does not exist, a forged end of the live campaign and a forged
    measurement with no evidence chain. Then the planner is killed, so that its replay meets them all again.
    The campaign completes with its real counts, the missing problem's campaign is failed with the reason, and
    the archive holds none of them among its events (memory keeps them in its `refused` table)."""
    plant, nats_srv, _, space = rig
    cid = plant.submit(campaign_spec(space))
    mid_campaign(plant, cid, measured=1)
    missing = asyncio.run(_poison_events(nats_srv.url, cid))
    plant.kill("planner")
    time.sleep(0.3)
    plant.start("planner")
    kinds = finish_and_check(plant, cid)
    assert plant.status(cid).counts.proposed == BUDGET and kinds.get("campaign_finished") == 1
    broken = plant.wait_finished(missing, timeout=30)
    assert broken.state == "failed", broken
    plant.wait_archived(missing)
    plant.assert_alive()
    arch = plant.archive()
    try:
        (payload,), = arch.q("SELECT payload FROM events WHERE campaign=? AND kind='campaign_finished'", (missing,))
        reason = pb.Event.FromString(payload).campaign_finished.reason
        assert "its problem cannot be loaded" in reason and "no-such-problem" in reason, reason
        assert not arch.q("SELECT id FROM events WHERE kind='' OR id LIKE '%forged%' OR candidate=?", ("9" * 64,))
        refused = [why for _, _, _, why in arch.refused()]
        assert sum("no body" in why for why in refused) >= 3, refused  # 0 bytes, bodiless, unknown kind
        assert any("is not " + f"{cid}:campaign_finished:finish" in why for why in refused), refused
        assert [w for _, w in arch.held(cid)] == [f"waits for candidate_created, compiled, verified of candidate "
                                                   f"{'9' * 16}"]
    finally:
        arch.close()


async def _poison_events(nats_url: str, cid: str) -> str:
    """Publish the poison and forged events of the test above; returns the id of the campaign whose problem does
    not exist."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        finding = ev.event_subject("finding", cid)
        await js.publish(finding, b"", headers={"Nats-Msg-Id": f"poison-empty-{cid}"})
        await js.publish(finding, pb.Event(id=f"{cid}:x:1", campaign_id=cid).SerializeToString())
        # field 99, length-delimited: a body of a kind that no version of the schema has
        await js.publish(finding, pb.Event(id=f"{cid}:x:2", campaign_id=cid).SerializeToString() + b"\x9a\x06\x02hi")
        missing = f"{cid}x"
        spec = pb.CampaignSpec(problem="/no-such-problem/anywhere", target="cpu", budget_candidates=3, seed=1)
        await js.publish(ev.event_subject("campaign_started", missing), ev.make_event(
            missing, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec)).SerializeToString())
        forged_end = ev.make_event(cid, "planner", "forged", campaign_finished=pb.CampaignFinished(
            state="completed", counts=pb.Counts(proposed=1, measured=1_000_000_000)))
        await js.publish(ev.event_subject("campaign_finished", cid), forged_end.SerializeToString())
        fake = pb.Candidate(id="9" * 64, campaign_id=cid, point_id="forged", target="replay")
        forged = ev.make_event(cid, "benchmarker", fake.id, measured=pb.Measured(
            candidate=fake, score_s=1e-3, timings=[pb.ShapeTiming(shape="x", median_s=1e-3, samples=3)]))
        await js.publish(ev.event_subject("measured", cid), forged.SerializeToString())
        return missing
    finally:
        await nc.close()


def test_work_sent_back_from_the_dead_letters_mid_campaign_ends_in_its_campaign_once(rig):
    """A benchmarker lock left held (as by a worker that died with a long lease) dead-letters a real candidate
    after max_deliver busy deliveries. The planner is paused meanwhile (SIGSTOP), so that it proposes no more and
    the campaign cannot end first. Once the lock is cleared, `kfactory dead-letters --replay` asks the paused
    planner: the request waits, and the CLI says so. Resumed, the planner answers it while it still has points
    to propose: it sends the work back and waits for it, counts its outcome instead of the dead letter's, and
    the campaign completes with every point ending once."""
    plant, nats_srv, redis_srv, space = rig
    cid, cand = _dead_letter_a_candidate(plant, nats_srv, redis_srv, space)
    try:
        asked = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "dead-letters", "--nats-url", nats_srv.url,
                                "--campaign", cid, "--replay", "--answer-timeout", "2"],
                               capture_output=True, text=True, timeout=60)
    finally:
        plant.kill("planner", signal.SIGCONT)
    assert asked.returncode == 1 and "the planner did not answer within" in asked.stdout, asked
    # the planner answers the request it missed: the work goes back, and off the list
    wait_for(lambda: not asyncio.run(_dead_letters(nats_srv.url, cid)), "the dead letter sent back", timeout=30)
    wait_for(lambda: _outcomes_of(plant, cid, cand), "the sent-back candidate's outcome", timeout=30)
    finish_and_check(plant, cid)
    status = plant.status(cid)
    c = status.counts
    assert c.measured + c.rejected + c.compile_failed == c.proposed == BUDGET, c  # the dead letter was replaced
    assert _outcomes_of(plant, cid, cand) == ["measured"] and not asyncio.run(_dead_letters(nats_srv.url, cid))
    arch = plant.archive()
    try:
        assert arch.q("SELECT COUNT(*) FROM measurements WHERE campaign=? AND candidate=?", (cid, cand))[0][0] == 1
        answers = [pb.Event.FromString(p).resend_answered
                   for (p,) in arch.q("SELECT payload FROM events WHERE campaign=? AND kind='resend_answered'", (cid,))]
        md, _ = report.build(arch.events(campaign=cid))
    finally:
        arch.close()
    assert [(a.accepted, a.subject) for a in answers] == [(True, ev.work_subject("benchmarker", cid))], answers
    section = md.split("## Dead letters", 1)[1].split("##", 1)[0]
    assert "| benchmarker | deliveries_exhausted | 4 |" in section, section
    assert section.rstrip().endswith("| sent back: measured |"), section


def test_a_planner_that_died_after_accepting_a_resend_sends_the_work_back_when_it_resumes(rig):
    """The planner's answer is on the events stream but it died before queueing the work: its next life finds
    the point in flight by that answer, queues the work from the DLQ stream and waits for it."""
    plant, nats_srv, redis_srv, space = rig
    cid, cand = _dead_letter_a_candidate(plant, nats_srv, redis_srv, space)
    plant.kill("planner")  # SIGKILL (paused as it is); then what it had published before dying, as it would have
    (record,) = asyncio.run(_dead_letter_records(nats_srv.url, cid))
    point_id = ev.dead_work(record.letter)[0]
    answer = pb.ResendAnswered(dlq_seq=record.seq, accepted=True, point_id=point_id, subject=record.letter.subject)
    asyncio.run(_publish(nats_srv.url, ev.make_event(cid, "planner", str(record.seq), resend_answered=answer)))
    plant.start("planner")
    plant.wait_healthy()
    wait_for(lambda: not asyncio.run(_dead_letters(nats_srv.url, cid)), "the work queued again", timeout=30)
    wait_for(lambda: _outcomes_of(plant, cid, cand), "the sent-back candidate's outcome", timeout=30)
    finish_and_check(plant, cid)
    c = plant.status(cid).counts
    assert c.measured + c.rejected + c.compile_failed == c.proposed == BUDGET, c
    assert _outcomes_of(plant, cid, cand) == ["measured"]


def _dead_letter_a_candidate(plant: Plant, nats_srv, redis_srv, space: Path) -> tuple[str, str]:
    """A campaign with one candidate dead-lettered by the benchmarker (its lock left held for max_deliver busy
    deliveries, then released: the cause is fixed) and the planner paused (SIGSTOP) since that candidate was
    created, so that the campaign has points left to propose when it resumes; (campaign id, candidate id). The
    caller resumes (or kills) the planner."""
    cid = plant.submit(campaign_spec(space))
    cand, lock = asyncio.run(_lock_a_fresh_candidate(nats_srv.url, redis_srv.url, cid, "benchmarker"))
    plant.kill("planner", signal.SIGSTOP)
    try:
        # the candidate is compiled and verified first, then nak'ed max_deliver times: about 20 s on an idle
        # 2-core host, over 40 beside another heavy job (a fresh-clone CI run beside the search bench timed out)
        wait_for(lambda: any(d.stage == "benchmarker" for d in asyncio.run(_dead_letters(nats_srv.url, cid))),
                  "the held candidate's dead letter", timeout=90)
    except BaseException:
        plant.kill("planner", signal.SIGCONT)
        raise
    finally:
        asyncio.run(_release(redis_srv.url, lock))
    return cid, cand


# -- helpers -----------------------------------------------------------------------------------------------
async def _poison(nats_url: str, redis_url: str, cid: str, space: Path) -> str:
    """Three messages that can never succeed: bytes that are no protobuf (compiler), a compiled candidate whose
    artifact is not stored (verifier), and a verified candidate whose benchmarker lock someone else holds for
    good (every delivery is nak'ed as busy until max_deliver). Returns the locked candidate's id."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    claims = open_claims(redis_url)
    try:
        await js.publish(ev.work_subject("compiler", cid), b"\xff\x00 not a protobuf \x01",
                         headers={"Nats-Msg-Id": f"poison-bytes-{cid}"})
        cand = pb.Candidate(id="f" * 64, campaign_id=cid, problem=f"replay:{space}", target=f"replay:{space}",
                            family="recorded", point_id="poison", language="replay", entry="k", threads=1)
        missing = ev.make_event(cid, "test", cand.id, compiled=pb.Compiled(candidate=cand, artifact_digest="0" * 64))
        await js.publish(ev.work_subject("verifier", cid), missing.SerializeToString(),
                         headers={"Nats-Msg-Id": f"poison-artifact-{cid}"})
        cand.id = "e" * 64
        lock = await claims.acquire(f"{cid}:benchmarker:{cand.id}", ttl_s=600)
        assert lock is not None
        locked = ev.make_event(cid, "test", cand.id, verified=pb.Verified(candidate=cand, artifact_digest="0" * 64))
        await js.publish(ev.work_subject("benchmarker", cid), locked.SerializeToString(),
                         headers={"Nats-Msg-Id": f"poison-locked-{cid}"})
        return cand.id
    finally:
        await claims.close()
        await nc.close()


async def _lock_a_fresh_candidate(nats_url: str, redis_url: str, cid: str, stage: str):
    """Take `stage`'s lock on the first candidate of the campaign whose lock is free the moment it is created
    (a paced compile and verification come before the stage wants it); (candidate id, lock)."""
    nc = await nats.connect(nats_url)
    claims = open_claims(redis_url)
    try:
        sub = await nc.jetstream().subscribe(ev.event_subject("candidate_created", cid), ordered_consumer=True)
        while True:
            msg = await sub.next_msg(timeout=30)
            cand = pb.Event.FromString(msg.data).candidate_created.candidate.id
            lock = await claims.acquire(f"{cid}:{stage}:{cand}", ttl_s=600)
            if lock is not None:
                return cand, lock
    finally:
        await claims.close()
        await nc.close()


async def _release(redis_url: str, lock) -> None:
    claims = open_claims(redis_url)
    try:
        assert await claims.release(lock)
    finally:
        await claims.close()


def _outcomes_of(plant: Plant, cid: str, cand: str) -> list[str]:
    arch = plant.archive()
    try:
        return [r for (r,) in arch.q("SELECT reason FROM outcomes WHERE campaign=? AND candidate=?", (cid, cand))]
    finally:
        arch.close()


async def _dead_letter_records(nats_url: str, cid: str) -> list[DeadLetterRecord]:
    """The campaign's dead letters still on the DLQ stream (deadletters.list_dead_letters)."""
    bus = await NatsBus.connect(nats_url, "test")
    try:
        return await list_dead_letters(bus, campaign=cid)
    finally:
        await bus.close()


async def _dead_letters(nats_url: str, cid: str) -> list[pb.DeadLetter]:
    return [r.letter for r in await _dead_letter_records(nats_url, cid)]


async def _publish(nats_url: str, event: pb.Event) -> None:
    bus = await NatsBus.connect(nats_url, "test")
    try:
        await bus.publish(event)
    finally:
        await bus.close()

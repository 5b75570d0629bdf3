"""Faults injected into a running factory (six processes, a real nats-server with file storage, a real
redis-server): each service killed with SIGKILL mid-campaign, both servers restarted, a service paused past its
ack wait, poison messages, every service stopped and started again. After each, the campaign completes and the
archive holds every candidate exactly once with its whole evidence chain.

One factory serves every test of the module (starting six processes is the slow part); each test runs its own
campaign on the replay target, paced so that work is in flight when the fault strikes.
"""
from __future__ import annotations

import asyncio
import gzip
import json
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
from kfactory.bus.topology import WORK_STREAM
from kfactory.claims import open_claims
from kfactory.bus.deadletters import DeadLetterRecord, list_dead_letters
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from fault_plant import SERVICES, Nats, Plant, Redis, check_exactly_once  # noqa: E402
from tuning_synth import write_spaces  # noqa: E402

BUDGET = 14
PACE = "0.25"  # the synthetic space records 800 ms compiles: 0.2 s each here, so the compiler is always busy


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faults")
    space = _slow_benchmarks(write_spaces(tmp / "spaces", devices=("GPU0",))[0])
    nats_srv = Nats(tmp / "nats")
    redis_srv = Redis(tmp / "redis")
    plant = Plant(tmp, nats_srv.url, redis_srv.url, {"KFACTORY_REPLAY_PACE": PACE})
    plant.start_all()
    try:
        yield plant, nats_srv, redis_srv, space
    finally:
        plant.stop()
        nats_srv.close()
        redis_srv.stop()


def _slow_benchmarks(path: Path) -> Path:
    """The synthetic space with 800 ms recorded benchmark times (like its compiles), so that paced, the
    benchmarker holds each message for a while too."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    for rec in data["cache"].values():
        rec["benchmark_time"] = 800.0
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


_seed = iter(range(101, 10_000))


def _spec(space: Path, budget: int = BUDGET) -> pb.CampaignSpec:
    return pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}", strategy="random",
                           budget_candidates=budget, parallel=4, seed=next(_seed), warm_start=0)


def _mid_campaign(plant: Plant, cid: str, measured: int = 3) -> pb.Counts:
    """Wait until the campaign is under way (some measured, not all); returns its counts then."""
    s = plant.wait(cid, lambda s: s.counts.measured >= measured, what=f"{measured} measured")
    assert s.state == "running" and s.counts.proposed < BUDGET + 1, s
    return s.counts


def _finish_and_check(plant: Plant, cid: str) -> dict[str, int]:
    status = plant.wait_finished(cid)
    assert status.state == "completed", f"{status.state}: {status.reason}"
    assert status.counts.proposed == BUDGET, status.counts
    kinds = check_exactly_once(plant, cid, status)
    assert kinds["measured"] >= BUDGET // 2, kinds  # the synthetic space fails a few; most run
    return kinds


#: paced stages (each holds a message ~0.2 s): killed the moment they hold one, which must then be redelivered
HOLDERS = ("compiler", "benchmarker")


@pytest.mark.parametrize("victim", SERVICES)
def test_sigkill_of_any_service_mid_campaign_loses_nothing(rig, victim):
    plant, nats_srv, _, space = rig
    cid = plant.submit(_spec(space))
    _mid_campaign(plant, cid)
    if victim in HOLDERS:
        asyncio.run(_kill_while_holding(plant, nats_srv.url, victim))
    else:
        plant.kill(victim)  # SIGKILL: no chance to nak, ack or flush
    time.sleep(0.3)
    plant.start(victim)
    if victim in HOLDERS:  # the message it died holding is delivered again after ack_wait
        assert asyncio.run(_redelivery_seen(nats_srv.url, victim)), "the held message was never redelivered"
    _finish_and_check(plant, cid)


@pytest.mark.parametrize("server", ["nats", "nats-sigkill", "redis", "redis-wiped"])
def test_restart_of_a_server_mid_campaign_loses_nothing(rig, server):
    plant, nats_srv, redis_srv, space = rig
    cid = plant.submit(_spec(space))
    _mid_campaign(plant, cid)
    if server.startswith("redis"):
        # wiped: every claim, lock, fence and cached result is gone; holders find their fence outdated and
        # leave their messages to be redone, duplicates of results are dropped by event id
        redis_srv.restart(down_s=1.0, wipe=server == "redis-wiped")
    else:  # SIGKILL: what JetStream wrote is in the OS's page cache, not yet synced; the restart recovers it
        nats_srv.restart(down_s=1.0, sig=signal.SIGKILL if server == "nats-sigkill" else signal.SIGTERM)
    _finish_and_check(plant, cid)
    plant.assert_alive()  # every service rode out the outage without exiting


def test_a_service_paused_past_its_ack_wait_is_redelivered_and_fenced(rig):
    """The compiler is stopped (SIGSTOP) while it holds a message; after ack_wait the server redelivers it to a
    second compiler, which compiles it under a newer fence; the first, resumed, must not publish a second result."""
    plant, nats_srv, _, space = rig
    cid = plant.submit(_spec(space))
    _mid_campaign(plant, cid, measured=2)
    before = asyncio.run(_consumer(nats_srv.url, "compiler"))
    _wait_for(lambda: asyncio.run(_consumer(nats_srv.url, "compiler")).num_ack_pending >= 1, "compiler holding work")
    plant.kill("compiler", signal.SIGSTOP)
    try:
        plant.start("compiler", key="compiler-b")
        _wait_for(lambda: asyncio.run(_consumer(nats_srv.url, "compiler")).num_redelivered > before.num_redelivered,
                  "a redelivery", timeout=30)
        time.sleep(2.0)
    finally:
        plant.kill("compiler", signal.SIGCONT)
    _finish_and_check(plant, cid)
    plant.retire("compiler-b")
    # the redelivered candidate's compile result was written under a newer fence than the paused holder's
    arch = plant.archive()
    try:
        fences = [pb.Event.FromString(p).compiled.candidate.fence
                  for (p,) in arch.q("SELECT payload FROM events WHERE campaign=? AND kind='compiled'", (cid,))]
    finally:
        arch.close()
    assert max(fences) >= 2 and min(fences) == 1, fences


def test_poison_messages_are_dead_lettered_with_their_reason(rig):
    plant, nats_srv, redis_srv, space = rig
    cid = plant.submit(_spec(space))
    _mid_campaign(plant, cid, measured=1)
    locked = asyncio.run(_poison(nats_srv.url, redis_srv.url, cid, space))
    _finish_and_check(plant, cid)
    reasons: list = []
    # the locked one is nak'ed as busy for max_deliver x ack_wait before it is dead-lettered
    _wait_for(lambda: reasons.__setitem__(slice(None), asyncio.run(_dead_letters(nats_srv.url, cid)))
              or len(reasons) == 3,
              "three dead letters", timeout=30)
    assert any(r.stage == "compiler" and r.reason.startswith("malformed protobuf") for r in reasons), reasons
    assert any(r.stage == "verifier" and "not in the artifact store" in r.reason for r in reasons), reasons
    busy = [r for r in reasons if r.stage == "benchmarker" and "max_deliver" in r.reason]
    assert busy and busy[0].deliveries == 4, reasons  # KFACTORY_MAX_DELIVER=4 deliveries, then dead-lettered
    assert pb.Event.FromString(busy[0].payload).verified.candidate.id == locked
    _wait_for(lambda: _counts_in_archive(plant, cid).get("dead_letter") == 3, "memory archiving them", 10)
    time.sleep(0.5)
    assert _counts_in_archive(plant, cid)["dead_letter"] == 3  # memory archived each one, once


def test_poison_and_forged_events_stop_neither_the_planner_nor_memory(rig):
    """Mid-campaign, on the events stream: 0 bytes, a bodiless event, an event of a kind no schema knows, a
    CampaignStarted naming a problem that does not exist, a forged end of the live campaign and a forged
    measurement with no evidence chain. Then the planner is killed, so that its replay meets them all again.
    The campaign completes with its real counts, the missing problem's campaign is failed with the reason, and
    the archive holds none of them among its events (memory keeps them in its `refused` table)."""
    plant, nats_srv, _, space = rig
    cid = plant.submit(_spec(space))
    _mid_campaign(plant, cid, measured=1)
    missing = asyncio.run(_poison_events(nats_srv.url, cid))
    plant.kill("planner")
    time.sleep(0.3)
    plant.start("planner")
    kinds = _finish_and_check(plant, cid)
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


def test_a_time_budget_survives_a_restart_of_the_planner(rig):
    """The campaign clock is its CampaignStarted's: a planner killed 4 s into a 6 s campaign and restarted
    resumes 4 s in, not at 0 (it used to end the campaign a whole budget after the restart)."""
    plant, _, _, space = rig
    spec = _spec(space, budget=0)
    spec.budget_seconds = 6.0
    cid = plant.submit(spec)
    time.sleep(4.0)
    before = plant.status(cid).elapsed_s
    plant.kill("planner")
    time.sleep(0.3)
    plant.start("planner")
    after = plant.wait(cid, lambda s: True, what="the restarted planner").elapsed_s
    assert after >= before, (before, after)
    done = plant.wait_finished(cid, timeout=90)
    assert done.state in ("completed", "expired"), done
    # the budget counts from the submit: finished 6 s in plus what was in flight (GRACE_S at most), and the
    # status of the finished campaign keeps its end time
    assert 6.0 <= done.elapsed_s < 6.0 + 60, done.elapsed_s
    time.sleep(1.0)
    assert plant.status(cid).elapsed_s == done.elapsed_s


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
    _wait_for(lambda: not asyncio.run(_dead_letters(nats_srv.url, cid)), "the dead letter sent back", timeout=30)
    _wait_for(lambda: _outcomes_of(plant, cid, cand), "the sent-back candidate's outcome", timeout=30)
    _finish_and_check(plant, cid)
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
    assert "| benchmarker | 4 |" in section and section.rstrip().endswith("| sent back: measured |"), section


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
    _wait_for(lambda: not asyncio.run(_dead_letters(nats_srv.url, cid)), "the work queued again", timeout=30)
    _wait_for(lambda: _outcomes_of(plant, cid, cand), "the sent-back candidate's outcome", timeout=30)
    _finish_and_check(plant, cid)
    c = plant.status(cid).counts
    assert c.measured + c.rejected + c.compile_failed == c.proposed == BUDGET, c
    assert _outcomes_of(plant, cid, cand) == ["measured"]


def _dead_letter_a_candidate(plant: Plant, nats_srv, redis_srv, space: Path) -> tuple[str, str]:
    """A campaign with one candidate dead-lettered by the benchmarker (its lock left held for max_deliver busy
    deliveries, then released: the cause is fixed) and the planner paused (SIGSTOP) since that candidate was
    created, so that the campaign has points left to propose when it resumes; (campaign id, candidate id). The
    caller resumes (or kills) the planner."""
    cid = plant.submit(_spec(space))
    cand, lock = asyncio.run(_lock_a_fresh_candidate(nats_srv.url, redis_srv.url, cid, "benchmarker"))
    plant.kill("planner", signal.SIGSTOP)
    try:
        _wait_for(lambda: any(d.stage == "benchmarker" for d in asyncio.run(_dead_letters(nats_srv.url, cid))),
                  "the held candidate's dead letter", timeout=40)
    except BaseException:
        plant.kill("planner", signal.SIGCONT)
        raise
    finally:
        asyncio.run(_release(redis_srv.url, lock))
    return cid, cand


def test_a_campaign_resumes_when_every_service_comes_back(rig):
    plant, _, _, space = rig
    cid = plant.submit(_spec(space))
    _mid_campaign(plant, cid)
    for name in SERVICES:
        plant.kill(name, signal.SIGTERM)
    stopped = _counts_in_archive(plant, cid)
    time.sleep(1.0)
    for name in SERVICES:
        plant.start(name)
    plant.wait_healthy()
    _finish_and_check(plant, cid)
    assert stopped["point_proposed"] < BUDGET, stopped  # it really was interrupted half way


# -- helpers -----------------------------------------------------------------------------------------------
def _wait_for(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _counts_in_archive(plant: Plant, cid: str) -> dict[str, int]:
    arch = plant.archive()
    try:
        return dict(arch.q("SELECT kind, COUNT(*) FROM events WHERE campaign=? GROUP BY kind", (cid,)))
    finally:
        arch.close()


async def _consumer(url: str, durable: str):
    nc = await nats.connect(url)
    try:
        return await nc.jetstream().consumer_info(WORK_STREAM, durable)
    finally:
        await nc.close()


async def _kill_while_holding(plant: Plant, url: str, stage: str, timeout: float = 20) -> None:
    """SIGKILL the stage's process at a moment its consumer has a message delivered and not acked."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        async with asyncio.timeout(timeout):
            while (await js.consumer_info(WORK_STREAM, stage)).num_ack_pending < 1:
                await asyncio.sleep(0.01)
        plant.kill(stage)
    finally:
        await nc.close()


async def _redelivery_seen(url: str, stage: str, timeout: float = 20) -> bool:
    """Whether the stage's consumer shows a redelivered message pending within `timeout`."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if (await js.consumer_info(WORK_STREAM, stage)).num_redelivered > 0:
                return True
            await asyncio.sleep(0.02)
        return False
    finally:
        await nc.close()


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

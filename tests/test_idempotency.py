"""Idempotency on purpose: after a campaign, every one of its events is published again and every stage's input
queued again, under fresh message ids (as a redelivery or a retry after the server's duplicate window would be);
the archive, the planner's counts and the outcomes do not change. A late writer with an old fence is ignored."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.platform.app import start_services
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.outcomes import Ack, Leave
from kfactory.bus.topology import WORK_STREAM
from kfactory.claims import open_claims
from kfactory.platform.service import Service
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from tuning_synth import write_spaces  # noqa: E402

#: the stage that takes each kind of event as its input
INPUT_OF = {"point_proposed": "coder", "candidate_created": "compiler", "compiled": "verifier",
            "verified": "benchmarker"}


def _snapshot(archive, cid: str) -> dict:
    return {
        "kinds": dict(archive.q("SELECT kind, COUNT(*) FROM events WHERE campaign=? GROUP BY kind", (cid,))),
        "outcomes": sorted(archive.q("SELECT point_id, candidate, stage, reason FROM outcomes WHERE campaign=?",
                                     (cid,))),
        "measurements": sorted(archive.q("SELECT candidate, score_s FROM measurements WHERE campaign=?", (cid,))),
        "candidates": archive.q("SELECT COUNT(*) FROM candidates WHERE campaign=?", (cid,))[0][0],
    }


async def _quiet(running, seconds: float = 1.5, timeout: float = 60) -> None:
    """Until every work queue is empty and memory has archived nothing new for `seconds`."""
    memory, js = running.services["memory"], running.ctx.bus.js
    async with asyncio.timeout(timeout):
        while True:
            before = memory.handled
            await asyncio.sleep(seconds)
            pending = 0
            for stage in INPUT_OF.values():
                info = await js.consumer_info(WORK_STREAM, stage)
                pending += info.num_pending + info.num_ack_pending
            if not pending and memory.handled == before:
                return


async def test_duplicated_events_and_work_change_nothing(bus_settings, tmp_path):
    space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
    running = await start_services(bus_settings, grpc=False)
    try:
        planner, memory = running.services["planner"], running.services["memory"]
        cid = await planner.submit(pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}",
                                                   strategy="random", budget_candidates=8, parallel=3, seed=9))
        st = planner.campaigns[cid]
        async with asyncio.timeout(60):
            while st.finished is None:
                await asyncio.sleep(0.1)
        await _quiet(running)
        before, counts = _snapshot(memory.archive, cid), pb.Counts()
        counts.CopyFrom(st.counts)
        assert before["kinds"]["measured"] >= 4

        js, events, handled = running.ctx.bus.js, memory.archive.events(campaign=cid), memory.handled
        for e in events:  # the same events again, as a publisher retrying after the duplicate window would
            await js.publish(ev.event_subject(ev.kind_of(e), cid), e.SerializeToString(),
                             headers={"Nats-Msg-Id": f"again:{e.id}"})
            stage = INPUT_OF.get(ev.kind_of(e))
            if stage:  # and every stage's input again, as a redelivery
                await js.publish(ev.work_subject(stage, cid), e.SerializeToString(),
                                 headers={"Nats-Msg-Id": f"again:work:{e.id}"})
        await _quiet(running)
        assert memory.handled >= handled + len(events)  # memory did see every duplicate
        assert _snapshot(memory.archive, cid) == before
        assert st.counts == counts
        assert running.failed() is None
    finally:
        await running.shutdown()


async def test_a_late_writer_with_an_old_fence_is_ignored(redis_url_session):
    """A worker whose lock expired (paused, partitioned) and was taken by another must not write its result."""
    claims = open_claims(redis_url_session)
    try:
        svc = Service.__new__(Service)  # only the fencing check, over the real Redis claims store
        svc.claims = claims
        key = f"cfence:compiler:{'c' * 64}"
        late = await claims.acquire(key, ttl_s=0.2)
        await asyncio.sleep(0.3)  # its lock expires while it "works"
        current = await claims.acquire(key, ttl_s=5)
        assert current is not None and current.fence > late.fence
        assert not await svc.still_ours(late)
        assert await svc.still_ours(current)
        await claims.release(current)
    finally:
        await claims.close()


async def test_a_stale_delivery_is_left_alone_not_acked(nats_url):
    """A worker that finds its fence outdated returns Leave: the message stays with its current delivery (an ack
    of the old delivery would remove it from under the new holder). Nobody else takes it here, so ack_wait
    redelivers it and the second delivery finishes it."""
    bus = await NatsBus.connect(nats_url, "t", ack_wait_s=1.0, max_deliver=5)
    seen: list[int] = []

    async def handler(d):
        seen.append(d.deliveries)
        return Leave() if d.deliveries == 1 else Ack()

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("compiler", handler, stop=stop))
    try:
        await bus.send_work("compiler", ev.make_event("cleave", "t", "p", point_proposed=pb.PointProposed()))
        async with asyncio.timeout(15):
            while len(seen) < 2:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        info = await bus.js.consumer_info(WORK_STREAM, "compiler")
        assert seen == [1, 2] and info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        stop.set()
        await task
        await bus.close()

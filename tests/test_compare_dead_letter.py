"""A showdown's or the final comparison's request that the benchmarker dead-lettered will get no answer: the
planner's driver (kfactory/services/planner/driver.py) stops waiting for it at once, instead of COMPARE_WAIT_S, and a
planner that folded the dead letter (a restart) does not send it again. The real planner's driver on the
in-memory bus; no benchmarker runs, so nothing but the dead letter can answer."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.bus import memory as memory_bus
from kfactory.bus import topology
from kfactory.bus.base import dead_letter_of
from kfactory.platform.app import start_services
from kfactory.problems import load_problem
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.driver import COMPARE_WAIT_S
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
import evidence_chain  # noqa: E402


def _state(cid: str) -> CampaignState:
    """A campaign with k1 (0.50 s) and k2 (0.51 s) measured in full, each with its artifact."""
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=2, strategy="random", seed=1)
    st = CampaignState(cid, spec, pb.DeviceInfo(), Space(list(load_problem("softmax").families.values())))
    for k, score in (("k1", 0.50), ("k2", 0.51)):
        cand = pb.Candidate(id=k, point_id="p-" + k, campaign_id=cid, origin="template:cpu_c", params_json="{}")
        for e in evidence_chain.chain(cid, cand, score):
            assert st.apply(e) == "", e
    return st


async def _dead_letter_the_request(bus, st: CampaignState) -> None:
    """Wait for the driver's request on the benchmarker's work queue, then fold its dead letter into the state,
    as the planner folds the letter's event from the stream."""
    while not (queued := await bus.stored(topology.WORK_STREAM, ev.work_subject("benchmarker", st.id))):
        await asyncio.sleep(0.05)
    letter = dead_letter_of("benchmarker", "work.benchmarker", queued[-1].data, "deliveries exhausted", 5,
                            pb.DELIVERIES_EXHAUSTED)
    assert st.apply(ev.make_event(st.id, "benchmarker", "dl", dead_letter=letter)) == ""
    st.changed.set()


async def test_a_dead_lettered_showdown_request_ends_the_wait_and_is_not_sent_again(memory_bus_settings, monkeypatch):
    running = await start_services(memory_bus_settings, names=("planner",))
    try:
        planner = running.services["planner"]
        bus, st = planner.bus, _state("c7")
        t0 = time.monotonic()
        answered, _ = await asyncio.gather(planner.driver._showdown(st), _dead_letter_the_request(bus, st))
        assert answered is False and time.monotonic() - t0 < 10 < COMPARE_WAIT_S
        assert len(st.dead_compares) == 1 and st.best().candidate.id == "k1"   # the search's best stays
        # asked again (a restarted planner, which folded the letter), past the work stream's duplicate window (which
        # would hide a second request only within it): nothing is sent, nothing is waited for (a wait is
        # COMPARE_WAIT_S; the bound leaves a busy host's stalls room, as above)
        monkeypatch.setitem(memory_bus.WINDOWS, topology.WORK_STREAM, 0.0)
        t0 = time.monotonic()
        assert await planner.driver._showdown(st) is False and time.monotonic() - t0 < 10 < COMPARE_WAIT_S
        assert len(await bus.stored(topology.WORK_STREAM, ev.work_subject("benchmarker", st.id))) == 1
    finally:
        await running.shutdown()

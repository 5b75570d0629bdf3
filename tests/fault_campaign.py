"""The campaigns of the fault tests (tests/test_faults.py, tests/test_faults_dead_letters.py): a factory started
once per test module over a paced synthetic space, and the checks each test makes once its fault has struck.

Each test module starts its own factory with `fault_rig` (six processes, a nats-server and a redis-server):
    @pytest.fixture(scope="module")
    def rig(tmp_path_factory, host_ceilings):
        with fault_rig(tmp_path_factory, host_ceilings) as r:
            yield r
"""
from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import time
from pathlib import Path

from fault_plant import Nats, Plant, Redis, check_exactly_once
from tuning_synth import write_spaces

from kfactory.v1 import events_pb2 as pb

BUDGET = 14
PACE = "0.25"  # the synthetic space records 800 ms compiles: 0.2 s each here, so the compiler is always busy


@contextlib.contextmanager
def fault_rig(tmp_path_factory, ceilings: Path):
    """(plant, nats server, redis server, space): every service started, stopped again on exit. `ceilings`: the
    session's measurement of the host's (tests/conftest.py host_ceilings), which the engine campaign's
    rooflines need; else a service measured them beside the other test worker, 7 s and low."""
    tmp = tmp_path_factory.mktemp("faults")
    (tmp / "data").mkdir()
    shutil.copy(ceilings, tmp / "data" / "ceilings.json")
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


def campaign_spec(space: Path, budget: int = BUDGET) -> pb.CampaignSpec:
    return pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}", strategy="random",
                           budget_candidates=budget, parallel=4, seed=next(_seed), warm_start=0)


def mid_campaign(plant: Plant, cid: str, measured: int = 3) -> pb.Counts:
    """Wait until the campaign is under way (some measured, not all); returns its counts then."""
    s = plant.wait(cid, lambda s: s.counts.measured >= measured, what=f"{measured} measured")
    assert s.state == "running" and s.counts.proposed < BUDGET + 1, s
    return s.counts


def finish_and_check(plant: Plant, cid: str) -> dict[str, int]:
    status = plant.wait_finished(cid)
    assert status.state == "completed", f"{status.state}: {failure_lines(plant)}"
    assert status.counts.proposed == BUDGET, status.counts
    kinds = check_exactly_once(plant, cid, status)
    assert kinds["measured"] >= BUDGET // 2, kinds  # the synthetic space fails a few; most run
    return kinds


def wait_for(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def counts_in_archive(plant: Plant, cid: str) -> dict[str, int]:
    arch = plant.archive()
    try:
        return dict(arch.q("SELECT kind, COUNT(*) FROM events WHERE campaign=? GROUP BY kind", (cid,)))
    finally:
        arch.close()


def failure_lines(plant: Plant) -> str:
    """Why a campaign did not complete, from the planner's log (a CampaignStatus carries no reason; the
    CampaignFinished event and the planner's "campaign failed" line do)."""
    lines = [ln for p in sorted(plant.tmp.glob("planner*.log")) for ln in p.read_text(errors="replace").splitlines()
             if "campaign failed" in ln or "Traceback" in ln or "Error" in ln]
    return "\n".join(lines[-8:]) or f"no failure logged; logs in {plant.tmp}"

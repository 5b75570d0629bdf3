"""The harness's own cost per candidate, as a fraction of the candidate's compile + verify + measure time.

Runs one real campaign with the six services in this process over an embedded nats-server, then reads
each service's accounting: time in handlers, time in the candidate's own work (compiling, verifying,
measuring, all in threads and runner processes), and time waiting for the device lease. The harness cost
is handler time minus work minus lease waits (bus round trips, protobuf, claims, archive, bookkeeping),
plus all of the planner's and memory's handling. Since in-process handlers interleave on one event loop,
a handler's wall time also holds other tasks' turns: the figure is an upper bound.

    python bench/pipeline_overhead.py [--problem softmax] [--budget 10]
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import cast

from kfactory.platform.app import start_services
from kfactory.platform.config import Settings
from kfactory.bus.natsd import EmbeddedNats
from kfactory.services.planner.service import PlannerService
from kfactory.v1 import events_pb2 as pb

GOAL = 0.05


async def run(problem: str, budget: int) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="kf-bench-"))
    with EmbeddedNats(tmp / "nats") as nats:
        # its compiles run (cpu_object_cache unset whatever the environment says): the harness/work ratio counts them
        settings = Settings(nats_url=nats.url, data_dir=tmp / "data", report_dir=tmp / "reports",
                            cpu_object_cache=None)
        running = await start_services(settings, grpc=False)
        try:
            planner = cast(PlannerService, running.services["planner"])
            cid = await planner.submit(pb.CampaignSpec(problem=problem, target="cpu", budget_candidates=budget,
                                                       strategy="random", seed=11))
            st = planner.campaigns[cid]
            while st.finished is None:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # let memory archive the last events
        finally:
            await running.shutdown()
    n = st.counts.proposed
    print(f"campaign {cid}: {problem}, {n} candidates, state {st.finished.state}")
    print(f"{'service':12s} {'events':>7s} {'handler s':>10s} {'work s':>8s} {'lease wait s':>13s} {'harness s':>10s}")
    harness = work = 0.0
    for name, svc in running.services.items():
        c = svc.cost
        own = c["handler"] - c["work"] - c["wait"]
        harness += own
        work += c["work"]
        print(f"{name:12s} {svc.handled:7d} {c['handler']:10.3f} {c['work']:8.3f} {c['wait']:13.3f} {own:10.3f}")
    ratio = harness / work if work else float("inf")
    print(f"per candidate: harness {harness / n * 1e3:.1f} ms, compile+verify+measure {work / n * 1e3:.1f} ms")
    print(f"harness / work = {ratio:.4f} ({ratio * 100:.2f}%); goal < {GOAL * 100:.0f}%: "
          f"{'met' if ratio < GOAL else 'NOT met'}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="softmax")
    ap.add_argument("--budget", type=int, default=10)
    a = ap.parse_args()
    raise SystemExit(asyncio.run(run(a.problem, a.budget)))

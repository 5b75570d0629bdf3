"""A discrete-event simulation of one campaign on a cluster: M GPUs, C compilers, a bus with latency.

The search is the planner's own code: the strategy (kfactory.strategies, chosen by name) is asked and told
exactly as the planner does, keeping `parallel` points in flight, and the wall time of each real ask/tell
call is charged to the single planner. Every candidate's compile time, benchmark time and recorded failure
come from a recorded tuning space (the replay target's data); verification holds a GPU for
`--verify-ratio` x the benchmark time, as the verifier holds the device lease. Prints, for each M, the
campaign's time, how busy the GPUs, compilers and planner were, which of them is the bottleneck, and the best
point found over the space's optimum (what the parallelism costs the search); the compilers are sized as
recommended (enough to keep the GPUs fed) unless --compilers is given.

    python bench/scale_sim.py [--space PATH] [--gpus 1 8 64 512] [--strategy evolutionary] [--bus-ms 2]
"""
from __future__ import annotations

import argparse
import heapq
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfactory.targets.replay.cache import load_space
from kfactory.strategies import Space, make_strategy

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tuning-spaces"
HOPS_PER_CANDIDATE = 5  # planner -> coder -> compiler -> verifier -> benchmarker -> planner (events)
CODER_S = 0.002


@dataclass
class Pool:
    """k identical workers; jobs wait in FIFO order for the first free one."""
    name: str
    size: int
    busy_s: float = 0.0
    free: int = 0
    queue: list = field(default_factory=list)

    def __post_init__(self):
        self.free = self.size


@dataclass(order=True)
class Ev:
    t: float
    seq: int
    kind: str = field(compare=False)
    data: Any = field(compare=False, default=None)  # a Point, or (pool, then, point) for a "-done" event


class Sim:
    def __init__(self, rs, strategy: str, gpus: int, compilers: int, parallel: int, budget: int, bus_s: float,
                 verify_ratio: float, seed: int):
        self.rs, self.budget, self.bus_s, self.verify_ratio = rs, budget, bus_s, verify_ratio
        self.strategy = make_strategy(strategy, Space([rs.family()]), seed)
        self.gpu, self.cc = Pool("gpu", gpus), Pool("compiler", compilers)
        self.parallel = parallel
        self.events: list[Ev] = []
        self.seq = 0
        self.now = 0.0
        self.planner_free_at, self.planner_busy = 0.0, 0.0
        self.asked = self.done = self.in_flight = 0
        self.best_ms = math.inf
        self.compile_s: list[float] = []

    def at(self, t: float, kind: str, data=None) -> None:
        self.seq += 1
        heapq.heappush(self.events, Ev(t, self.seq, kind, data))

    def _planner(self, fn):
        """Run real planner code; its wall time occupies the single planner (serially)."""
        t0 = time.perf_counter()
        out = fn()
        took = time.perf_counter() - t0
        start = max(self.now, self.planner_free_at)
        self.planner_free_at = start + took
        self.planner_busy += took
        return out, self.planner_free_at

    def _propose(self) -> None:
        while self.in_flight < self.parallel and self.asked < self.budget:
            point, t = self._planner(self.strategy.ask)
            if point is None:
                self.budget = self.asked
                return
            self.asked += 1
            self.in_flight += 1
            self.at(t + 2 * self.bus_s + CODER_S, "compile", point)

    def _acquire(self, pool: Pool, job: tuple) -> None:
        if pool.free:
            pool.free -= 1
            self._start(pool, job)
        else:
            pool.queue.append(job)

    def _start(self, pool: Pool, job: tuple) -> None:
        seconds, then, point = job
        pool.busy_s += seconds
        self.at(self.now + seconds, f"{pool.name}-done", (pool, then, point))

    def run(self) -> dict:
        self._propose()
        while self.events:
            ev = heapq.heappop(self.events)
            self.now = ev.t
            if ev.kind == "compile":
                rec = self.rs.lookup(ev.data.params)
                self.compile_s.append((rec.compile_ms if rec else 0.0) / 1e3)
                self._acquire(self.cc, (self.compile_s[-1], "verify", ev.data))
            elif ev.kind.endswith("-done"):
                pool, then, point = ev.data
                if pool.queue:
                    self._start(pool, pool.queue.pop(0))
                else:
                    pool.free += 1
                self._after(then, point)
            elif ev.kind == "result":
                rec = self.rs.lookup(ev.data.params)
                ms = rec.time_ms if rec and rec.failure is None else None
                _, _ = self._planner(lambda: self.strategy.tell(ev.data, ms))
                self.best_ms = min(self.best_ms, ms if ms is not None else math.inf)
                self.in_flight -= 1
                self.done += 1
                self._propose()
        return {"seconds": self.now, "candidates": self.done,
                "gpu_busy": self.gpu.busy_s / (self.gpu.size * self.now),
                "compiler_busy": self.cc.busy_s / (self.cc.size * self.now),
                "planner_busy": self.planner_busy / self.now, "best_ms": self.best_ms,
                # what start-up and drain cost: a GPU waits one compile for its first candidate, and the
                # campaign ends with the slowest compiles of its last ones
                "compile_mean_s": statistics.mean(self.compile_s), "compile_max_s": max(self.compile_s),
                "gpu_s_per_candidate": self.gpu.busy_s / self.done}

    def _after(self, stage: str, point) -> None:
        rec = self.rs.lookup(point.params)
        bench_s = (rec.benchmark_ms if rec else 0.0) / 1e3
        if stage == "verify":
            if rec is None or rec.failure == "CompilationFailedConfig":
                self.at(self.now + self.bus_s, "result", point)
            else:
                self.at(self.now + self.bus_s, "gpu", None)
                self._acquire(self.gpu, (self.verify_ratio * bench_s, "bench", point))
        elif stage == "bench":
            if rec.failure is not None:  # the run failed in verification: no measurement
                self.at(self.now + 2 * self.bus_s, "result", point)
            else:
                self._acquire(self.gpu, (bench_s, "report", point))
        else:
            self.at(self.now + self.bus_s, "result", point)


def recommend_compilers(rs, gpus: int, verify_ratio: float) -> int:
    """Compilers that keep `gpus` fed: GPU-seconds per candidate vs compile-seconds per candidate, +25%."""
    recs = list(rs.records.values())
    compile_s = statistics.mean(r.compile_ms for r in recs) / 1e3
    gpu_s = statistics.mean((1 + verify_ratio) * r.benchmark_ms for r in recs) / 1e3
    return max(1, math.ceil(1.25 * gpus * compile_s / gpu_s))


def bottleneck(r: dict, gpus: int, points: int) -> str:
    """Where the campaign waits: the busiest resource; when nothing is near saturation, start-up and drain,
    and when a compile is long next to a GPU's share of the work, how many candidates per GPU would hide it."""
    shares = {"GPUs": r["gpu_busy"], "compilers": r["compiler_busy"], "planner": r["planner_busy"]}
    name, busy = max(shares.items(), key=lambda kv: kv[1])
    if busy >= 0.8:
        return name
    latency = r["compile_mean_s"] + r["compile_max_s"]
    if latency < 0.25 * r["seconds"]:
        return "start-up and drain (too few candidates per GPU)"
    # a GPU idles about one compile at the start and the slowest one at the end: 90% busy needs 9x that in work
    need = math.ceil(9 * latency / max(r["gpu_s_per_candidate"], 1e-9))
    fix = (f"~{need} candidates per GPU would keep them 90% busy" if need * gpus <= points else
           f"90% busy needs ~{need} candidates per GPU, more than the {points} points of the space hold")
    return (f"compile latency: a compile takes {r['compile_mean_s']:.1f} s (up to {r['compile_max_s']:.1f} s) "
            f"against {r['gpu_s_per_candidate'] * 1e3:.0f} ms of GPU time per candidate; {fix}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default=str(DATA / "dedispersion_milo-A100.json.gz"))
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 64, 512])
    ap.add_argument("--compilers", type=int, help="compilers (default: as recommended per M)")
    ap.add_argument("--strategy", default="default", help="the planner's default unless named")
    ap.add_argument("--per-gpu", type=int, default=32, help="candidates per GPU in the campaign's budget")
    ap.add_argument("--bus-ms", type=float, default=2.0, help="latency of one event hop")
    ap.add_argument("--verify-ratio", type=float, default=1.0, help="GPU time of verification / benchmark time")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rs = load_space(a.space)
    print(f"space {rs.name}: {len(rs.records)} recorded configurations; strategy {a.strategy}; bus {a.bus_ms} ms "
          f"per hop; verification {a.verify_ratio}x the benchmark time on a GPU")
    print(f"{'GPUs':>5} {'compilers':>9} {'in flight':>9} {'budget':>6} {'campaign s':>10} {'GPU busy':>8} "
          f"{'compilers busy':>14} {'planner busy':>12} {'best/opt':>8}  bottleneck")
    for m in a.gpus:
        c = a.compilers or recommend_compilers(rs, m, a.verify_ratio)
        budget = min(len(rs.records), a.per_gpu * m)
        # enough in flight that no GPU or compiler waits for the planner to ask, and never more than the budget
        parallel = min(2 * (m + c), budget)
        r = Sim(rs, a.strategy, m, c, parallel, budget, a.bus_ms / 1e3, a.verify_ratio, a.seed).run()
        print(f"{m:5d} {c:9d} {parallel:9d} {r['candidates']:6d} {r['seconds']:10.1f} {r['gpu_busy']:8.1%} "
              f"{r['compiler_busy']:14.1%} {r['planner_busy']:12.1%} {r['best_ms'] / rs.optimum_ms():8.3f}  "
              f"{bottleneck(r, m, len(rs.records))}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Search quality against points in flight, on recorded tuning spaces: what a campaign's `parallel` costs.

    python bench/search_parallel.py [--spaces NAME ...] [--parallel 1 2 3 4 8 18] [--budgets 25 40 100]
                                    [--seeds 30] [--strategy default] [--option KEY=VALUE ...]
                                    [--arrival fifo random verify screen screen-early screen-hold]
                                    [--json OUT]

The planner keeps `parallel` design points in flight: it asks the strategy for a point whenever fewer are out,
so a strategy asked its k-th point knows the results of at most k - parallel earlier ones. More in flight keeps
the device fed (compiles and verification run ahead of it); it also means the search decides on less. This
bench replays campaigns on the recorded spaces (bench/search_quality.py's) with P points out at a time: ask
until P are pending, then one of them completes and is told (`fifo`: the oldest, as when every candidate takes
as long; `random`: any of them, as when some fail fast or are screened out), then ask again. `verify` and `screen`
run the points through the judge's stages on one device in either order (bench/screen_arrival.py): screened-out
results come back at once, a good point's after its verification and measurement; `screen-early` tells the search
a passed screen at once, `screen-hold` asks nothing while a point that passed its screen is out (two remedies
for that pattern, measured and not adopted: README). A budget of b is the first b points asked, all of them
completed (as a campaign waits for its in-flight points).

Reported per space, budget and P: mean over seeds of best found / optimum; then, over the hard spaces (random
search at 100 evaluations ends more than 2% above the optimum, as in search_quality.py), the geometric mean and
its ratio to one point in flight. The figures do not depend on --jobs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from scipy.stats import bootstrap  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))

from kfactory.strategies import BadStrategyOption, Space, UnknownStrategy, check_options, make_strategy  # noqa: E402
from kfactory.targets.replay import load_space  # noqa: E402
from screen_arrival import DeviceCampaign  # noqa: E402
from search_quality import HARD, default_data, expected_random_ratio, pmap, space_files, workers  # noqa: E402


#: arrivals that run the points through the judge's stages on one device (screen_arrival.py)
DEVICE_ARRIVALS: dict[str, dict] = {"screen": {"order": "screen"}, "verify": {"order": "verify"},
                   "screen-early": {"order": "screen", "early": True}, "screen-hold": {"order": "screen", "hold": True}}


def run_in_flight(rs, space: Space, strategy: str, seed: int, parallel: int, budget: int,
                  arrival: str, options: dict | None = None) -> list[float]:
    """One campaign of `budget` asks with `parallel` points out at a time; best/optimum over the first b asked
    points for b = 1..budget (padded if the strategy runs out)."""
    opt, s = rs.optimum_ms(), make_strategy(strategy, space, seed=seed, **(options or {}))
    worst = max(r.time_ms for r in rs.records.values() if r.time_ms is not None)
    if arrival in DEVICE_ARRIVALS:
        asked = DeviceCampaign(rs, s, parallel, budget, **DEVICE_ARRIVALS[arrival]).run()
    else:
        asked = _run_arrival(rs, s, seed, parallel, budget, arrival)
    traj, best = [], math.inf
    for t in asked:
        best = min(best, t) if t is not None else best
        traj.append((best if best < math.inf else worst) / opt)
    return traj + [traj[-1] if traj else worst / opt] * (budget - len(traj))


def _run_arrival(rs, s, seed: int, parallel: int, budget: int, arrival: str) -> list[float | None]:
    """The recorded times of the points asked, in asking order, with `fifo` or `random` completion."""
    arrivals = random.Random(seed ^ 0xA441)
    asked: list[float | None] = []
    pending: list = []
    limit = budget
    while len(asked) < limit or pending:
        if len(asked) < limit and len(pending) < parallel:
            p = s.ask()
            if p is not None:
                rec = rs.lookup(p.params)
                t = rec.time_ms if rec is not None else None
                asked.append(t)
                pending.append((p, t))
                continue
            if not pending:
                break
            limit = len(asked)  # nothing left to ask: the campaign ends with what is out
        done = pending.pop(0 if arrival == "fifo" else arrivals.randrange(len(pending)))
        s.tell(*done)
    return asked


def _seed_job(job: tuple) -> list[float]:
    path, strategy, seed, parallel, budget, arrival, options = job
    rs = load_space(path)
    return run_in_flight(rs, Space([rs.family()]), strategy, seed, parallel, budget, arrival, options)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--spaces", nargs="*", help="space names (file stems) or cache file paths; default: all")
    ap.add_argument("--parallel", nargs="+", type=int, default=[1, 2, 3, 4, 8, 18])
    ap.add_argument("--budgets", nargs="+", type=int, default=[25, 40, 100])
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--strategy", default="default")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a strategy option, as `kfactory run --strategy-option` takes it (surrogate.local=0.5)")
    ap.add_argument("--arrival", nargs="+", choices=("fifo", "random", *DEVICE_ARRIVALS), default=["fifo", "random"])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if min(args.parallel) < 1 or min(args.budgets) < 1 or args.seeds < 1 or args.jobs < 1:
        ap.error("--parallel, --budgets, --seeds and --jobs must be at least 1")
    if bad := [o for o in args.option if "=" not in o]:
        ap.error(f"--option takes KEY=VALUE, not {bad[0]!r}")
    args.options = dict(o.split("=", 1) for o in args.option)
    try:
        check_options(args.strategy, args.options)
    except (UnknownStrategy, BadStrategyOption) as e:
        ap.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = space_files(args.data, args.spaces)
    if not files:
        return 2
    budgets, top, t0 = sorted(set(args.budgets)), max(args.budgets), time.time()
    parallel = sorted(set(args.parallel) | {1})
    results: dict = {}
    finals: dict = {}  # space -> arrival -> P -> each seed's trajectory
    hard: list[str] = []
    with workers(args.jobs):
        for gz in files:
            rs = load_space(gz)
            times = [r.time_ms for r in rs.records.values()]
            if expected_random_ratio(times, rs.optimum_ms(), 100) > HARD:
                hard.append(rs.name)
            for arrival in args.arrival:
                for p in parallel:
                    trajs = pmap(_seed_job, [(str(gz), args.strategy, seed, p, top, arrival, args.options)
                                             for seed in range(args.seeds)])
                    results.setdefault(rs.name, {}).setdefault(arrival, {})[str(p)] = {
                        str(b): float(np.mean([tr[b - 1] for tr in trajs])) for b in budgets}
                    finals.setdefault(rs.name, {}).setdefault(arrival, {})[p] = trajs
                    print(f"  {rs.name:28s} {arrival:6s} P={p:<3d} {time.time() - t0:7.1f}s", file=sys.stderr,
                          flush=True)
    geo = {a: {str(p): {str(b): float(math.exp(np.mean([math.log(results[n][a][str(p)][str(b)]) for n in hard])))
                        for b in budgets} for p in parallel} for a in args.arrival} if hard else {}
    print_table(results, geo, args.arrival, parallel, budgets, hard)
    paired = paired_table(finals, hard, args.arrival, parallel, budgets)
    print(f"\n{args.seeds} seeds, strategy {args.strategy} {args.options or ''}; {time.time() - t0:.0f} s")
    if args.json:
        settings = {"seeds": args.seeds, "strategy": args.strategy, "options": args.options, "budgets": budgets,
                    "parallel": parallel, "arrival": args.arrival}
        args.json.write_text(json.dumps({"spaces": results, "geomean_hard": geo, "hard": hard, "paired": paired,
                                         "settings": settings}, indent=1))
    return 0


def paired_ratio(base: list[float], other: list[float]) -> list[float]:
    """The geometric mean of other/base over pairs (one space and seed each), with its 95% bootstrap interval
    (percentile method, fixed seed): [mean, low, high]."""
    d = np.log(np.asarray(other, float) / np.asarray(base, float))
    if len(d) < 2 or not d.any():  # one pair, or the same result in every pair: nothing to resample
        return [math.exp(float(np.mean(d)))] * 3
    ci = bootstrap((d,), np.mean, vectorized=True, n_resamples=4000, confidence_level=0.95, method="percentile",
                   random_state=np.random.default_rng(0)).confidence_interval
    return [math.exp(float(np.mean(d))), math.exp(ci.low), math.exp(ci.high)]


def paired_table(finals: dict, hard: list[str], arrivals: list[str], parallel: list[int],
                 budgets: list[int]) -> dict:
    """Each arrival's best/optimum against the first arrival's, the same space and seed, over the hard spaces:
    {arrival: {P: {budget: [mean, low, high]}}} (printed), empty with one arrival or no hard space."""
    if len(arrivals) < 2 or not hard:
        return {}
    base, out = arrivals[0], dict[str, dict]()
    print(f"\nagainst --arrival {base}, the same space and seed: geometric mean over the hard spaces "
          f"[95% bootstrap]\n  arrival  P  " + "".join(f"  b={b:<22d}" for b in budgets))
    for a in arrivals[1:]:
        for p in parallel:
            row = {str(b): paired_ratio([tr[b - 1] for n in hard for tr in finals[n][base][p]],
                                        [tr[b - 1] for n in hard for tr in finals[n][a][p]]) for b in budgets}
            out.setdefault(a, {})[str(p)] = row
            print(f"  {a:6s} {p:3d}  " + "".join(f"  {m:.3f} [{lo:.3f}, {hi:.3f}]  " for m, lo, hi in row.values()))
    return out


def print_table(results: dict, geo: dict, arrivals: list[str], parallel: list[int], budgets: list[int],
                hard: list[str]) -> None:
    """Mean best/optimum per space, arrival and P; then the hard spaces' geometric mean and its ratio to P=1."""
    head = "".join(f"  b={b:<5d}" for b in budgets)
    for name, per in results.items():
        print(f"\n{name}{' (hard)' if name in hard else ''}: mean best/optimum\n  arrival  P  {head}")
        for a in arrivals:
            for p in parallel:
                print(f"  {a:6s} {p:3d}  " + "".join(f"  {per[a][str(p)][str(b)]:7.4f}" for b in budgets))
    if not geo:
        print("\nno hard space among these: no geometric mean")
        return
    print(f"\ngeometric mean over the {len(hard)} hard spaces (ratio to P=1)\n  arrival  P  {head}")
    for a in arrivals:
        for p in parallel:
            cells = "".join(f"  {geo[a][str(p)][str(b)]:7.4f} ({geo[a][str(p)][str(b)] / geo[a]['1'][str(b)]:.3f})"
                            for b in budgets)
            print(f"  {a:6s} {p:3d}  {cells}")


if __name__ == "__main__":
    sys.exit(main())

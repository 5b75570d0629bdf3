#!/usr/bin/env python
"""Search quality on recorded tuning spaces: kfactory's strategies side by side with Kernel Tuner's.

    python bench/search_quality.py [--spaces NAME ...] [--budgets 25 50 100 200] [--seeds 30]
                                   [--strategies default evolutionary tpe portfolio random]
                                   [--kt-strategies random_sample genetic_algorithm ...] [--json OUT]
    python bench/search_quality.py --warm-only [--warm-targets NAME ...] [--data DIR] [--seeds 30] [--json OUT]

For each recorded space (Kernel Tuner cache files, default: every *.json.gz in ../shared/data/tuning-spaces
relative to the repository, or $KF_TUNING_SPACES, or --data) and each budget, N seeded runs per strategy.

What an evaluation is: every point a strategy asks costs one evaluation, whether it ran, failed at compile
or run time (a recorded failure is a result), and kfactory's strategies never ask a point twice nor an invalid
one (they only propose points that satisfy the constraints). This matches Kernel Tuner's simulation mode
(kernel_tuner/runners/simulation.py): the budget (max_fevals) counts each *distinct* configuration served
from the cache, failed ones included; a repeated configuration costs nothing, and a configuration that breaks
the restrictions is answered InvalidConfig without costing an evaluation. So both sides pay one evaluation per
distinct valid configuration measured.

kfactory's strategies do not know the budget, so one run of the largest budget gives the best-so-far at every
smaller budget (the first b asks are the same whatever the budget). Kernel Tuner's strategies may shape their
search to max_fevals, so they run once per budget. Kernel Tuner has no seed option for most strategies;
random.seed(seed) and numpy.random.seed(seed) are set before every run (and seed= is passed too).

Reported per space, budget and strategy: mean over seeds of best-found / optimum (`mean_ratio`) and
`score` = (E[random] - mean_ratio) / (E[random] - 1), where E[random] is the exact expected best/optimum of
uniform random sampling without replacement of b valid configurations (failed configurations count as draws
and are never the best): 0 is as good as random search, 1 is the optimum every time.
The `geomean` column is the geometric mean of mean_ratio over the "hard" spaces, those where random search at
100 evaluations ends more than 2% above the optimum (issue 5); the flat spaces are shown as a check only.

Cold versus warm (skipped with --no-warm; alone with --warm-only): each space (each of --warm-targets) is
warm-started from an earlier campaign on every other device of its kernel in --data, as the planner warm-starts
a campaign from memory's priors, and compared with a cold start on the same seeds: median evaluations to within
5% of the optimum, warm/cold with its 90% bootstrap interval, mean best/optimum at each budget, the evidence
rank (what trusting the sources alone would cost), and how far the warm runs trusted each source (the
strategy's measure, strategies/agreement.py). A space is informative when it is not flat (the hard spaces above);
issue 27 asks warm/cold <= 1.0 and mean best/optimum at 100 warm no worse than cold on every informative space,
and a third of the cold evaluations where the whole-space evidence rank is inside that bar.

In three files: this one (the race, the worker processes, the table), search_quality_warm.py (one cold or warm
run, the evidence, the cold versus warm table) and search_quality_kt.py (Kernel Tuner's side).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

# one BLAS thread: the models are small and the machine may be shared
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.append(str(Path(__file__).resolve().parent))  # its two parts beside it, also when loaded by file path

from kfactory.targets.replay import load_space  # noqa: E402
from kfactory.strategies import Space  # noqa: E402
from search_quality_kt import _READ_MEMO, _kt_seed, _memoize_kt_cache_reads, kt_available, prepare_kt  # noqa: E402
from search_quality_kt import memo_last_read  # noqa: E402,F401 (tests/test_search_quality_bench.py reads it here)
from search_quality_warm import (  # noqa: E402
    _warm_seed, evidence_rank, median_ratio_interval, paired_difference, print_warm, source_campaign, trust_summary,
    warm_run)

DEFAULT_BUDGETS = (25, 50, 100, 200)
DEFAULT_KF = ("default", "surrogate", "tpe", "evolutionary", "random")
DEFAULT_KT = ("random_sample", "genetic_algorithm", "dual_annealing", "bayes_opt", "greedy_ils",
              "simulated_annealing", "pso", "diff_evo")
HARD = 1.02  # a space is "hard" when random search at 100 evaluations ends more than 2% above the optimum


def default_data() -> Path:
    env = os.environ.get("KF_TUNING_SPACES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared/data/tuning-spaces"


def space_files(data: Path, spaces: list[str] | None) -> list[Path]:
    """The recorded spaces named (file stems in `data`, or paths), or every one in `data`; none (said on stderr)
    when there is none."""
    if spaces:
        files = [Path(s) if s.endswith((".json.gz", ".json")) else data / f"{s}.json.gz" for s in spaces]
    else:
        files = sorted(data.glob("*.json.gz"))
    if not files:
        print(f"no recorded spaces found in {data} (set --data or KF_TUNING_SPACES)", file=sys.stderr)
    return files


# ----------------------------------------------------------------------------------------------- parallel seeds
_POOL: ProcessPoolExecutor | None = None


def pmap(fn, items: list) -> list:
    """fn over items, on the worker processes when --jobs > 1 (each seed's run is independent and seeded, so
    the figures are the same as one process gives), in order."""
    if _POOL is None:
        return [fn(x) for x in items]
    return list(_POOL.map(fn, items))


@contextlib.contextmanager
def workers(jobs: int):
    """The worker processes pmap uses while the block runs (none for one job), shut down however it ends.
    Forked on first use, after Kernel Tuner's cache reads are memoised, so every worker has that too."""
    global _POOL
    if jobs <= 1:
        yield
        return
    _POOL = ProcessPoolExecutor(jobs, mp_context=get_context("fork"))
    try:
        yield
    finally:
        pool, _POOL = _POOL, None
        pool.shutdown(cancel_futures=True)


# ----------------------------------------------------------------------------------------------- random baseline
def expected_random_ratio(times: list[float | None], opt: float, b: int) -> float:
    """E[best/opt] of b draws without replacement from the N configurations (failures never the best;
    conditioned on at least one success)."""
    n = len(times)
    ok = sorted(t for t in times if t is not None)
    b = min(b, n)
    # P(min rank = k) = C(n-k, b-1) / C(n, b), ranks 1..len(ok) over the successful ones (failures rank last)
    lc = math.lgamma(n + 1) - math.lgamma(b + 1) - math.lgamma(n - b + 1)
    num = den = 0.0
    for k, t in enumerate(ok, start=1):
        if n - k < b - 1:
            break
        lp = math.lgamma(n - k + 1) - math.lgamma(b) - math.lgamma(n - k - b + 2) - lc
        p = math.exp(lp)
        num += p * t / opt
        den += p
    return num / den if den > 0 else float("nan")


# ----------------------------------------------------------------------------------------------- kfactory side
def run_kf(name: str, rs, space: Space, seed: int, budget: int) -> list[float]:
    """Best-so-far ratio after each evaluation (length budget; padded if the strategy stops early)."""
    return warm_run(name, rs, space, seed, [], 0, 1.0, budget, budget)[1]


def _kf_seed(job: tuple) -> tuple[list[float], float]:
    """One seed of run_kf on a space given by path: (trajectory, seconds)."""
    path, name, seed, budget = job
    rs, t0 = load_space(path), time.time()  # cached per path in each process
    return run_kf(name, rs, Space([rs.family()]), seed, budget), time.time() - t0


# --------------------------------------------------------------- warm starts (each seed's runs: search_quality_warm.py)
def warm_start_section(files: list[Path], strategy: str, seeds: list[int], k: int, within: float,
                       max_evals: int, source_budget: int, budgets: list[int],
                       targets: list[str] | None = None) -> dict:
    """For each space (of `targets` when given) with other devices' spaces of the same kernel among `files`:
    median evaluations to within 5% of the optimum, cold, and warm-started from earlier campaigns
    (`source_budget` evaluations, same strategy, same seed) on each of the other devices."""
    spaces = [load_space(f) for f in files]
    out = {}
    for rs in spaces:
        kernel = rs.name.rsplit("-", 1)[0]
        others = [o for o in spaces if o is not rs and o.name.rsplit("-", 1)[0] == kernel]
        if not others or (targets is not None and rs.name not in targets):
            continue
        runs = pmap(_warm_seed, [(str(rs.path), [str(o.path) for o in others], strategy, sd, k, within, max_evals,
                                  source_budget, max(budgets)) for sd in seeds])
        cold, cold_tr = [r[0].hit for r in runs], [r[0].traj for r in runs]
        warm, warm_tr = [r[1].hit for r in runs], [r[1].traj for r in runs]
        ranks = [r[2] for r in runs]
        times = [r.time_ms for r in rs.records.values()]
        cold_median = float(np.median(cold))
        whole = evidence_rank(rs, [e for o in others for e in source_campaign(strategy, o, 0, 0)], within)
        out[rs.name] = {"from": [o.name for o in others], "priors": k, "strategy": strategy,
                        "source_budget": source_budget,
                        # a flat space (random search at 100 evaluations within 2% of the optimum) says nothing
                        # about warm versus cold: every start is within 5% at once
                        "informative": expected_random_ratio(times, rs.optimum_ms(), 100) > HARD,
                        "cold_median_evals": cold_median, "warm_median_evals": float(np.median(warm)),
                        "ratio": float(np.median(warm)) / cold_median,
                        # how far the seeds alone can move that ratio (bootstrap over seeds)
                        "ratio_interval_90": median_ratio_interval(warm, cold),
                        # each seed's warm minus cold evaluations: a steady cost the seeds' spread hides above
                        "paired_difference": paired_difference(warm, cold),
                        "cold": cold, "warm": warm,
                        # where the evidence alone ranks this space's first point within 5% (evidence_rank)
                        "evidence_rank_median": float(np.median(ranks)), "evidence_rank": ranks,
                        # the same with every point the other devices recorded: the most any evidence here says
                        "evidence_rank_whole": whole,
                        # a third of the cold evaluations is asked only where that evidence ranks a point within
                        # 5% inside the bar: elsewhere no use of it could reach it
                        "third_bar": cold_median / 3, "third_applies": whole <= cold_median / 3,
                        # mean best/optimum at each budget, cold and warm
                        "cold_mean_ratio": {str(b): float(np.mean([t[b - 1] for t in cold_tr])) for b in budgets},
                        "warm_mean_ratio": {str(b): float(np.mean([t[b - 1] for t in warm_tr])) for b in budgets},
                        # how far the warm runs trusted each source at the largest budget (median over seeds)
                        **trust_summary([r[1] for r in runs])}
        print(f"  warm start {rs.name:28s} cold {np.median(cold):6.1f}  warm {np.median(warm):6.1f} evaluations "
              f"to within {within - 1:.0%}", file=sys.stderr, flush=True)
    return out


# ----------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with workers(args.jobs):
        return race(args)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--spaces", nargs="*", help="space names (file stems) or cache file paths; default: all")
    ap.add_argument("--budgets", nargs="*", type=int, default=list(DEFAULT_BUDGETS))
    ap.add_argument("--seeds", type=int, default=30)
    ap.add_argument("--strategies", nargs="*", default=list(DEFAULT_KF))
    ap.add_argument("--kt-strategies", nargs="*", default=list(DEFAULT_KT))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--warm-strategy", default="default", help="strategy for the cold vs warm comparison")
    ap.add_argument("--warm-priors", type=int, default=8, help="priors a warm start proposes first")
    ap.add_argument("--warm-source-budget", type=int, default=100,
                    help="evaluations of each earlier campaign on another device that a warm start learns from "
                         "(0: all of that device's recorded space)")
    ap.add_argument("--warm-max-evals", type=int, default=600,
                    help="evaluations after which a run that never came within 5%% counts as max + 1")
    ap.add_argument("--no-warm", action="store_true", help="skip the cold vs warm comparison")
    ap.add_argument("--warm-only", action="store_true",
                    help="run only the cold vs warm comparison (no race between strategies)")
    ap.add_argument("--warm-targets", nargs="+", metavar="NAME",
                    help="spaces (file stems in --data) to compare cold and warm starts on, each warmed from every "
                         "other device of its kernel in --data; default: every space that has one")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes that run seeds side by side (default: one per core); the figures do not "
                         "depend on it, the per-run seconds do where the cores are shared")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.warm_only and args.no_warm:
        ap.error("--warm-only and --no-warm exclude each other")
    return args


def race(args: argparse.Namespace) -> int:
    """The whole bench: the race, the cold versus warm section, the table and the JSON."""
    t_start = time.time()

    files = space_files(args.data, args.spaces)
    if not files:
        return 2
    if missing := [t for t in args.warm_targets or [] if t not in {f.name.removesuffix(".json.gz") for f in files}]:
        print(f"--warm-targets: no recorded space {', '.join(missing)} among {args.data}'s", file=sys.stderr)
        return 2
    if args.warm_only:  # no race: only the spaces and the cold versus warm comparison
        args.strategies, args.kt_strategies = [], []
    budgets = sorted(set(args.budgets))
    seeds = list(range(args.seeds))

    missing_kt = kt_available() if args.kt_strategies else None
    kt_strats = [] if missing_kt else list(args.kt_strategies)
    if missing_kt:
        print(f"!! kernel_tuner is NOT installed ({missing_kt}); Kernel Tuner's strategies are skipped. "
              f"`pip install kernel_tuner` (bench only) to race them.", file=sys.stderr)
    elif kt_strats:
        _memoize_kt_cache_reads()

    results: dict = {}
    meta: dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="kf-search-quality-"))
    try:
        for gz in files:
            rs = load_space(gz)
            opt = rs.optimum_ms()
            times = [r.time_ms for r in rs.records.values()]
            rand = {b: expected_random_ratio(times, opt, b) for b in sorted(set(budgets) | {100})}
            meta[rs.name] = {"configurations": len(times), "failed": sum(t is None for t in times),
                             "optimum_ms": opt, "expected_random": {str(b): rand[b] for b in budgets},
                             "random_at_100": rand[100], "hard": rand[100] > HARD}
            per = results.setdefault(rs.name, {str(b): {} for b in budgets})

            def record(strat: str, b: int, ratios: list[float], secs: float, extra: dict | None = None):
                mean = float(np.mean(ratios))
                score = (rand[b] - mean) / (rand[b] - 1.0) if rand[b] > 1.0 + 1e-12 else float("nan")
                per[str(b)][strat] = {"mean_ratio": mean, "score": score, "median_ratio": float(np.median(ratios)),
                                      "seconds": secs, **(extra or {})}

            for strat in args.strategies:
                runs = pmap(_kf_seed, [(str(gz), strat, seed, max(budgets)) for seed in seeds])
                trajs, secs = [tr for tr, _ in runs], sum(t for _, t in runs)
                for b in budgets:
                    record(strat, b, [tr[b - 1] for tr in trajs], secs / len(seeds))
                print(f"  {rs.name:28s} {strat:22s} {secs:7.1f}s", file=sys.stderr, flush=True)
            if kt_strats:
                kt_args = prepare_kt(rs, gz, tmp)
                for strat in kt_strats:
                    for b in budgets:
                        runs = pmap(_kt_seed, [(strat, kt_args, opt, seed, b) for seed in seeds])
                        ok = [r for r in runs if not isinstance(r, str)]
                        ratios, fevals = [r for r, _, _ in ok], [n for _, n, _ in ok]
                        errors, secs = [r for r in runs if isinstance(r, str)], sum(t for _, _, t in ok)
                        if ratios:
                            record("kt:" + strat, b, ratios, secs / len(seeds),
                                   {"mean_fevals": float(np.mean(fevals)), "errors": len(errors)})
                        else:
                            per[str(b)]["kt:" + strat] = {"error": errors[0]}
                        print(f"  {rs.name:28s} kt:{strat:19s} b={b:<4d} {secs:7.1f}s"
                              + (f" ({len(errors)} errors: {errors[0][:80]})" if errors else ""),
                              file=sys.stderr, flush=True)
                _READ_MEMO.clear()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    warm = None if args.no_warm else warm_start_section(files, args.warm_strategy, seeds, args.warm_priors,
                                                        1.05, max(args.warm_max_evals, max(budgets)),
                                                        args.warm_source_budget, budgets, args.warm_targets)
    strategies = list(args.strategies) + ["kt:" + s for s in kt_strats]
    hard = [n for n in results if meta[n]["hard"]]
    geo: dict = {}
    for b in budgets:
        geo[str(b)] = {}
        for s in strategies:
            vals = [results[n][str(b)].get(s, {}).get("mean_ratio") for n in hard]
            if hard and all(v is not None for v in vals):
                geo[str(b)][s] = float(math.exp(np.mean(np.log(vals))))
    elapsed = time.time() - t_start
    if strategies:
        print_table(results, geo, meta, strategies, budgets, hard)
    if warm:
        print_warm(warm, args, budgets)
    print(f"\n{len(seeds)} seeds; {elapsed:.0f} s; evaluations = distinct valid configurations asked "
          f"(failed ones included), as Kernel Tuner's simulation mode counts them"
          + ("" if not missing_kt else "; Kernel Tuner MISSING: its strategies were not run"))

    if args.json:
        out = {"spaces": results, "geomean_hard": geo, "meta": meta,
               "settings": {"seeds": len(seeds), "budgets": budgets, "strategies": strategies,
                            "kernel_tuner": missing_kt or "installed", "seconds": elapsed,
                            "evaluation": "distinct valid configurations asked, failures included"},
               # space -> cold and warm median evaluations to within 5% of the optimum (warm: seeded from the
               # other devices' spaces of the same kernel, as the planner seeds a campaign from memory's priors)
               "warm_start": warm}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def print_table(results, geo, meta, strategies, budgets, hard) -> None:
    for b in budgets:
        cols = list(results) + ["geomean(hard)"]
        short = {n: n.replace("convolution_milo", "conv").replace("dedispersion_milo", "dedisp") for n in results}
        head = ["b=%d" % b] + [short.get(c, c) + ("" if c not in meta or meta[c]["hard"] else "(flat)")
                               for c in cols]
        rows = []
        vals = {}
        for s in strategies:
            row = []
            for c in cols:
                v = geo[str(b)].get(s) if c == "geomean(hard)" else results[c][str(b)].get(s, {}).get("mean_ratio")
                row.append(v)
            vals[s] = row
        best: list[float | None] = [min((vals[s][j] for s in strategies if vals[s][j] is not None), default=None)
                                    for j in range(len(cols))]
        for s in strategies:
            cells = []
            for j, v in enumerate(vals[s]):
                if v is None:
                    cells.append("-")
                else:
                    low = best[j]
                    cells.append(f"{v:.3f}" + ("*" if low is not None and v <= low + 1e-12 else " "))
            rows.append([s] + cells)
        rows.append(["E[random]"] + [f"{meta[c]['expected_random'][str(b)]:.3f} " if c in meta else "-"
                                     for c in cols])
        w = [max(len(str(r[j])) for r in rows + [head]) for j in range(len(head))]
        print()
        print("  ".join(str(h).ljust(w[j]) for j, h in enumerate(head)))
        for r in rows:
            print("  ".join(str(x).ljust(w[j]) for j, x in enumerate(r)))
    print("\nmean best/optimum over seeds (lower is better; * best in column); geomean over spaces where random "
          "at 100 evaluations ends >2% above the optimum: " + ", ".join(hard))


if __name__ == "__main__":
    sys.exit(main())

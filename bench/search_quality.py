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
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import NamedTuple

# one BLAS thread: the models are small and the machine may be shared
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402
from scipy.stats import bootstrap  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kfactory.targets.replay import load_space  # noqa: E402
from kfactory.strategies import Point, Space, make_strategy  # noqa: E402
from kfactory.strategies.base import Evidence  # noqa: E402
from kfactory.strategies.transfer import WarmPriors, rank_points  # noqa: E402

DEFAULT_BUDGETS = (25, 50, 100, 200)
DEFAULT_KF = ("default", "surrogate", "tpe", "evolutionary", "random")
DEFAULT_KT = ("random_sample", "genetic_algorithm", "dual_annealing", "bayes_opt", "greedy_ils",
              "simulated_annealing", "pso", "diff_evo")
HARD = 1.02  # a space is "hard" when random search at 100 evaluations ends more than 2% above the optimum


def default_data() -> Path:
    env = os.environ.get("KF_TUNING_SPACES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared/data/tuning-spaces"


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


# ----------------------------------------------------------------------------------------------- warm starts
def source_campaign(strategy: str, other, seed: int, budget: int) -> list[Evidence]:
    """What memory holds after an earlier campaign on another device: the `budget` points a cold `strategy`
    run measured there, each scored over that campaign's best (failed points are not measurements). With
    budget 0: every point recorded there (an exhaustive tuning run, which is what the recorded spaces are)."""
    if budget <= 0:
        best = other.optimum_ms()
        return [Evidence(Point.of(other.family().name, r.params), r.time_ms / best, other.name)
                for r in other.records.values() if r.time_ms is not None]
    s = make_strategy(strategy, Space([other.family()]), seed=seed)
    measured = []
    for _ in range(budget):
        p = s.ask()
        if p is None:
            break
        rec = other.lookup(p.params)
        t = rec.time_ms if rec is not None else None
        s.tell(p, t)
        if t is not None:
            measured.append((p, t))
    best = min(t for _, t in measured)
    return [Evidence(p, t / best, f"{other.name}/seed{seed}") for p, t in measured]


class WarmRun(NamedTuple):
    """One run of warm_run: evaluations to within the bar (max_evals + 1: never), best/optimum after each of the
    first `horizon` evaluations, and, warm-started, the strategy's trust in each source at the horizon (or where
    the run ended) and how many of the first `horizon` evaluations the evidence led (priors proposed first and
    the evidence-led members' asks)."""
    hit: int
    traj: list[float]
    trust: dict | None = None
    led: int = 0


def warm_run(name: str, rs, space: Space, seed: int, evidence: list[Evidence], k: int, within: float,
             max_evals: int, horizon: int) -> WarmRun:
    """Run one campaign on the recorded space `rs` until the best found is within `within` of the optimum and at
    least `horizon` evaluations are done (or max_evals). Warm (evidence given): as the planner does it, the
    strategy learns from the evidence first, up to k priors (transfer.WarmPriors: the points the sources rate
    best together, weighted by the strategy's trust in each after every result, while the evidence keeps half the
    say) are proposed before its own points and told to it like its own; every proposal counts."""
    opt, s = rs.optimum_ms(), make_strategy(name, space, seed=seed)
    worst = max(r.time_ms for r in rs.records.values() if r.time_ms is not None)
    if evidence:
        s.warm(evidence)
    priors = WarmPriors(evidence, k)
    best, traj, hit, led, trust = math.inf, [], max_evals + 1, 0, None
    for n in range(1, max_evals + 1):
        p = priors.next(s.trust(), lambda c: c in s.seen or not space.valid(c))
        if p is not None:
            s.seen.add(p)
            by_evidence = True
        else:
            p = s.ask()
            # a portfolio's evidence-led members (Portfolio.led) asked it
            by_evidence = getattr(s, "owner", {}).get(p, -1) in getattr(s, "led", ())
        if p is None:
            break
        led += by_evidence and n <= horizon
        rec = rs.lookup(p.params)
        t = rec.time_ms if rec is not None else None
        s.tell(p, t)
        best = min(best, t) if t is not None else best
        if n <= horizon:
            traj.append((best if best < math.inf else worst) / opt)
        if n == horizon:
            trust = s.trust()
        if best <= within * opt and hit > max_evals:
            hit = n
        if hit <= max_evals and n >= horizon:
            break
    while len(traj) < horizon:
        traj.append(traj[-1] if traj else worst / opt)
    trust = trust or s.trust()
    shown = None if trust is None else {"say": trust.evidence, "sources": {
        a.source.split("/")[0]: {"agreement": a.tau, "weight": a.weight} for a in trust.sources}}
    return WarmRun(hit, traj, shown, int(led))


def evidence_rank(rs, evidence: list[Evidence], within: float) -> int:
    """What the evidence alone says: the position of this space's first point within `within` of its optimum when
    every valid point is ordered by its mean log(relative score) over the sources that measured it (points no
    source measured last, in a fixed order). A warm start that trusts the evidence needs about this many
    evaluations unless this device's own results teach it more than the evidence does."""
    fam = rs.family().name
    here = {Point.of(fam, r.params): r for r in rs.records.values()}
    measured = [p for p in rank_points(evidence, len(evidence)) if p in here]
    known = set(measured)
    ranked = measured + sorted((p for p in here if p not in known), key=lambda p: p.params_json)
    good = within * rs.optimum_ms()
    return next((n for n, p in enumerate(ranked, 1) if here[p].time_ms is not None and here[p].time_ms <= good),
                len(ranked))


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


def trust_summary(runs: list[WarmRun]) -> dict:
    """Median over the warm runs of the evidence's say and of each source device's agreement and weight, where
    they stood at the horizon, and of how many of the first `horizon` evaluations the evidence led."""
    judged = [r.trust for r in runs if r.trust is not None]
    if not judged:
        return {"evidence_say": None, "source_trust": {}, "evidence_led_evals": float(np.median([r.led for r in runs]))}
    devices = sorted({d for t in judged for d in t["sources"]})

    def med(values):
        values = [v for v in values if v is not None]
        return float(np.median(values)) if values else None
    return {"evidence_say": med([t["say"] for t in judged]),
            "source_trust": {d: {k: med([t["sources"][d][k] for t in judged if d in t["sources"]])
                                 for k in ("agreement", "weight")} for d in devices},
            "evidence_led_evals": float(np.median([r.led for r in runs]))}


def median_ratio_interval(warm: list[float], cold: list[float], level: float = 0.9) -> list[float]:
    """A `level` bootstrap interval (percentile method, fixed seed) of median(warm) / median(cold), resampling
    each side's seeds: where a space needs hundreds of evaluations by one seed and a handful by another, 30
    seeds leave the ratio uncertain, and this says by how much."""
    def ratio(w, c, axis=-1):
        return np.median(w, axis=axis) / np.median(c, axis=axis)

    if len(warm) < 2 or len(cold) < 2:  # nothing to resample
        r = float(ratio(np.asarray(warm), np.asarray(cold)))
        return [r, r]
    ci = bootstrap((np.asarray(warm, float), np.asarray(cold, float)), ratio, paired=False, vectorized=True,
                   n_resamples=2000, confidence_level=level, method="percentile", rng=np.random.default_rng(0))
    return [float(ci.confidence_interval.low), float(ci.confidence_interval.high)]


def _warm_seed(job: tuple) -> tuple[WarmRun, WarmRun, int]:
    """One seed of the cold versus warm comparison: (cold run, warm run, evidence rank); the evidence comes
    from one earlier campaign (seed 1000 + seed) on each other device."""
    path, other_paths, strategy, sd, k, within, max_evals, source_budget, horizon = job
    rs, others = load_space(path), [load_space(o) for o in other_paths]
    space = Space([rs.family()])
    evidence = [e for o in others for e in source_campaign(strategy, o, 1000 + sd, source_budget)]
    cold = warm_run(strategy, rs, space, sd, [], k, within, max_evals, horizon)
    warm = warm_run(strategy, rs, space, sd, evidence, k, within, max_evals, horizon)
    return cold, warm, evidence_rank(rs, evidence, within)


# ----------------------------------------------------------------------------------------------- Kernel Tuner side
def kt_available() -> str | None:
    try:
        import kernel_tuner  # noqa: F401
        return None
    except ImportError as e:
        return f"{type(e).__name__}: {e}"


_READ_MEMO: dict = {}


def memo_last_read(read):
    """`read` (Kernel Tuner's read_cache) with each parsed file kept until another file is read: the race goes
    space by space, and each worker process holds its own memo, which nothing else clears. Reads that open the
    cache for writing are passed through."""
    def read_cache(cachefile, open_cache=True):
        if open_cache:
            return read(cachefile, open_cache)
        if cachefile not in _READ_MEMO:
            _READ_MEMO.clear()
            _READ_MEMO[cachefile] = read(cachefile, open_cache)
        return _READ_MEMO[cachefile]
    return read_cache


def _memoize_kt_cache_reads() -> None:
    """Kernel Tuner re-reads (and re-parses) the whole cache file on every tune_kernel call; in simulation mode
    it only reads it (the runner copies each record it serves), so parse each file once (memo_last_read)."""
    import kernel_tuner.util as ktu
    if getattr(ktu, "_kf_memo", False):
        return
    ktu.read_cache = memo_last_read(ktu.read_cache)
    ktu._kf_memo = True


def prepare_kt(rs, gz: Path, tmp: Path) -> dict:
    """A plain-JSON copy of the cache (Kernel Tuner opens it as text) and the tune_kernel arguments."""
    out = tmp / (rs.name + ".json")
    if not out.exists():
        with gzip.open(gz, "rb") as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
    with open(out) as f:
        head = json.load(f)
    return dict(kernel_name=head["kernel_name"], kernel_source="", problem_size=head["problem_size"],
                arguments=[], tune_params={k: list(v) for k, v in rs.params.items()},
                restrictions=list(rs.constraints) or None, cache=str(out), simulation_mode=True, quiet=True)


def run_kt(strategy: str, args: dict, opt: float, seed: int, budget: int) -> tuple[float, int]:
    """(best/opt, distinct configurations evaluated) of one seeded Kernel Tuner run."""
    import kernel_tuner
    random.seed(seed)
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _env = kernel_tuner.tune_kernel(**args, strategy=strategy, strategy_options={"max_fevals": budget},
                                                 seed=seed)
    keys = list(args["tune_params"])
    seen, best = set(), math.inf
    for r in results:
        seen.add(tuple(r.get(k) for k in keys))
        t = r.get("time")
        if "__error__" not in r and isinstance(t, (int, float)) and math.isfinite(t):
            best = min(best, t)
    return best / opt, len(seen)


def _kt_seed(job: tuple) -> tuple[float, int, float] | str:
    """One seeded Kernel Tuner run: (best/opt, distinct configurations, seconds), or why it failed."""
    strat, kt_args, opt, seed, b = job
    t0 = time.time()
    try:
        r, n = run_kt(strat, kt_args, opt, seed, b)
    except Exception as e:  # noqa: BLE001 - one strategy failing must not stop the race
        return f"{type(e).__name__}: {e}"
    return r, n, time.time() - t0


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

    if args.spaces:
        files = [Path(s) if s.endswith((".json.gz", ".json")) else args.data / f"{s}.json.gz" for s in args.spaces]
    else:
        files = sorted(args.data.glob("*.json.gz"))
    if not files:
        print(f"no recorded spaces found in {args.data} (set --data or KF_TUNING_SPACES)", file=sys.stderr)
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


def print_warm(warm: dict, args: argparse.Namespace, budgets: list[int]) -> None:
    """The cold versus warm table, each space's trust in its sources, and the checks of issue 27."""
    src = ("their whole recorded spaces" if args.warm_source_budget <= 0
           else f"a {args.warm_source_budget}-evaluation campaign on each")
    print("\ncold vs warm start: median evaluations to within 5% of the optimum, and mean best/optimum at each "
          f"budget ({args.warm_strategy}; evidence from the other GPUs: {src}; up to {args.warm_priors} priors first)")
    for n, w in warm.items():
        at = "  ".join(f"b={b}: {w['cold_mean_ratio'][str(b)]:.3f}->{w['warm_mean_ratio'][str(b)]:.3f}"
                       for b in budgets)
        lo, hi = w["ratio_interval_90"]
        third = ("third held" if w["ratio"] <= 1 / 3 else "third MISSED") if w["third_applies"] else "third n/a"
        print(f"  {n:28s} {'' if w['informative'] else '(flat) '}cold {w['cold_median_evals']:6.1f}  "
              f"warm {w['warm_median_evals']:6.1f}  warm/cold {w['ratio']:.2f} [{lo:.2f}, {hi:.2f}]  "
              f"evidence rank {w['evidence_rank_median']:6.1f} (whole spaces {w['evidence_rank_whole']}; bar "
              f"{w['third_bar']:.1f}: {third})  {at}  (from {', '.join(w['from'])})")
        if w["evidence_say"] is not None:
            trusted = ", ".join(f"{d} agreement {_signed(t['agreement'])} weight {t['weight']:.2f}"
                                for d, t in w["source_trust"].items())
            print(f"  {'':28s} at {max(budgets)} evaluations: the evidence's say {w['evidence_say']:.2f} ({trusted}); "
                  f"evidence-led evaluations in the first {max(budgets)}: {w['evidence_led_evals']:.0f}")
    print("  [a, b]: 90% bootstrap interval of warm/cold over the seeds")
    print("  evidence rank: where the sources' own measurements place this device's first point within 5% "
          "(median over seeds), or their whole recorded spaces; a warm start that only trusts them needs "
          "about that many evaluations")
    print("  third held/MISSED: warm within a third of the cold evaluations, asked where the whole-space evidence "
          "rank is inside that bar (n/a elsewhere); say, agreement, weight: medians over the seeds "
          "(strategies/agreement.py)")
    informative = [n for n, w in warm.items() if w["informative"]]
    b = str(100 if 100 in budgets else max(budgets))
    not_slower = [n for n in informative if warm[n]["ratio"] <= 1.0]
    not_worse = [n for n in informative if warm[n]["warm_mean_ratio"][b] <= warm[n]["cold_mean_ratio"][b]]
    print(f"  informative spaces (not flat): {len(informative)}; warm/cold <= 1.0 on {len(not_slower)}"
          + (f" (not: {', '.join(sorted(set(informative) - set(not_slower)))})" if len(not_slower) < len(informative)
             else "")
          + f"; mean best/optimum at {b} warm <= cold on {len(not_worse)}"
          + (f" (not: {', '.join(sorted(set(informative) - set(not_worse)))})" if len(not_worse) < len(informative)
             else ""))


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


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

"""bench/search_quality.py's cold versus warm comparison, one seed at a time: the earlier campaigns a warm start
learns from, one run (cold or warm) on a recorded space, the evidence's own rank of the optimum, and the table
(warm_start_section, which runs the seeds on the bench's worker processes, is in search_quality.py)."""
from __future__ import annotations

import argparse
import math
import sys
from typing import NamedTuple

import numpy as np
from scipy.stats import bootstrap

from kfactory.strategies import Point, Space, make_strategy
from kfactory.strategies.base import Evidence
from kfactory.strategies.transfer import WarmPriors, rank_points
from kfactory.targets.replay import load_space


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


def median_ratio_interval(warm: list[float], cold: list[float]) -> list[float]:
    """A 90% bootstrap interval (percentile method, fixed seed) of median(warm) / median(cold), resampling each
    side's seeds: where a space needs hundreds of evaluations by one seed and a handful by another, 30 seeds
    leave the ratio uncertain, and this says by how much. Fewer than two seeds on a side: no interval (NaN)."""
    def ratio(w, c, axis=-1):
        return np.median(w, axis=axis) / np.median(c, axis=axis)

    if len(warm) < 2 or len(cold) < 2:  # one seed says nothing of the seeds' spread
        return [math.nan, math.nan]
    ci = bootstrap((np.asarray(warm, float), np.asarray(cold, float)), ratio, paired=False, vectorized=True,
                   n_resamples=2000, confidence_level=0.9, method="percentile", rng=np.random.default_rng(0))
    return [float(ci.confidence_interval.low), float(ci.confidence_interval.high)]


def paired_difference(warm: list[float], cold: list[float]) -> dict:
    """The median over seeds of each seed's warm minus cold evaluations, with a 90% bootstrap interval
    (percentile method, fixed seed) resampling the seeds in pairs. Both runs of a seed start from the same seed,
    so the median seed's difference shows a cost or gain that the ratio of the two medians can lose among the
    seeds' spread (on convolution A100 seeds need 2 to 600 evaluations). It is the median seed's: a few seeds
    that swing by hundreds move it little. A run that never came within the bar counts as max_evals + 1 on
    either side (a seed capped on both sides differs by 0). Fewer than two seeds: no interval (NaN)."""
    d = np.asarray(warm, float) - np.asarray(cold, float)
    m = float(np.median(d)) if len(d) else math.nan
    if len(d) < 2:
        return {"median": m, "interval_90": [math.nan, math.nan]}
    if np.ptp(d) == 0:  # every seed the same: nothing to resample
        return {"median": m, "interval_90": [m, m]}
    ci = bootstrap((d,), np.median, vectorized=True, n_resamples=2000, confidence_level=0.9, method="percentile",
                   rng=np.random.default_rng(0))
    return {"median": m, "interval_90": [float(ci.confidence_interval.low), float(ci.confidence_interval.high)]}


def _warm_seed(job: tuple) -> tuple[WarmRun, WarmRun, int]:
    """One seed of the cold versus warm comparison: (cold run, warm run, evidence rank); the evidence comes
    from one earlier campaign (seed 1000 + seed) on each other device."""
    path, other_paths, strategy, sd, k, within, max_evals, source_budget, horizon = job
    rs, others = load_space(path), [load_space(o) for o in other_paths]
    space = Space([rs.family()])
    evidence = [e for o in others for e in source_campaign(strategy, o, 1000 + sd, source_budget)]
    cold = warm_run(strategy, rs, space, sd, [], k, within, max_evals, horizon)
    warm = warm_run(strategy, rs, space, sd, evidence, k, within, max_evals, horizon)
    # a run of 30 seeds takes hours on a small host: one line per seed says where it stands
    print(f"    {rs.name} seed {sd}: cold {cold.hit} warm {warm.hit} evaluations to within {within - 1:.0%} "
          f"({warm.led} of the first {horizon} evidence-led)", file=sys.stderr, flush=True)
    return cold, warm, evidence_rank(rs, evidence, within)




def print_warm(warm: dict, args: argparse.Namespace, budgets: list[int]) -> None:
    """The cold versus warm table, each space's trust in its sources, and the checks of issue 27."""
    src = ("their whole recorded spaces" if args.warm_source_budget <= 0
           else f"a {args.warm_source_budget}-evaluation campaign on each")
    print("\ncold vs warm start: median evaluations to within 5% of the optimum, and mean best/optimum at each "
          f"budget ({args.warm_strategy}; evidence from the other GPUs: {src}; up to {args.warm_priors} priors first)")
    for n, w in warm.items():
        at = "  ".join(f"b={b}: {w['cold_mean_ratio'][str(b)]:.3f}->{w['warm_mean_ratio'][str(b)]:.3f}"
                       for b in budgets)
        lo, hi = (_bound(v, ".2f") for v in w["ratio_interval_90"])
        third = ("third held" if w["ratio"] <= 1 / 3 else "third MISSED") if w["third_applies"] else "third n/a"
        pd = w["paired_difference"]
        print(f"  {n:28s} {'' if w['informative'] else '(flat) '}cold {w['cold_median_evals']:6.1f}  "
              f"warm {w['warm_median_evals']:6.1f}  warm/cold {w['ratio']:.2f} [{lo}, {hi}]  "
              f"warm-cold per seed {pd['median']:+.1f} [{_bound(pd['interval_90'][0], '+.1f')}, "
              f"{_bound(pd['interval_90'][1], '+.1f')}]  "
              f"evidence rank {w['evidence_rank_median']:6.1f} (whole spaces {w['evidence_rank_whole']}; bar "
              f"{w['third_bar']:.1f}: {third})  {at}  (from {', '.join(w['from'])})")
        if w["evidence_say"] is not None:
            trusted = ", ".join(f"{d} agreement {_signed(t['agreement'])} weight {t['weight']:.2f}"
                                for d, t in w["source_trust"].items())
            print(f"  {'':28s} at {max(budgets)} evaluations: the evidence's say {w['evidence_say']:.2f} ({trusted}); "
                  f"evidence-led evaluations in the first {max(budgets)}: {w['evidence_led_evals']:.0f}")
    print("  [a, b]: 90% bootstrap interval of warm/cold over the seeds; warm-cold per seed: the median of each "
          "seed's difference (both runs start from the same seed), with its 90% interval")
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
    # what the design bounds: the cold members search as a cold start does, so a warm start's median seed pays at
    # most the evaluations the evidence led where the evidence misses (the priors, and the evidence-led asks)
    within = [n for n in informative
              if warm[n]["paired_difference"]["median"] <= max(args.warm_priors, warm[n]["evidence_led_evals"])]
    print(f"  warm minus cold per seed (median) at most the evidence-led evaluations on {len(within)} of "
          f"{len(informative)}"
          + (f" (not: {', '.join(sorted(set(informative) - set(within)))})" if len(within) < len(informative) else ""))


def _bound(v: float, spec: str) -> str:
    """An interval's bound as the table prints it; n/a where there is none (one seed)."""
    return "n/a" if math.isnan(v) else format(v, spec)


def _signed(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"

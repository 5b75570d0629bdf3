"""Throughput: candidates per minute of a real campaign, the device's busy fraction, and where a candidate's time goes.

Runs one campaign the way `kfactory run` does (an embedded nats-server, the six services in this process, the
campaign submitted to the planner) and reads the stage-time ledger (kfactory/observability/stagetime.py) that the
services and the judge keep: compile, verify (drawing inputs, float64 references, comparison, runner round trips,
shared-memory buffers, the kernel's own runs), screening, measuring, lease waits, and bus and bookkeeping (each
service's handler time less its work and lease waits, plus the planner's and memory's handling and the strategy's
asks). The device's busy fraction is the time kernels ran in the runners (candidates, the reference, baselines,
as the runner children account it) over the campaign's wall time.

`--baseline-order` also runs the same campaign (same problem, budget, strategy and seed) with the judge's order and
settings as they were before issue 23 (kfactory/judge/order.py BASELINE), first, in the same run, then times the two
campaigns' best kernels together at every optimisation shape, so the figures are side by side, with the baseline's
kernel a second time as a control (what the host makes of no difference): `--compare-blocks` rotated timings, each
in a fresh session, and a 95% interval over them (compare_bests). The verdict (`best_no_worse`) is at the shape
a campaign scores its kernels by, the first optimisation shape; the others are reported beside it. Each campaign's
`evaluated` lists every candidate it timed with its score, and `baseline_best_in_new` / `new_best_in_baseline`
say whether the other search reached a campaign's best at all (the picks differ by search, or by selection).
`--aa` runs the baseline order twice instead (an A/A test): how far the same order's best kernels differ when
nothing but the search's course (results' arrival, their noise) changes.

    python bench/throughput.py [--problem softmax] [--target cpu|cuda] [--budget N] [--seed S | --seeds S ...]
                               [--json OUT] [--baseline-order] [--strategy NAME] [--device-seconds S]
                               [--compare-blocks B] [--aa]

`--seeds S1 S2 ...` runs the whole comparison once per seed and adds the verdict over them (over_seeds): several
kernels lie within 2-3% of each other and either order's search reaches a different one from run to run, so one
seed's verdict is partly a draw.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
from scipy.stats import t as student_t

from kfactory.platform.app import start_services
from kfactory.platform.config import Settings
from kfactory.platform.heap import keep_freed_memory_if_set
from kfactory.judge.checks import InputPool
from kfactory.judge.rotated import measure_rotated
from kfactory.bus.natsd import EmbeddedNats
from kfactory.observability import stagetime
from kfactory.problems import load_problem
from kfactory.cli.run import _memory_ready
from kfactory.services.planner.service import PlannerService
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb

#: ledger parts reported per candidate, in this order; "final comparison" is reported once per campaign
VERIFY_PARTS = ("drawing", "references", "comparison", "runner", "buffers", "kernel", "quiet", "other")
#: the judge's stages, each split into VERIFY_PARTS; "ahead" is the inputs drawn before the device is held
JUDGE_STAGES = ("ahead", "screen", "verify", "measure")


def _baseline_settings() -> dict:
    try:
        from kfactory.judge.order import BASELINE
    except ImportError:  # before issue 23's order existed, today's settings are the baseline's
        return {}
    return dict(BASELINE)


async def campaign(args, label: str, root: Path, overrides: dict) -> dict:
    """Run one campaign; its figures (see the module's docstring) and its best kernel's artifact."""
    data = root / label
    data.mkdir(parents=True)
    shutil.copy(root / "ceilings.json", data / "ceilings.json")
    loads = [os.getloadavg()]
    with EmbeddedNats(data / "nats") as nats:
        # each order compiles into its own data directory's cache (cpu_object_cache unset whatever the environment
        # says): a cache the first order filled would flatter the second
        settings = Settings(nats_url=nats.url, data_dir=data, report_dir=data / "reports", cpu_object_cache=None,
                            **overrides)
        running = await start_services(settings, grpc=False)
        try:
            await _memory_ready(running)
            planner = cast(PlannerService, running.services["planner"])
            spec = pb.CampaignSpec(problem=args.problem, target=args.target, budget_candidates=args.budget,
                                   strategy=args.strategy, seed=args.seed, warm_start=0,
                                   budget_seconds=args.seconds)
            cost0 = {n: dict(s.cost) for n, s in running.services.items()}
            before = stagetime.snapshot()
            cid = await planner.submit(spec)
            st = planner.campaigns[cid]
            search_end = await _follow(st, running)
            ledger = stagetime.since(before)
            cost = {n: {k: s.cost[k] - cost0[n][k] for k in s.cost} for n, s in running.services.items()}
            best = st.best()
            artifact = await running.ctx.bus.get_artifact(st.artifacts[best.candidate.id]) if best else None
        finally:
            await running.shutdown()
    loads.append(os.getloadavg())
    outcomes = st.counts.measured + st.counts.rejected + st.counts.compile_failed
    wall = search_end - st.started_wall
    out = {"campaign": cid, "state": st.finished.state if st.finished else "unfinished",
           "counts": {f.name: getattr(st.counts, f.name) for f in pb.Counts.DESCRIPTOR.fields},
           "candidates": outcomes, "search_wall_s": round(wall, 2),
           "candidates_per_minute": round(60 * outcomes / wall, 2) if wall > 0 else 0.0,
           "load_average": {"before": [round(x, 2) for x in loads[0]], "after": [round(x, 2) for x in loads[1]]},
           "settings": overrides, "parallel": st.spec.parallel}  # the points it kept in flight
    out.update(account(ledger, cost, outcomes, wall))
    summary = json.loads(st.finished.summary_json) if st.finished else {}
    # the device time the campaign's work held the device (its budget's unit), beside the kernels' own run time
    out["device_seconds_per_candidate"] = summary.get("device_seconds_per_candidate")
    out["device_seconds"] = summary.get("device_seconds")
    screened = sum(1 for m in st.measured.values() if m.screened_out)
    out["screened_out"] = screened
    out["showdown"] = summary.get("showdown")  # the near ties timed together after the search, and the winner
    out["evaluated"] = evaluated(st)
    if best is not None:
        out["best"] = {"candidate_id": best.candidate.id, "params": json.loads(best.candidate.params_json or "{}"),
                       "median_seconds": best.score_s, "entry": best.candidate.entry, "artifact": artifact}
    return out


def evaluated(st) -> list[dict]:
    """Every candidate the campaign timed (measured in full, or screened out), fastest first: its design point, its
    score and whether it was screened out; what the two orders' searches reached, beside each other."""
    rows = [{"candidate_id": cid, "params": json.loads(m.candidate.params_json or "{}"), "score_s": m.score_s,
             "screened_out": m.screened_out}
            for cid, m in st.measured.items() if cid != st.reference_id]
    return sorted(rows, key=lambda r: r["score_s"])


def verdict(compared: dict, problem) -> dict:
    """Whether the new order's best kernel is no worse than the baseline's where a campaign scores its kernels
    (the first optimisation shape: Measured.score_s): the same kernel, or new/baseline's interval over the blocks
    not wholly above 1. The other shapes' ratios are reported beside it, not judged."""
    scored = problem.shape_str(problem.shapes("optimize")[0])
    if compared.get("same_kernel"):
        return {"scored_shape": scored, "best_no_worse": True}
    c = compared.get(scored, {})
    if "new_interval" not in c:
        return {"scored_shape": scored, "best_no_worse": None}   # the comparison failed: its error is beside it
    return {"scored_shape": scored, "best_no_worse": c["new_interval"][0] <= 1.0}


def reached(best: dict, other: list[dict]) -> dict | None:
    """Where `best`'s design point stands in the other campaign's `evaluated`: its rank there (0: that campaign's
    fastest) and its score, or None when the other search never reached it (a search's arrival order and its
    scores' noise steer it; the two orders' picks differ by search or by selection, and this tells which)."""
    for rank, row in enumerate(other):
        if row["params"] == best["params"]:
            return {"rank": rank, "score_s": row["score_s"], "screened_out": row["screened_out"]}
    return None


async def _follow(st, running) -> float:
    """Wait for the campaign's end; the wall-clock time its search ended (its last candidate's outcome, when the
    planner asked for the final comparison, or its end when there was none)."""
    search_end = None
    while st.finished is None and not running.stop.is_set():
        if search_end is None and (st.comparing or st.showing_down):
            search_end = time.time()
        await asyncio.sleep(0.05)
    if (failure := running.failed()) is not None:
        raise failure
    return search_end or time.time()


def account(ledger: dict, cost: dict, candidates: int, wall: float) -> dict:
    """The ledger's paths folded into the issue's stages: seconds per candidate and each one's share of the sum."""
    secs: dict[str, float] = {}
    parts: dict[str, dict[str, float]] = {s: {} for s in JUDGE_STAGES}
    kernel = 0.0
    for path, (s, _) in ledger.items():
        head, *rest = path.split("/")
        leaf = rest[-1] if rest else "other"
        if leaf == "kernel" and head != "compare":
            kernel += s
        if head in JUDGE_STAGES:
            leaf = leaf if leaf in VERIFY_PARTS else "other"
            parts[head][leaf] = parts[head].get(leaf, 0.0) + s
            secs[head] = secs.get(head, 0.0) + s
        elif head in ("compile", "compare", "lease wait", "planning"):
            secs[head] = secs.get(head, 0.0) + s
    # what each service spent in its handlers that was neither the candidate's work nor a lease wait: bus round
    # trips, protobuf, claims, the archive; the planner's and memory's handling is all of this kind
    bus = sum(c["handler"] - c["work"] - c["wait"] for c in cost.values()) + secs.pop("planning", 0.0)
    names = {"compile": "compile", "ahead": "drawn ahead", "screen": "screening", "verify": "verify",
             "measure": "measuring", "lease wait": "lease waits"}
    stages = {names[k]: secs.get(k, 0.0) for k in names}
    stages["bus and bookkeeping"] = max(0.0, bus)
    total = sum(stages.values())
    n = max(candidates, 1)
    out: dict[str, Any] = {"stages": {k: {"seconds_per_candidate": round(v / n, 4),
                                          "share": round(v / total, 4) if total else 0.0}
                                      for k, v in stages.items()}}
    for k in JUDGE_STAGES:
        if parts[k]:
            out["stages"][names[k]]["parts"] = {p: round(v / n, 4) for p, v in sorted(parts[k].items())}
    out["kernel_seconds_per_candidate"] = round(kernel / n, 4)
    out["device_busy_fraction"] = round(kernel / wall, 4) if wall > 0 else 0.0
    # the harness: everything a candidate's stages took that was not a kernel running
    out["harness_share"] = round(1 - kernel / total, 4) if total else 0.0
    out["harness_seconds_per_candidate"] = round((total - kernel) / n, 4)
    out["final_comparison_s"] = round(secs.get("compare", 0.0), 2)
    return out


def compare_bests(args, a: dict, b: dict, root: Path) -> dict:
    """The two campaigns' best kernels timed together at every optimisation shape, with a control: the baseline's
    kernel again, under a key (and buffers) of its own, whose ratio to the baseline is what the host makes of no
    difference. `--compare-blocks` blocks, each in a fresh session (fresh buffers), each a rotated timing
    (kfactory/judge/rotated.py: every kernel on every kernel's buffers, and right after every other kernel, equally
    often); per shape the ratio is the geometric mean of the blocks' ratios, with a 95% t-interval over the blocks,
    and a difference is outside the noise when
    that interval leaves out 1. Why blocks: one timing's medians differ by more than their intervals say (on the
    2-core host the same kernel against itself came out 0.93-1.05 in twelve single timings, four of them
    "outside the noise" by their medians' intervals), so the blocks' spread is the honest noise."""
    if a["candidate_id"] == b["candidate_id"]:
        return {"same_kernel": True}
    settings = Settings(data_dir=root / "compare")
    (root / "compare").mkdir()
    shutil.copy(root / "ceilings.json", root / "compare" / "ceilings.json")
    problem = load_problem(args.problem)
    target = get_target(args.target, settings)
    blocks: dict[str, list[dict]] = {problem.shape_str(s): [] for s in problem.shapes("optimize")}
    errors: dict[str, str] = {}
    for _ in range(args.compare_blocks):
        session = target.session(problem, settings.threads)
        try:
            session.load_artifact("new", a["artifact"], a["entry"])
            session.load_artifact("baseline", b["artifact"], b["entry"])
            session.load_artifact("control", b["artifact"], b["entry"])
            pool = InputPool(problem, 1)
            for shape in problem.shapes("optimize"):
                t = measure_rotated(session, ["new", "baseline", "control"], problem, shape, pool,
                                    target.cache_bytes(), settings, settings.compare_max_s, target.device(), probe=[])
                name = problem.shape_str(shape)
                if t.reason:
                    errors[name] = t.message
                else:
                    blocks[name].append({k: v.median_s for k, v in t.timings.items()})
        finally:
            session.close()
    return {name: {"error": errors[name]} if name in errors else _block_ratios(timed)
            for name, timed in blocks.items()}


def geometric_interval(ratios: list[float]) -> tuple[float, float, float]:
    """(geometric mean, and its 95% t-interval's ends) of ratios; one ratio's interval is (0, inf)."""
    logs = np.log(ratios)
    mean = float(np.mean(logs))
    half = float(student_t.ppf(0.975, len(logs) - 1) * np.std(logs, ddof=1) / np.sqrt(len(logs))) \
        if len(logs) > 1 else float("inf")
    return float(np.exp(mean)), float(np.exp(mean - half)), float(np.exp(mean + half))


def _block_ratios(timed: list[dict[str, float]]) -> dict:
    """new/baseline, control/baseline and new/control over blocks of medians: each the geometric mean of the
    blocks' ratios, its 95% t-interval, and whether that interval leaves out 1. new/control sets the new kernel
    against the baseline's under its other key: where the control is outside the noise, read both."""
    out: dict[str, Any] = {"blocks": len(timed), "new_s": float(np.median([t["new"] for t in timed])),
                           "baseline_s": float(np.median([t["baseline"] for t in timed]))}
    for a, b, name, label, flag in (("new", "baseline", "new_over_baseline", "new", "significant"),
                                    ("control", "baseline", "control_over_baseline", "control", "control_significant"),
                                    ("new", "control", "new_over_control", "new_over_control",
                                     "new_over_control_significant")):
        ratios = [t[a] / t[b] for t in timed]
        geomean, lo, hi = geometric_interval(ratios)
        out[name] = round(geomean, 4)
        out[f"{label}_interval"] = [round(lo, 4), round(hi, 4)]
        out[f"{label}_blocks"] = [round(float(x), 4) for x in ratios]
        out[flag] = bool(hi < 1 or lo > 1)
    return out


def _measure_ceilings(args, root: Path) -> None:
    """The host's ceilings, measured once for both campaigns (each would measure them under its own load)."""
    cached = Settings().data_dir / "ceilings.json"
    if cached.exists():
        shutil.copy(cached, root / "ceilings.json")
        return
    settings = Settings(data_dir=root)
    get_target(args.target, settings).device()


def _print(label: str, r: dict) -> None:
    print(f"{label}: {r['candidates']} candidates in {r['search_wall_s']:.1f} s = {r['candidates_per_minute']:.1f} "
          f"per minute; device busy {r['device_busy_fraction']:.1%}; harness share {r['harness_share']:.1%} "
          f"({r['harness_seconds_per_candidate']:.2f} s a candidate); "
          f"{r['screened_out']} screened out; {r['device_seconds_per_candidate']} device-s a candidate; "
          f"{r.get('parallel', '?')} in flight; "
          f"load {r['load_average']['before'][0]:.2f} -> "
          f"{r['load_average']['after'][0]:.2f}")
    for name, s in r["stages"].items():
        extra = "  " + ", ".join(f"{p} {v:.3f}" for p, v in s.get("parts", {}).items()) if s.get("parts") else ""
        print(f"  {name:20s} {s['seconds_per_candidate']:8.3f} s/candidate {s['share']:7.1%}{extra}")
    if r.get("best"):
        best = r["best"]
        print(f"  best {best['candidate_id'][:12]} {best['median_seconds'] * 1e3:.3f} ms {best['params']}")
    if sd := r.get("showdown"):
        timed = ", ".join(f"{cid[:12]} {t['median_seconds'] * 1e3:.3f} ms (scored "
                          f"{t['search_score_seconds'] * 1e3:.3f})" for cid, t in sd["timed"].items())
        error = f" ({sd['error']})" if sd["error"] else ""
        print(f"  showdown: {timed}; winner {(sd['winner'] or 'none')[:12]}{error}")


async def main(args) -> int:
    keep_freed_memory_if_set(Settings())   # its services run in this process, as `kfactory run`'s
    root = Path(tempfile.mkdtemp(prefix="kf-throughput-"))
    try:
        _measure_ceilings(args, root)
        if not args.seeds:
            out = await one_seed(args, root)
        else:   # the verdict over several seeds: what the orders do, not what one search's course drew
            runs: list[dict] = []
            for seed in args.seeds:
                runs.append(await one_seed(argparse.Namespace(**{**vars(args), "seed": seed}), _seed_root(root, seed)))
                out = {"seeds": args.seeds[:len(runs)], "runs": runs, **over_seeds(runs)}
                if args.json:   # after every seed: a run cut short keeps the seeds it finished
                    Path(args.json).write_text(json.dumps(out, indent=2))
            _print_over_seeds(out)
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _seed_root(root: Path, seed: int) -> Path:
    """A seed's own directory, with the ceilings measured once: no seed's campaigns start from another's evidence."""
    path = root / f"seed-{seed}"
    path.mkdir()
    shutil.copy(root / "ceilings.json", path / "ceilings.json")
    return path


async def one_seed(args, root: Path) -> dict:
    """One seed's campaigns (the baseline order's first with --baseline-order), printed; the figures."""
    extra = {"device_seconds": args.device_seconds} if args.device_seconds else {}
    results = {}
    if args.baseline_order:
        results["baseline"] = await campaign(args, "baseline", root, {**_baseline_settings(), **extra})
        _print("baseline order", results["baseline"])
    # --aa: the baseline order again in the new order's place, an A/A test of what the search itself varies
    results["new"] = await campaign(args, "new", root, {**_baseline_settings(), **extra} if args.aa else extra)
    _print("baseline order again" if args.aa else "new order", results["new"])
    new = results["new"]
    out = {"problem": args.problem, "target": args.target, "budget": args.budget, "seed": args.seed,
           "strategy": args.strategy, "aa": args.aa, "threads": Settings().threads, "cpus": os.cpu_count(),
           **{k: v for k, v in new.items() if k != "best"}, "best": _public(new.get("best"))}
    if args.baseline_order:
        base = results["baseline"]
        out["baseline_candidates_per_minute"] = base["candidates_per_minute"]
        out["throughput_ratio"] = round(new["candidates_per_minute"] / base["candidates_per_minute"], 3) \
            if base["candidates_per_minute"] else None
        out["baseline"] = {**{k: v for k, v in base.items() if k != "best"}, "best": _public(base.get("best"))}
        if new.get("best") and base.get("best"):
            out["best_interleaved"] = compare_bests(args, new["best"], base["best"], root)
            out.update(verdict(out["best_interleaved"], load_problem(args.problem)))
            out["baseline_best_in_new"] = reached(base["best"], new["evaluated"])
            out["new_best_in_baseline"] = reached(new["best"], base["evaluated"])
        _print_comparison(out, base, new)
    return out


def over_seeds(runs: list[dict]) -> dict:
    """The seeds' figures together: throughput ratios (each, their geometric mean, the least), how many seeds'
    best kernels were no worse, and new/baseline at the scored shape over the seeds (1 where both orders found the
    same kernel): the geometric mean of the seeds' ratios with a 95% t-interval over them, and whether the new
    order's best is no worse over the seeds (the interval not wholly above 1)."""
    out: dict[str, Any] = {}
    ratios = [r["throughput_ratio"] for r in runs if r.get("throughput_ratio") is not None]
    if ratios:
        out["throughput_ratios"] = ratios
        out["throughput_ratio_geomean"] = round(float(np.exp(np.mean(np.log(ratios)))), 3) if min(ratios) > 0 \
            else 0.0
        out["throughput_ratio_least"] = min(ratios)
    verdicts = [r["best_no_worse"] for r in runs if r.get("best_no_worse") is not None]
    out["best_no_worse_seeds"] = f"{sum(verdicts)} of {len(verdicts)}"   # seeds whose comparison failed: neither
    best = [b for b in (_scored_ratio(r) for r in runs) if b is not None]
    out["best_new_over_baseline"] = [round(b, 4) for b in best]
    out["best_no_worse_over_seeds"] = None   # an interval over seeds needs two of them
    if len(best) > 1:
        geomean, lo, hi = geometric_interval(best)
        out["best_new_over_baseline_geomean"] = round(geomean, 4)
        out["best_new_over_baseline_interval"] = [round(lo, 4), round(hi, 4)]
        out["best_no_worse_over_seeds"] = bool(lo <= 1.0)
    return out


def _scored_ratio(run: dict) -> float | None:
    """One seed's new/baseline at the scored shape: 1 for the same kernel, None where no comparison was made."""
    compared = run.get("best_interleaved")
    if not compared:
        return None
    if compared.get("same_kernel"):
        return 1.0
    return compared.get(run.get("scored_shape", ""), {}).get("new_over_baseline")


def _print_over_seeds(out: dict) -> None:
    print(f"over seeds {out['seeds']}: throughput ratios {out.get('throughput_ratios')} (geometric mean "
          f"{out.get('throughput_ratio_geomean')}, least {out.get('throughput_ratio_least')}); best no worse in "
          f"{out['best_no_worse_seeds']} seeds")
    if "best_new_over_baseline_interval" in out:
        print(f"  best kernels new/baseline at the scored shape per seed {out['best_new_over_baseline']}: "
              f"{out['best_new_over_baseline_geomean']} {out['best_new_over_baseline_interval']}; no worse over "
              f"the seeds: {out['best_no_worse_over_seeds']}")


def _print_comparison(out: dict, base: dict, new: dict) -> None:
    if "best_no_worse" in out:
        print(f"best kernel no worse than the baseline order's at the scored shape {out['scored_shape']}: "
              f"{out['best_no_worse']}")
    print(f"throughput: {out['throughput_ratio']}x the baseline order's; harness "
          f"{base['harness_seconds_per_candidate']:.2f} -> {new['harness_seconds_per_candidate']:.2f} s a "
          "candidate")
    for label, key in (("the baseline's best in the new search", "baseline_best_in_new"),
                       ("the new best in the baseline's search", "new_best_in_baseline")):
        if key in out:
            r = out[key]
            print(f"  {label}: " + ("never reached" if r is None else
                                    f"rank {r['rank']}, {r['score_s'] * 1e3:.3f} ms"
                                    + (" (screened out)" if r["screened_out"] else "")))
    if out.get("best_interleaved", {}).get("same_kernel"):
        print("  best kernels: the same kernel")
    for shape, c in out.get("best_interleaved", {}).items():
        if shape != "same_kernel":
            print(f"  best kernels at {shape}: new/baseline {c.get('new_over_baseline')} "
                  f"{c.get('new_interval')} (outside the noise: {c.get('significant')}); the baseline's "
                  f"kernel against itself {c.get('control_over_baseline')} {c.get('control_interval')} "
                  f"(outside the noise: {c.get('control_significant')}); new against the control "
                  f"{c.get('new_over_control')} {c.get('new_over_control_interval')}; {c.get('blocks')} "
                  f"blocks {c.get('error', '')}")


def _public(best: dict | None) -> dict | None:
    return None if best is None else {k: v for k, v in best.items() if k not in ("artifact", "entry")}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="softmax")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--seeds", type=int, nargs="+",
                    help="run the whole comparison once per seed (instead of --seed) and give the verdict over them")
    ap.add_argument("--strategy", default="default")
    ap.add_argument("--seconds", type=float, default=0.0, help="a wall-clock budget too (0: none)")
    ap.add_argument("--device-seconds", type=float, default=0.0,
                    help="bound each campaign by the device time its work may hold (Settings.device_seconds)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--baseline-order", action="store_true", help="run the campaign with today's order too")
    ap.add_argument("--aa", action="store_true",
                    help="with --baseline-order: run the baseline order twice (same seed) instead of the new one, to "
                         "see how far the search's own course moves the best kernel")
    ap.add_argument("--compare-blocks", type=int, default=4,
                    help="rotated timings of the two best kernels, each in a fresh session (at least 2)")
    parsed = ap.parse_args()
    if parsed.aa and not parsed.baseline_order:
        ap.error("--aa runs the baseline order twice: give --baseline-order too")
    if parsed.seeds and not parsed.baseline_order:
        ap.error("--seeds gives the verdict over seeds of the two orders: give --baseline-order too")
    if parsed.seeds and len(set(parsed.seeds)) < len(parsed.seeds):
        ap.error(f"--seeds {' '.join(map(str, parsed.seeds))}: a seed twice")
    if parsed.compare_blocks < 2:
        ap.error(f"--compare-blocks {parsed.compare_blocks}: an interval over blocks needs at least 2")
    raise SystemExit(asyncio.run(main(parsed)))

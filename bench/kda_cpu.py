#!/usr/bin/env python3
"""KDA on the cpu: the best kfactory kernel against the torch CPU recurrence and the numpy (float32) recurrence,
and as a fraction of this machine's peak fp32 rate measured just before and just after each shape's timing
(kfactory/targets/cpu/cpu_fma.c through kfactory.targets.cpu.ceiling, the best of 1 and all threads, as the cpu target
measures it): on a shared host the load moves, so a peak measured at another time says little.

    python bench/kda_cpu.py --from out.json --json kda.json   # the best point of a `kfactory run kda` campaign
    python bench/kda_cpu.py --sample 12 --json kda.json       # else: the best of N sampled family points
    python bench/kda_cpu.py --point '{"vec": 16, ...}'         # or one design point

Shapes: B1 T1024 H4 K=V=128 (prefill-like) and B8 T1 H32 K=V=128 (a decoding step with carried state).
The chosen kernel is verified by the judge first (every shape and distribution of the problem); then kernel,
reference kernel and baselines are timed interleaved by the cpu target's runner (judge.measure: rotating input
sets, outputs of the timed calls checked); torch is timed with all threads and with one, and
`speedup_vs_torch` is against the faster of the two. The JSON holds, per shape, the medians, `speedup_vs_torch`
(null where torch is not importable) and `fraction_of_peak_fp32` (of the mean of the two peaks around the
shape's timing; `fraction_of_cached_peak_fp32` is against the figure the cpu target cached).

torch is not a dependency of kfactory: install a CPU build to compare against it, e.g.
`pip install torch --index-url https://download.pytorch.org/whl/cpu` (or a local wheel, into a separate
--target directory put on PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from kfactory.platform.config import Settings
from kfactory.judge.checks import InputPool
from kfactory.judge.measure import available_baselines, floor_bandwidth_gbps, measure
from kfactory.judge.rotated import measure_rotated
from kfactory.judge.verify import verify
from kfactory.problems import load_problem
from kfactory.targets import get_target
from kfactory.targets.cpu.ceiling import measure_peak_gflops

SHAPES = [dict(B=1, T=1024, H=4, HV=4, K=128, V=128), dict(B=8, T=1, H=32, HV=32, K=128, V=128)]
FAMILY = "cpu_recurrent"


def _compile(target, source: str, flags: str):
    res = target.compile(source, "c", flags, "kernel")
    if not res.ok:
        raise SystemExit(f"compile failed: {res.message}\n{res.log[-2000:]}")
    return res.artifact


def _screen(target, problem, settings, points: list[dict]) -> dict:
    """The fastest of `points` at the first shape by a short timing (each verified on the way)."""
    fam = problem.families[FAMILY]
    best, best_s = None, float("inf")
    for p in points:
        source, flags, threads = fam.render(p)
        session = target.session(problem, threads)
        try:
            session.load_artifact("k", _compile(target, source, flags), "kernel")
            if not verify(session, "k", problem, InputPool(problem, 8)).passed:
                print(f"  screened out (wrong): {p}", flush=True)
                continue
            t = measure(session, ["k"], problem, SHAPES[0], InputPool(problem, 8), target.cache_bytes(), settings,
                        0.3, None)
            med = t.timings["k"].median_s if not t.reason else float("inf")
        finally:
            session.close()
        print(f"  {med * 1e3:8.3f} ms  {p}", flush=True)
        if med < best_s:
            best, best_s = p, med
    if best is None:
        raise SystemExit("no screened point passed verification")
    return best


def _point(args, problem, target, settings) -> tuple[dict, str]:
    if args.point:
        params = json.loads(args.point)
        if not problem.families[FAMILY].valid(params):
            raise SystemExit(f"--point {params} is not a valid point of {FAMILY}")
        return params, "given with --point"
    if args.source:
        data = json.loads(Path(args.source).read_text())
        best = data.get("best") or {}
        if best.get("family") != FAMILY:
            raise SystemExit(f"{args.source}: its best kernel is not from family {FAMILY}: {best.get('family')}")
        if not problem.families[FAMILY].valid(best["params"]):
            raise SystemExit(f"{args.source}: its best point {best['params']} is not a valid point of {FAMILY} "
                             "as it stands now (the design space changed since): run the campaign again")
        return best["params"], f"best of campaign {data.get('campaign_id')} ({args.source})"
    rng = random.Random(args.seed)
    fam = problem.families[FAMILY]
    points = [fam.random_point(rng) for _ in range(args.sample)]
    print(f"screening {len(points)} sampled points of {FAMILY} at {problem.shape_str(SHAPES[0])}", flush=True)
    return _screen(target, problem, settings, points), f"best of {args.sample} sampled points (seed {args.seed})"


def run(args) -> dict:
    settings = Settings(threads=args.threads) if args.threads else Settings()
    problem = load_problem("kda")
    target = get_target("cpu", settings)
    device = target.device()
    params, origin = _point(args, problem, target, settings)
    source, flags, threads = problem.families[FAMILY].render(params)
    session = target.session(problem, threads)
    out: dict[str, Any] = {"problem": "kda", "device": device.model, "threads": threads, "kernel": {"family": FAMILY,
           "params": params, "origin": origin, "flags": flags}, "shapes": {}}
    try:
        session.load_artifact("kernel", _compile(target, source, flags), "kernel")
        t0 = time.perf_counter()
        v = verify(session, "kernel", problem, InputPool(problem, 8))
        out["verified"] = {"passed": v.passed, "message": v.message, "checks": len(v.checks),
                           "worst_norm_rel_err": max((c.norm_rel_err for c in v.checks), default=0.0),
                           "seconds": round(time.perf_counter() - t0, 2)}
        if not v.passed:
            raise SystemExit(f"the kernel failed verification: {v.message}")
        ref_source, ref_flags = problem.reference_source("cpu")
        session.load_artifact("reference", _compile(target, ref_source, ref_flags), "kernel")
        keys = {"kernel": "kernel", "reference_c": "reference"}
        for b in available_baselines(problem, "cpu"):
            session.load_baseline(f"baseline:{b}", b)
            keys[b] = f"baseline:{b}"
        out["baselines"] = [k for k in keys if k not in ("kernel", "reference_c")]
        out["peak_gflops_cached"] = device.peak_gflops
        for shape in SHAPES:
            # the peak just before and just after this shape's timing: on a shared host the load moves
            before = _peak(target, threads)
            row = _shape(session, problem, shape, keys, target, settings, device, args.max_s)
            after = _peak(target, threads)
            _fractions(row, problem.cost(shape)[1], before, after)
            out["shapes"][problem.shape_str(shape)] = row
    finally:
        session.close()
    if "torch" in out["baselines"] and threads > 1:
        _torch_one_thread(out, target, problem, source, flags, settings, args.max_s)
    return out


def _torch_one_thread(out: dict, target, problem, source: str, flags: str, settings, max_s: float) -> None:
    """torch's recurrence is a chain of small ops whose intra-op threads can cost more than they give (on a
    busy 2-core host, 8x more): time it at one thread too, interleaved with the kernel again, and compare the
    kernel with whichever torch setting was faster."""
    session = target.session(problem, 1)   # OMP_NUM_THREADS=1 for torch; the kernel keeps its num_threads
    try:
        session.load_artifact("kernel", _compile(target, source, flags), "kernel")
        session.load_baseline("baseline:torch", "torch")
        for shape in SHAPES:
            t = measure_rotated(session, ["kernel", "baseline:torch"], problem, shape, InputPool(problem, 8),
                                target.cache_bytes(), settings, max_s, None)
            if t.reason:
                raise SystemExit(f"{problem.shape_str(shape)}: timing failed: {t.message}")
            row = out["shapes"][problem.shape_str(shape)]
            ratio = t.timings["baseline:torch"].median_s / t.timings["kernel"].median_s
            row["median_ms"]["torch_1thread"] = round(t.timings["baseline:torch"].median_s * 1e3, 4)
            row["speedup_vs_torch_1thread"] = round(ratio, 2)
            row["speedup_vs_torch"] = min(row["speedup_vs_torch"], round(ratio, 2))
    finally:
        session.close()


def _peak(target, threads: int) -> float:
    """The host's fp32 peak now (GFLOP/s): the best of one and all threads, as the cpu target measures it."""
    return max(measure_peak_gflops(target, t) for t in sorted({1, threads}))


def _fractions(row: dict, flops: float, before: float, after: float) -> None:
    """The kernel's rate as a fraction of the mean of the peaks measured around its timing."""
    peak = (before + after) / 2
    rate = flops / (row["median_ms"]["kernel"] / 1e3) / 1e9
    row["peak_gflops_before_after"] = [round(before, 1), round(after, 1)]
    row["fraction_of_peak_fp32"] = round(rate / peak, 4)


def _shape(session, problem, shape, keys, target, settings, device, max_s) -> dict:
    # rotated (kfactory/judge/rotated.py): the kernel, first in keys, would otherwise have the first buffers
    t = measure_rotated(session, list(keys.values()), problem, shape, InputPool(problem, 8), target.cache_bytes(),
                        settings, max_s, device)
    if t.reason:
        raise SystemExit(f"{problem.shape_str(shape)}: timing failed: {t.message}")
    med = {name: t.timings[k].median_s for name, k in keys.items()}
    nbytes, flops = problem.cost(shape)
    k = med["kernel"]
    row = {"median_ms": {n: round(s * 1e3, 4) for n, s in med.items()},
           "noise": round(t.timings["kernel"].noise, 4),
           "gflops": round(flops / k / 1e9, 2), "gbps": round(nbytes / k / 1e9, 2),
           "fraction_of_cached_peak_fp32":
               round(flops / k / 1e9 / device.peak_gflops, 4) if device.peak_gflops else None,
           # against the judge's floor bandwidth (copy and read figures weighted by the bytes written)
           "fraction_of_bandwidth": round(nbytes / k / 1e9 / bw, 4) if (bw := floor_bandwidth_gbps(
               problem, shape, device)) else None,
           "speedup_vs_torch": round(med["torch"] / k, 2) if "torch" in med else None,
           "speedup_vs_numpy": round(med["numpy"] / k, 2) if "numpy" in med else None,
           "speedup_vs_reference_c": round(med["reference_c"] / k, 2)}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="source", help="a `kfactory run kda --json` result: bench its best kernel")
    ap.add_argument("--point", help="a design point of cpu_recurrent as JSON (instead of --from / --sample)")
    ap.add_argument("--sample", type=int, default=12, help="without --from: family points to screen")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, help="default: the machine's cores")
    ap.add_argument("--max-s", type=float, default=3.0, help="timing budget per shape (seconds)")
    ap.add_argument("--json", dest="json_out", help="write the result here")
    args = ap.parse_args(argv)
    out = run(args)
    print(f"\nkernel: {out['kernel']['params']} ({out['kernel']['origin']})")
    print(f"verified: {out['verified']}")
    print(f"peak fp32 cached by the cpu target: {out['peak_gflops_cached']:.1f} GFLOP/s; "
          f"baselines: {', '.join(out['baselines'])}")
    for name, row in out["shapes"].items():
        times = "  ".join(f"{n} {v:.3f} ms" for n, v in row["median_ms"].items())
        print(f"{name}: {times}\n    {row['gflops']} GFLOP/s = {row['fraction_of_peak_fp32']:.1%} of the peak "
              f"measured around it {row['peak_gflops_before_after']} GFLOP/s; "
              f"{row['gbps']} GB/s; vs torch {row['speedup_vs_torch']}x, vs numpy {row['speedup_vs_numpy']}x, "
              f"vs reference C {row['speedup_vs_reference_c']}x")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

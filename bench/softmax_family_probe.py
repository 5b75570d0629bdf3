#!/usr/bin/env python3
"""Standalone probe for the softmax cpu_c kernel family.

Enumerates the valid design points of
kfactory/problems/softmax/families/cpu_c/family.yaml, renders and compiles a
sample of them (plus reference_cpu.c) with gcc into a temp dir, verifies each
against a float64 numpy softmax on the problem's distributions and shapes, and
times the fastest few against the reference kernel and the numpy baseline.

Needs only numpy, jinja2, pyyaml, simpleeval and gcc (no kfactory services).

    python bench/softmax_family_probe.py                 # stratified sample of 96 points
    python bench/softmax_family_probe.py --all           # every valid point (slow: ~10 min)
    python bench/softmax_family_probe.py --point passes=two,vec=16,unroll=2,exp=poly,threads=2,flags="-O3 -march=native"
    python bench/softmax_family_probe.py --count         # just count the valid points

Timing uses OMP_NUM_THREADS=2 (set before libgomp loads) and preallocated
outputs; each reported time is the median of --reps calls.
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before anything loads libgomp

import jinja2  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from simpleeval import EvalWithCompoundTypes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "kfactory" / "problems" / "softmax"
FAMILY = PROBLEM / "families" / "cpu_c"
BIG = (4096, 4096)
VOCAB = (1, 50257)


# --------------------------------------------------------------------------- design space

def load_family():
    fam = yaml.safe_load((FAMILY / "family.yaml").read_text())
    template = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True).from_string(
        (FAMILY / fam["template"]).read_text())
    return fam, template


def valid_points(fam):
    names = list(fam["params"])
    out = []
    for values in itertools.product(*(fam["params"][n] for n in names)):
        point = dict(zip(names, values))
        ev = EvalWithCompoundTypes(names=dict(point))
        if all(bool(ev.eval(c)) for c in fam.get("constraints", [])):
            out.append(point)
    return out


def point_key(p):
    return ",".join(f"{k}={v}" for k, v in p.items())


def stratified_sample(points, n, seed):
    """Random sample that still covers every value of every parameter."""
    rng = random.Random(seed)
    chosen, seen = [], set()
    for name in points[0]:
        for value in sorted({p[name] for p in points}, key=str):
            cands = [p for p in points if p[name] == value and point_key(p) not in seen]
            if cands:
                p = rng.choice(cands)
                chosen.append(p)
                seen.add(point_key(p))
    rest = [p for p in points if point_key(p) not in seen]
    rng.shuffle(rest)
    chosen += rest[: max(0, n - len(chosen))]
    return chosen


# --------------------------------------------------------------------------- build

class Kernel:
    def __init__(self, name, so_path, threads=None):
        self.name = name
        self.lib = ctypes.CDLL(str(so_path))
        self.fn = self.lib.kernel
        self.fn.restype = None
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self.threads = threads

    def __call__(self, x, y):
        self.fn(x.ctypes.data, y.ctypes.data, x.shape[0], x.shape[1])


def compile_c(src: str, flags: str, out_dir: Path, stem: str):
    c_path = out_dir / f"{stem}.c"
    so_path = out_dir / f"{stem}.so"
    c_path.write_text(src)
    cmd = ["gcc", *flags.split(), "-Wall", "-Wextra", "-shared", "-fPIC", "-o", str(so_path), str(c_path), "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return so_path, res.returncode, (res.stderr or "").strip()


def build_point(fam, template, point, out_dir, idx):
    src = template.render(**point)
    flags = jinja2.Template(fam["compile_flags"]).render(**point)
    return compile_c(src, flags, out_dir, f"p{idx:04d}")


# --------------------------------------------------------------------------- data

def make_input(dist, shape, rng):
    spec = dist["x"]
    if spec["kind"] == "normal":
        x = rng.normal(spec.get("mean", 0.0), spec["std"], size=shape)
    elif spec["kind"] == "uniform":
        x = rng.uniform(spec["low"], spec["high"], size=shape)
    else:
        raise ValueError(spec)
    x = x.astype(np.float32)
    frac = spec.get("neg_inf_fraction", 0.0)
    if frac:
        mask = rng.random(shape) < frac
        mask[np.arange(shape[0]), rng.integers(0, shape[1], size=shape[0])] = False  # >= 1 finite per row
        x[mask] = -np.inf
    return np.ascontiguousarray(x)


def softmax64(x):
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    e = np.exp(x64 - m)
    return e / e.sum(axis=1, keepdims=True)


def check(y, ref, tol):
    if not np.all(np.isfinite(y)):
        return False, "non-finite output"
    err = np.abs(y.astype(np.float64) - ref)
    bound = tol["atol"] + tol["rtol"] * np.abs(ref)
    bad = err > bound
    norm_rel = float(np.linalg.norm(err) / max(np.linalg.norm(ref), 1e-300))
    if bad.any():
        i = np.unravel_index(np.argmax(err - bound), err.shape)
        return False, f"elementwise: {int(bad.sum())} bad, worst at {i}: y={y[i]!r} ref={ref[i]!r}"
    if norm_rel > tol["norm_rel"]:
        return False, f"norm_rel {norm_rel:.3g} > {tol['norm_rel']}"
    return True, f"norm_rel {norm_rel:.2g}"


# --------------------------------------------------------------------------- timing

def median_time(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def numpy_baseline(x, y):
    m = x.max(axis=1, keepdims=True)
    np.subtract(x, m, out=y)
    np.exp(y, out=y)
    s = y.sum(axis=1, keepdims=True)
    np.divide(y, s, out=y)


# --------------------------------------------------------------------------- main

def parse_point(text, fam):
    point = {}
    for part in text.split(","):
        k, v = part.split("=", 1)
        v = v.strip().strip('"').strip("'")
        proto = fam["params"][k][0]
        point[k] = type(proto)(v) if not isinstance(proto, str) else v
    missing = set(fam["params"]) - set(point)
    if missing:
        raise SystemExit(f"--point misses {sorted(missing)}")
    return point


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", action="store_true", help="only count valid points")
    ap.add_argument("--all", action="store_true", help="build and verify every valid point")
    ap.add_argument("--sample", type=int, default=96, help="points to sample (default 96)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--point", action="append", default=[], help="explicit point(s) k=v,k=v,...")
    ap.add_argument("--top", type=int, default=5, help="points timed carefully (default 5)")
    ap.add_argument("--reps", type=int, default=15, help="timed calls per measurement (>= 10)")
    ap.add_argument("--no-big-verify", action="store_true", help="skip 4096x4096 in verification")
    ap.add_argument("--keep", action="store_true", help="keep the temp build dir")
    args = ap.parse_args()

    problem = yaml.safe_load((PROBLEM / "problem.yaml").read_text())
    tol = problem["tolerance"]["float32"]
    fam, template = load_family()
    points = valid_points(fam)
    space = 1
    for v in fam["params"].values():
        space *= len(v)
    print(f"family cpu_c: {len(points)} valid points of {space} "
          f"({', '.join(f'{k}:{len(v)}' for k, v in fam['params'].items())})")
    if args.count:
        return 0

    if args.point:
        sample = [parse_point(t, fam) for t in args.point]
    elif args.all:
        sample = points
    else:
        sample = stratified_sample(points, args.sample, args.seed)

    tmp = Path(tempfile.mkdtemp(prefix="softmax_probe_"))
    print(f"build dir {tmp}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")

    ref_src = (PROBLEM / "reference_cpu.c").read_text()
    ref_flags = problem["reference_kernel"]["cpu"]["flags"]
    so, rc, err = compile_c(ref_src, ref_flags, tmp, "reference")
    if rc or err:
        print(f"reference build rc={rc}\n{err}")
        if rc:
            return 1
    reference = Kernel("reference", so)

    # --- inputs -------------------------------------------------------------
    rng = np.random.default_rng(1234)
    shapes = [(s["rows"], s["cols"]) for s in problem["shapes"]["verify"]]
    shapes += [BIG, VOCAB]
    if args.no_big_verify:
        shapes.remove(BIG)
    cases = []
    t0 = time.perf_counter()
    for dname, dist in problem["distributions"].items():
        for shape in shapes:
            x = make_input(dist, shape, rng)
            cases.append((dname, shape, x, softmax64(x)))
    print(f"{len(cases)} verification cases ({len(problem['distributions'])} distributions x {shapes}) "
          f"generated in {time.perf_counter() - t0:.1f}s")

    def verify(kernel):
        fails = []
        for dname, shape, x, ref in cases:
            y = np.full_like(x, np.nan)
            kernel(x, y)
            ok, msg = check(y, ref, tol)
            if not ok:
                fails.append(f"{dname} {shape[0]}x{shape[1]}: {msg}")
        return fails

    fails = verify(reference)
    print("reference:", "OK" if not fails else "FAIL\n  " + "\n  ".join(fails))

    # --- build + verify sample -----------------------------------------------
    xb = next((x for d, s, x, _ in cases if d == "normal" and s == BIG), None)
    if xb is None:
        xb = make_input(problem["distributions"]["normal"], BIG, rng)
    yb = np.empty_like(xb)

    results = []  # (point, kernel, fails, screen_time)
    n_build_fail = n_warn = 0
    t0 = time.perf_counter()
    for i, p in enumerate(sample):
        so, rc, err = build_point(fam, template, p, tmp, i)
        if rc:
            n_build_fail += 1
            print(f"BUILD FAIL {point_key(p)}\n{err}")
            continue
        if err:
            n_warn += 1
            print(f"WARNINGS {point_key(p)}\n{err}")
        k = Kernel(point_key(p), so, threads=p.get("threads"))
        fails = verify(k)
        screen = median_time(lambda: k(xb, yb), reps=3, warmup=1)
        results.append((p, k, fails, screen))
        status = "ok  " if not fails else f"FAIL({len(fails)})"
        print(f"[{i + 1:3d}/{len(sample)}] {status} {screen * 1e3:8.2f} ms  {point_key(p)}", flush=True)
        for f in fails[:3]:
            print(f"        {f}")
    print(f"built+verified {len(sample)} points in {time.perf_counter() - t0:.0f}s: "
          f"{n_build_fail} build failures, {n_warn} with warnings, "
          f"{sum(1 for r in results if r[2])} failing verification")

    # failure classes
    failing = [r for r in results if r[2]]
    if failing:
        print("failing points by flags/exp:")
        classes = {}
        for p, _, f, _ in failing:
            classes.setdefault((p.get("flags"), p.get("exp")), []).append(f[0].split(":")[0])
        for cls, where in sorted(classes.items(), key=str):
            print(f"  {cls}: {len(where)} points, e.g. first failure {where[0]}")
        nf = [r for r in failing if "fast-math" not in str(r[0].get("flags"))]
        print(f"  non-fast-math failing points: {len(nf)}")

    # --- careful timing of the best few --------------------------------------
    good = sorted((r for r in results if not r[2]), key=lambda r: r[3])
    if not good:
        print("no verified point to time")
        return 1
    top = good[: args.top]
    print(f"\nscreening (4096x4096, median of 3) top {len(top)}:")
    for p, _, _, t in top:
        print(f"  {t * 1e3:8.2f} ms  {point_key(p)}")

    reps = max(10, args.reps)
    summary = {}
    for shape in (BIG, VOCAB):
        x = next((x for d, s, x, _ in cases if d == "normal" and s == shape), None)
        if x is None:
            x = make_input(problem["distributions"]["normal"], shape, rng)
        y = np.empty_like(x)
        r_reps = reps if shape == BIG else reps * 20
        t_ref = median_time(lambda: reference(x, y), reps=max(10, reps // 2) if shape == BIG else r_reps)
        t_np = median_time(lambda: numpy_baseline(x, y), reps=r_reps)
        print(f"\n{shape[0]}x{shape[1]} (median of >= {min(r_reps, 10)} calls, OMP_NUM_THREADS="
              f"{os.environ['OMP_NUM_THREADS']}):")
        print(f"  reference_cpu.c  {t_ref * 1e3:9.3f} ms")
        print(f"  numpy baseline   {t_np * 1e3:9.3f} ms")
        gbytes = 8 * x.size / 1e9
        best = None
        for p, k, _, _ in top:
            t = median_time(lambda: k(x, y), reps=r_reps)
            print(f"  {t * 1e3:9.3f} ms  {gbytes / t:6.1f} GB/s  x{t_ref / t:6.1f} vs ref  "
                  f"x{t_np / t:5.1f} vs numpy  {point_key(p)}")
            if best is None or t < best[0]:
                best = (t, p)
        summary[shape] = (best, t_ref, t_np)

    print("\nsummary (best point per shape):")
    for shape, ((t, p), t_ref, t_np) in summary.items():
        print(f"  {shape[0]}x{shape[1]}: {t * 1e3:.3f} ms = x{t_ref / t:.1f} vs reference, "
              f"x{t_np / t:.1f} vs numpy  [{point_key(p)}]")
    (t, _), t_ref, t_np = summary[BIG]
    goal = t_ref / t >= 2 and t_np / t >= 3
    print(f"acceptance goal at 4096x4096 (>= 2x reference, >= 3x numpy): {'MET' if goal else 'NOT MET'}")
    if not args.keep:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if goal else 2


if __name__ == "__main__":
    sys.exit(main())

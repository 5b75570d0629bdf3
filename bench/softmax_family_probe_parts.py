"""bench/softmax_family_probe.py's parts: the cpu_c family's design space, building a point with gcc, the inputs
and the float64 check, and the timing helpers (the probe sets OMP_NUM_THREADS before it imports this)."""
from __future__ import annotations

import ctypes
import itertools
import math
import random
import statistics
import subprocess
import time
from pathlib import Path

import jinja2
import numpy as np
import yaml
from simpleeval import EvalWithCompoundTypes

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "kfactory" / "problems" / "softmax"
FAMILY = PROBLEM / "families" / "cpu_c"


# --------------------------------------------------------------------------- design space

def load_family():
    fam = yaml.safe_load((FAMILY / "family.yaml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return fam, env.from_string((FAMILY / fam["template"]).read_text())


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
    def __init__(self, name, so_path):
        self.name = name
        self.lib = ctypes.CDLL(str(so_path))
        self.fn = self.lib.kernel
        self.fn.restype = None
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]

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


def check(y, ref, tol, block=128):
    """Elementwise |y-ref| <= atol + rtol*|ref| and ||y-ref|| / ||ref|| <= norm_rel (row blocks: cache-friendly)."""
    if not np.all(np.isfinite(y)):
        return False, f"non-finite output ({int((~np.isfinite(y)).sum())} entries)"
    n_bad, worst, err2, ref2 = 0, None, 0.0, 0.0
    for r0 in range(0, y.shape[0], block):
        yb, rb = y[r0:r0 + block], ref[r0:r0 + block]
        err = np.abs(yb.astype(np.float64) - rb)
        excess = err - (tol["atol"] + tol["rtol"] * np.abs(rb))
        nb = int((excess > 0).sum())
        if nb:
            i = np.unravel_index(np.argmax(excess), excess.shape)
            if worst is None or excess[i] > worst[0]:
                worst = (excess[i], (i[0] + r0, i[1]), yb[i], rb[i])
            n_bad += nb
        err2 += float(np.dot(err.ravel(), err.ravel()))
        ref2 += float(np.dot(rb.ravel(), rb.ravel()))
    if n_bad:
        _, i, yv, rv = worst
        return False, f"elementwise: {n_bad} bad, worst at {i}: y={yv!r} ref={rv!r}"
    norm_rel = math.sqrt(err2) / max(math.sqrt(ref2), 1e-300)
    if norm_rel > tol["norm_rel"]:
        return False, f"norm_rel {norm_rel:.3g} > {tol['norm_rel']}"
    return True, f"norm_rel {norm_rel:.2g}"


# --------------------------------------------------------------------------- timing

def cpu_busy(interval=1.0):
    """Fraction of all CPUs busy over `interval` s (we sleep meanwhile), None if unknown."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:9]]
        return v[0] + v[1] + v[2] + v[5] + v[6] + v[7], sum(v)
    try:
        b0, t0 = snap()
        time.sleep(interval)
        b1, t1 = snap()
    except OSError:
        return None
    return (b1 - b0) / max(1, t1 - t0)


def wait_quiet(max_wait, threshold=0.05):
    t0 = time.monotonic()
    while True:
        busy = cpu_busy()
        if busy is None or busy < threshold:
            return True, busy
        if time.monotonic() - t0 > max_wait:
            return False, busy
        time.sleep(2)


def min_time(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def interleaved(cands, calls_per_round, rounds, seed=0):
    """cands: name -> zero-arg callable. Median per name over rounds x calls, order shuffled per round."""
    rng = random.Random(seed)
    names = list(cands)
    samples = {n: [] for n in names}
    for n in names:  # warm-up
        cands[n]()
    for _ in range(rounds):
        rng.shuffle(names)
        for n in names:
            fn = cands[n]
            for _ in range(calls_per_round):
                t0 = time.perf_counter()
                fn()
                samples[n].append(time.perf_counter() - t0)
    return {n: (statistics.median(v), min(v)) for n, v in samples.items()}


def numpy_baseline(x, y):
    m = x.max(axis=1, keepdims=True)
    np.subtract(x, m, out=y)
    np.exp(y, out=y)
    s = y.sum(axis=1, keepdims=True)
    np.divide(y, s, out=y)

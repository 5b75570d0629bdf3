"""Comparing a kernel's outputs with the float64 reference: every element, with figures.

Outputs of float32 or float64 against a float64 reference are compared in one pass by kfactory's own C helper
(numerics_fast.c, built once per host into the data directory and loaded here), the same figures as the numpy
path below at a fraction of its cost (issue 23: comparison was a large part of the judge's time); a large output
in parts of PARALLEL_CHUNK elements on the host's cores, merged in order (the sums' rounding aside, the figures of
one pass). Other dtypes, or a host where the helper cannot be built, take the numpy path.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import types
from pathlib import Path

import numpy as np

from kfactory.platform import hostthreads
from kfactory.targets.cuda.judge_kernels import STATS, merge
from kfactory.v1 import events_pb2 as pb


#: whether compare() uses the one-pass helper by default (Settings.compare_one_pass, set as services start)
ONE_PASS = True


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float, norm_rel: float,
            one_pass: bool | None = None) -> pb.Check:
    """A Check with max abs/rel error, norm-relative error, the worst element, and whether all pass.

    NaN or Inf in the output pass only where the reference has the same value; a poison value left in the
    output therefore fails, as does a NaN used as a wildcard. Outputs narrower than float32 (bfloat16, float16)
    are upcast to float64, chunk by chunk, before any error is computed. `one_pass=False` takes the numpy path
    where the one-pass helper would serve (tests hold the two to the same figures).
    """
    fast = _fast(out, ref) if (ONE_PASS if one_pass is None else one_pass) else None
    if fast is not None:
        return _from_stats(fast(out, ref, atol, rtol), out, atol, rtol, norm_rel)
    out = out.ravel()
    ref = ref.ravel()
    check = pb.Check()
    ref_finite = np.isfinite(ref)
    all_finite = bool(ref_finite.all())
    if not all_finite and not np.array_equal(out[~ref_finite].astype(np.float64), ref[~ref_finite],
                                             equal_nan=True):
        check.note = "NaN/Inf pattern differs from the reference"
        check.max_abs_err = check.max_rel_err = check.norm_rel_err = float("inf")
        return check
    out_bad = ~np.isfinite(out) & ref_finite
    if out_bad.any():
        idx = int(np.flatnonzero(out_bad)[0])
        check.max_abs_err = check.max_rel_err = check.norm_rel_err = float("inf")
        check.worst_index = idx
        check.note = (f"{int(out_bad.sum())} non-finite outputs where the reference is finite "
                      f"(first at {idx}: {out[idx]!r})")
        return check
    if not all_finite:  # compare the finite part only; the special values matched above
        out, ref = out[ref_finite], ref[ref_finite]
    _figures(check, out, ref, atol, rtol)
    if not all_finite:
        check.worst_index = int(np.flatnonzero(ref_finite)[check.worst_index])
    return _judge(check, norm_rel, out, ref, atol, rtol)


def outside_tolerance(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> np.ndarray:
    """compare's element rule as a mask over the flattened arrays: True where |out - ref| > atol + rtol |ref|
    (a NaN or an infinity is inside only where the reference has the same)."""
    o, r = np.asarray(out, dtype=np.float64).reshape(-1), np.asarray(ref, dtype=np.float64).reshape(-1)
    with np.errstate(invalid="ignore"):
        inside = (o == r) | (np.isnan(o) & np.isnan(r)) | (np.abs(o - r) <= atol + rtol * np.abs(r))
    return ~inside


def differing_elements(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements of two runs' outputs differ in value (a NaN equals a NaN, -0 equals 0): the count behind
    the judge's same-answer-twice checks, for any dtype the outputs have (bfloat16 included; integers as they
    are)."""
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    if a.dtype.kind in "iub":
        return int(np.count_nonzero(a != b))
    x, y = a.astype(np.float64), b.astype(np.float64)
    return int(np.count_nonzero(~((x == y) | (np.isnan(x) & np.isnan(y)))))


_NATIVE = (np.dtype(np.float32), np.dtype(np.float64))
CHUNK = 1 << 18  # elements per pass: temporaries stay in cache instead of faulting in fresh pages


def _figures(check: pb.Check, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> None:
    """Fill the error figures chunk by chunk, accumulating maxima and squared norms."""
    if out.size == 0:
        check.passed = True
        return
    diff_sq = ref_sq = 0.0
    max_abs = max_rel = 0.0
    worst, worst_excess = 0, -np.inf
    err = np.empty(min(CHUNK, out.size))
    mag = np.empty_like(err)
    for lo in range(0, out.size, CHUNK):
        o, r = out[lo:lo + CHUNK], ref[lo:lo + CHUNK]
        if o.dtype not in _NATIVE:
            o = o.astype(np.float64)   # bfloat16 (ml_dtypes) or float16: exact in float64
        e, m = err[:o.size], mag[:o.size]
        np.subtract(o, r, out=e, dtype=np.float64)
        # einsum, not dot: BLAS dot is slow on some builds here and its threads fight the kernel's
        diff_sq += float(np.einsum("i,i->", e, e))
        ref_sq += float(np.einsum("i,i->", r, r))
        np.abs(e, out=e)
        np.abs(r, out=m)
        max_abs = max(max_abs, float(e.max()))
        rel = np.divide(e, m, out=np.zeros_like(e), where=m > atol)
        max_rel = max(max_rel, float(rel.max()))
        m *= rtol
        m += atol
        e -= m  # excess over the allowed error: <= 0 everywhere when the check passes
        i = int(np.argmax(e))
        if e[i] > worst_excess:
            worst, worst_excess = lo + i, float(e[i])
    check.max_abs_err, check.max_rel_err, check.worst_index = max_abs, max_rel, worst
    check.passed = worst_excess <= 0
    diff_norm = float(np.sqrt(diff_sq))
    ref_norm = float(np.sqrt(ref_sq))
    check.norm_rel_err = diff_norm / ref_norm if ref_norm > 0 else diff_norm


def _judge(check: pb.Check, norm_rel: float, out, ref, atol: float, rtol: float) -> pb.Check:
    if not check.passed:
        i = check.worst_index
        check.note = f"element {i}: error exceeds atol {atol} + rtol {rtol} x |reference|"
        return check
    if check.norm_rel_err > norm_rel:
        check.passed = False
        check.note = f"norm-relative error {check.norm_rel_err:.3g} > {norm_rel}"
    return check


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_double) for n in ("diff_sq", "ref_sq", "max_abs", "max_rel", "worst_excess")] + \
               [(n, ctypes.c_int64) for n in ("worst", "finite", "pattern_bad", "out_bad", "out_bad_first")]


SOURCE = Path(__file__).with_name("numerics_fast.c")
#: -O3 vectorises the four-lane loop (a sixth faster than -O2 on 16M elements); no -ffast-math and no FMA
#: contraction (the sums stay the ones the C source writes), nothing host-specific (a data directory may be shared
#: by hosts of different CPUs)
HELPER_FLAGS = ("-O3", "-ffp-contract=off")


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The helper built (once per host and source) into the data directory, or None where it cannot be."""
    text = SOURCE.read_bytes() + " ".join(HELPER_FLAGS).encode()
    base = Path(os.environ.get("KFACTORY_DATA_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or
                                                                         Path.home() / ".cache") / "kfactory")
    so = base / "helpers" / f"compare-{hashlib.sha256(text).hexdigest()[:16]}.so"
    try:
        if not so.exists():
            so.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=so.parent, suffix=".so")
            os.close(fd)
            cc = os.environ.get("KFACTORY_CC", "cc")
            # no -ffast-math: NaN and Inf must compare as IEEE says
            subprocess.run([cc, *HELPER_FLAGS, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"], check=True,
                           capture_output=True, timeout=60)
            os.replace(tmp, so)
        lib = ctypes.CDLL(str(so))
    except (OSError, subprocess.SubprocessError):
        return None
    for name, ptr in (("kf_compare_f32", ctypes.c_float), ("kf_compare_f64", ctypes.c_double)):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.POINTER(ptr), ctypes.POINTER(ctypes.c_double), ctypes.c_int64, ctypes.c_double,
                       ctypes.c_double, ctypes.POINTER(_Stats)]
        fn.restype = None
    lib.kf_same_bytes.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.kf_same_bytes.restype = ctypes.c_int
    return lib


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool | None:
    """Whether two contiguous arrays of one size hold the same bytes (a memcmp, no temporaries); None where the
    helper cannot tell (other layouts, no helper): the caller compares with numpy."""
    if not ONE_PASS or a.nbytes != b.nbytes or not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    lib = _library()
    return None if lib is None else bool(lib.kf_same_bytes(a.ctypes.data, b.ctypes.data, a.nbytes))


_FAST = {np.dtype(np.float32): ("kf_compare_f32", ctypes.c_float), np.dtype(np.float64): ("kf_compare_f64",
                                                                                          ctypes.c_double)}


def _fast(out: np.ndarray, ref: np.ndarray):
    """The one-pass comparison for these arrays (read in place, no copies), or None for the numpy path."""
    if out.dtype not in _FAST or ref.dtype != np.float64 or out.size != ref.size or \
            not (out.flags.c_contiguous and ref.flags.c_contiguous):
        return None
    lib = _library()
    if lib is None:
        return None
    name, ctype = _FAST[out.dtype]
    fn = getattr(lib, name)

    def one(o, r, atol, rtol) -> _Stats:
        st = _Stats()
        fn(o.ctypes.data_as(ctypes.POINTER(ctype)), r.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), o.size,
           atol, rtol, ctypes.byref(st))
        return st

    def run(o, r, atol, rtol):
        if o.size <= PARALLEL_CHUNK:
            return one(o, r, atol, rtol)
        o, r = o.reshape(-1), r.reshape(-1)
        starts = list(range(0, o.size, PARALLEL_CHUNK))
        parts = hostthreads.each(lambda lo: one(o[lo:lo + PARALLEL_CHUNK], r[lo:lo + PARALLEL_CHUNK], atol, rtol),
                                 starts)
        return merged(parts, starts)
    return run


#: elements per part of a large comparison: the parts are compared at once on the host's cores
#: (kfactory.platform.hostthreads; ctypes lets go of the GIL) and merged in order, so the figures depend on this
#: size, never on how many threads there are (a 4096x4096 output is 4 parts)
PARALLEL_CHUNK = 1 << 22


def merged(parts: list, starts: list[int]) -> types.SimpleNamespace:
    """One comparison's figures from its parts' (each over the elements from its start on), as one pass over the
    whole would give them: the parts' indices made the whole's, then merged as the device's per-block partials
    are (kfactory.targets.cuda.judge_kernels.merge: sums added in order, maxima kept, the first index of the
    largest excess, the first non-finite output)."""
    p = np.array([tuple(getattr(part, field[0]) for field in _Stats._fields_) for part in parts], dtype=STATS)
    at = np.asarray(starts, dtype=np.int64)
    p["worst"] += at
    bad = p["out_bad"] > 0
    p["out_bad_first"][bad] += at[bad]
    return types.SimpleNamespace(**merge(p))


def check_from_figures(figures: dict, atol: float, rtol: float, norm_rel: float) -> pb.Check:
    """The Check the numpy path would build, from figures computed elsewhere (a device's comparison:
    kfactory.targets.cuda.judge_kernels.merge), the output itself not at hand."""
    return _from_stats(types.SimpleNamespace(**figures), None, atol, rtol, norm_rel)


def _from_stats(st, out: np.ndarray | None, atol: float, rtol: float, norm_rel: float) -> pb.Check:
    """The Check the numpy path would build, from the helper's figures (`out` for the first non-finite value's
    note, where the output is at hand)."""
    check = pb.Check()
    if st.pattern_bad:
        check.note = "NaN/Inf pattern differs from the reference"
        check.max_abs_err = check.max_rel_err = check.norm_rel_err = float("inf")
        return check
    if st.out_bad:
        idx = int(st.out_bad_first)
        check.max_abs_err = check.max_rel_err = check.norm_rel_err = float("inf")
        check.worst_index = idx
        value = "" if out is None else f": {out.reshape(-1)[idx]!r}"
        check.note = f"{int(st.out_bad)} non-finite outputs where the reference is finite (first at {idx}{value})"
        return check
    if st.finite == 0:
        check.passed = True
        return check
    check.max_abs_err, check.max_rel_err, check.worst_index = st.max_abs, st.max_rel, int(st.worst)
    check.passed = st.worst_excess <= 0
    diff_norm, ref_norm = float(np.sqrt(st.diff_sq)), float(np.sqrt(st.ref_sq))
    check.norm_rel_err = diff_norm / ref_norm if ref_norm > 0 else diff_norm
    return _judge(check, norm_rel, None, None, atol, rtol)

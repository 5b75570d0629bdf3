"""Comparing a kernel's outputs with the float64 reference: every element, with figures."""
from __future__ import annotations

import numpy as np

from kfactory.v1 import events_pb2 as pb


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float, norm_rel: float) -> pb.Check:
    """A Check with max abs/rel error, norm-relative error, the worst element, and whether all pass.

    NaN or Inf in the output pass only where the reference has the same value; a poison value left in the
    output therefore fails, as does a NaN used as a wildcard. Outputs narrower than float32 (bfloat16, float16)
    are upcast to float64, chunk by chunk, before any error is computed.
    """
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
        check.note = f"{int(out_bad.sum())} non-finite outputs where the reference is finite (first at {idx}: {out[idx]!r})"
        return check
    if not all_finite:  # compare the finite part only; the special values matched above
        out, ref = out[ref_finite], ref[ref_finite]
    _figures(check, out, ref, atol, rtol)
    if not all_finite:
        check.worst_index = int(np.flatnonzero(ref_finite)[check.worst_index])
    return _judge(check, norm_rel, out, ref, atol, rtol)


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

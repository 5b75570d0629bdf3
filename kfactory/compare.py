"""Comparing a kernel's outputs with the float64 reference: every element, with figures."""
from __future__ import annotations

import numpy as np

from kfactory.v1 import events_pb2 as pb


def compare(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float, norm_rel: float) -> pb.Check:
    """A Check with max abs/rel error, norm-relative error, the worst element, and whether all pass.

    NaN or Inf in the output pass only where the reference has the same value; a poison value left in the
    output therefore fails, as does a NaN used as a wildcard.
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


def _figures(check: pb.Check, out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> None:
    """Fill the error figures with as few full passes over the arrays as numpy allows."""
    if out.size == 0:
        return
    err = out.astype(np.float64)
    err -= ref
    diff_norm = float(np.sqrt(np.dot(err, err)))
    np.abs(err, out=err)
    mag = np.abs(ref)
    check.max_abs_err = float(err.max())
    rel = np.divide(err, mag, out=np.zeros_like(err), where=mag > atol)
    check.max_rel_err = float(rel.max())
    mag *= rtol
    mag += atol
    err -= mag  # now: excess over the allowed error, <= 0 everywhere when the check passes
    check.worst_index = int(np.argmax(err))
    check.passed = bool(err[check.worst_index] <= 0)
    ref_norm = float(np.sqrt(np.dot(ref, ref)))
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

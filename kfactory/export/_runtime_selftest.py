"""Part of the exported kernel's Python module (the template is _runtime.py, which names the parts): selftest(),
the kernel on fresh random inputs against the problem's float64 reference, as kfactory's verifier judges it.

kfactory export appends this text after _runtime_load.py's without the docstring and the imports from kfactory,
which are here only so that linters read this file as the module it becomes."""
from __future__ import annotations

import secrets

import numpy as np

from kfactory.export._runtime import _CONFIG, _kf_dtype, _kf_name, _kf_params, _kf_shape
from kfactory.export._runtime_load import _kf_call

# -- selftest ---------------------------------------------------------------------------------------------------

def _kf_draw(rng, d: dict, shape: tuple, dtype: str) -> np.ndarray:
    """One input drawn as kfactory's verifier draws it (kfactory.judge.inputs.draw)."""
    if dtype == "bfloat16" and _kf_dtype("bfloat16") == np.uint16:
        raise RuntimeError(f"{_kf_name()}.selftest needs ml_dtypes for bfloat16 inputs: pip install ml_dtypes")
    if d["kind"] in ("ggml_q4_1", "ggml_q8_0"):
        return _kf_ggml_blocks(rng, d, shape)
    draw_dtype = np.dtype(np.float32) if dtype == "bfloat16" else np.dtype(dtype)
    if d["kind"] == "constant":
        a = np.full(shape, d["value"], dtype=draw_dtype)
    else:
        if d["kind"] == "normal":
            a = rng.standard_normal(shape, dtype=np.float32 if draw_dtype == np.float32 else np.float64)
            a = a * d["std"] + d["mean"]
        else:
            a = rng.uniform(d["low"], d["high"], shape)
        if d["transform"] == "sigmoid":
            a = 0.5 * (1.0 + np.tanh(0.5 * a))
        elif d["transform"] == "logsigmoid":
            a = -np.logaddexp(0.0, -a)
        a = (a * d["factor"] if d["factor"] != 1.0 else a).astype(draw_dtype, copy=False)
    a = a.astype(_kf_dtype(dtype), copy=False)
    if d["neg_inf_fraction"] > 0:   # -inf entries, one finite entry kept per last-axis row
        mask = rng.random(a.shape) < d["neg_inf_fraction"]
        rows = mask.reshape(-1, a.shape[-1])
        rows[np.arange(rows.shape[0]), rng.integers(0, a.shape[-1], size=rows.shape[0])] = False
        a[mask] = -np.inf
    return np.ascontiguousarray(a)


def _kf_ggml_blocks(rng, d: dict, shape: tuple) -> np.ndarray:
    """GGUF blocks drawn as kfactory's verifier draws them (kfactory.judge.inputs.ggml_blocks): the same bytes
    for the same generator state, so one seed reproduces a failure in either."""
    n = int(np.prod(shape[:-1]))
    w = rng.standard_normal((n, 32)) * d["std"] + d["mean"]
    q4 = d["kind"] == "ggml_q4_1"
    if q4:
        scale, offset, qmin, qmax = (w.max(axis=1) - w.min(axis=1)) / 15, w.min(axis=1), 0, 15
    else:
        scale, offset, qmin, qmax = np.abs(w).max(axis=1) / 127, np.zeros(n), -127, 127
    scale = np.minimum(scale, 65504.0).astype("<f2")            # the largest finite float16
    offset = np.clip(offset, -65504.0, 65504.0).astype("<f2")
    s64 = scale.astype(np.float64)
    inv = np.divide(1.0, s64, out=np.zeros(n), where=s64 > 0)[:, None]
    q = np.clip(np.floor((w - offset.astype(np.float64)[:, None]) * inv + 0.5), qmin, qmax).astype(np.int16)
    if d["special_fraction"] > 0:   # edge-case blocks: d = 0, all codes max, all codes min, d negated
        special = rng.random(n) < d["special_fraction"]
        case = rng.integers(0, 4, size=n)
        scale[special & (case == 0)] = 0
        q[special & (case == 1)] = qmax
        q[special & (case == 2)] = 0 if q4 else -128
        scale[special & (case == 3)] *= -1
    if q4:
        parts = [scale.view(np.uint8).reshape(n, 2), offset.view(np.uint8).reshape(n, 2),
                 (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)]
    else:
        parts = [scale.view(np.uint8).reshape(n, 2), q.astype(np.int8).view(np.uint8)]
    return np.ascontiguousarray(np.concatenate(parts, axis=1).reshape(shape))


def _kf_float64(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:   # raw bfloat16 bits
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _kf_compare(out: np.ndarray, ref: np.ndarray, tol: dict) -> str:
    """'' when `out` matches the float64 reference as kfactory's verifier requires (kfactory.judge.numerics), else
    why not: NaN/Inf only where the reference has them, every element within atol + rtol x |reference|, and the
    norm-relative error within norm_rel."""
    o, r = _kf_float64(out).ravel(), np.asarray(ref, dtype=np.float64).ravel()
    finite = np.isfinite(r)
    if not finite.all() and not np.array_equal(o[~finite], r[~finite], equal_nan=True):
        return "NaN/Inf pattern differs from the reference"
    bad = ~np.isfinite(o) & finite
    if bad.any():
        return f"{int(bad.sum())} non-finite outputs where the reference is finite"
    o, r = o[finite], r[finite]
    err = np.abs(o - r)
    allowed = tol["atol"] + tol["rtol"] * np.abs(r)
    if (err > allowed).any():
        i = int(np.argmax(err - allowed))
        return f"element {i}: |{o[i]!r} - {r[i]!r}| = {err[i]:.3g} > atol + rtol x |reference| = {allowed[i]:.3g}"
    ref_norm = float(np.linalg.norm(r))
    norm = float(np.linalg.norm(o - r)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(o - r))
    if norm > tol["norm_rel"]:
        return f"norm-relative error {norm:.3g} > {tol['norm_rel']}"
    return ""


class SelftestUnavailable(RuntimeError):
    """selftest() has no reference to compare with: the problem's reference could not be embedded standalone."""


def selftest(seed: int | None = None, verbose: bool = False, **params) -> int:
    """Run the kernel on fresh random inputs (every distribution the problem declares, at its verification
    shapes) and compare with the problem's float64 reference under its tolerances; `params` (keyword
    arguments, as the kernel function takes them) run both at other values of the problem's params than its
    own. Returns the number of checks; raises AssertionError naming the shape, distribution and seed of the
    first mismatch, and SelftestUnavailable when the problem's reference could not be embedded in this module."""
    reference = globals().get("_kf_reference")
    if reference is None:
        raise SelftestUnavailable(f"{_kf_name()}.selftest: {_CONFIG['reference_missing']}")
    seed = secrets.randbits(63) if seed is None else seed
    rng = np.random.default_rng(seed)
    kernel_params = _kf_params(params)
    # the reference takes every param (those compiled into the kernel at their values), the kernel its own
    ref_params = {**{n: p["value"] for n, p in _CONFIG.get("params", {}).items()}, **kernel_params}
    checks = 0
    for shape in _CONFIG["selftest_shapes"]:
        for dist_name, dist in _CONFIG["distributions"].items():
            inputs = [_kf_draw(rng, dist[s["name"]], _kf_shape(s, shape), s["dtype"]) for s in _CONFIG["inputs"]]
            got = _kf_call(tuple(inputs), None, kernel_params)
            got = got if isinstance(got, tuple) else (got,)
            want = reference({s["name"]: a for s, a in zip(_CONFIG["inputs"], inputs)}, **ref_params)
            for spec, o in zip(_CONFIG["outputs"], got):
                why = _kf_compare(o, want[spec["name"]], _CONFIG["tolerance"][spec["dtype"]])
                where = f"output {spec['name']!r} at {shape} ({dist_name}, seed {seed}" + "".join(
                    f", {k}={v!r}" for k, v in params.items()) + ")"
                if why:
                    raise AssertionError(f"{_kf_name()}.selftest: {where}: {why}")
                if verbose:
                    print(f"ok {where}")
                checks += 1
    return checks

"""Drawing inputs from a problem's declared distributions, with a seed recorded for each draw."""
from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np

from kfactory.problems import Problem

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)  # importing ml_dtypes also makes np.dtype("bfloat16") work


def fresh_seed() -> int:
    """A seed nobody could have predicted (kernels cannot have memorised inputs drawn from it)."""
    return secrets.randbits(63)


def draw(problem: Problem, shape: dict[str, int], dist_name: str, seed: int) -> dict[str, np.ndarray]:
    """Every input of the problem at a shape, drawn from the named distribution."""
    rng = np.random.default_rng(seed)
    dist = problem.spec.distributions[dist_name]
    out = {}
    for t in problem.spec.inputs:
        d = dist[t.name]
        tshape = problem.tensor_shape(t, shape)
        dtype = np.dtype(t.dtype)
        if dtype == BFLOAT16:   # drawn in float32, rounded to nearest bf16
            a = _draw(rng, d, tshape, np.dtype(np.float32)).astype(BFLOAT16)
        else:
            a = _draw(rng, d, tshape, dtype)
        if d.neg_inf_fraction > 0:
            _mask_neg_inf(a, d.neg_inf_fraction, rng)
        out[t.name] = np.ascontiguousarray(a)
    return out


def _draw(rng: np.random.Generator, d, tshape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if d.kind == "constant":
        return np.full(tshape, d.value, dtype=dtype)
    if d.kind == "normal":
        a = rng.standard_normal(tshape, dtype=np.float32 if dtype == np.float32 else np.float64)
        a = a * d.std + d.mean
    else:
        a = rng.uniform(d.low, d.high, tshape)
    return _transform(a, d).astype(dtype, copy=False)


def _transform(a: np.ndarray, d) -> np.ndarray:
    """factor * transform(a), computed in a's precision before the cast to the tensor's dtype."""
    if d.transform == "sigmoid":
        a = 0.5 * (1.0 + np.tanh(0.5 * a))   # the tanh form never overflows
    elif d.transform == "logsigmoid":
        a = -np.logaddexp(0.0, -a)            # log(1 / (1 + exp(-a))), stable for any a
    return a * d.factor if d.factor != 1.0 else a


def _mask_neg_inf(a: np.ndarray, fraction: float, rng: np.random.Generator) -> None:
    """Set a fraction of entries to -inf, keeping one finite entry per last-axis row at a random place."""
    mask = rng.random(a.shape) < fraction
    rows = mask.reshape(-1, a.shape[-1])
    keep = rng.integers(0, a.shape[-1], size=rows.shape[0])
    rows[np.arange(rows.shape[0]), keep] = False
    a[mask] = -np.inf


def empty_outputs(problem: Problem, shape: dict[str, int]) -> dict[str, np.ndarray]:
    return {t.name: np.empty(problem.tensor_shape(t, shape), dtype=t.dtype) for t in problem.spec.outputs}

"""Drawing inputs from a problem's declared distributions, with a seed recorded for each draw."""
from __future__ import annotations

import secrets

import numpy as np

from kfactory.judge import counter_rng
from kfactory.problems import Problem
from kfactory.problems.spec import GGML_BLOCK_BYTES


def fresh_seed() -> int:
    """A seed nobody could have predicted (kernels cannot have memorised inputs drawn from it)."""
    return secrets.randbits(63)


def draw(problem: Problem, shape: dict[str, int], dist_name: str, seed: int) -> dict[str, np.ndarray]:
    """Every input of the problem at a shape, drawn from the named distribution ("device:NAME": as a GPU drew it
    with the judge's counter-based generator, kfactory.judge.counter_rng)."""
    if dist_name.startswith(counter_rng.PREFIX):
        return counter_rng.draw(problem, shape, dist_name.removeprefix(counter_rng.PREFIX), seed)
    rng = np.random.default_rng(seed)
    dist = problem.spec.distributions[dist_name]
    out = {}
    for t in problem.spec.inputs:
        d = dist[t.name]
        tshape = problem.tensor_shape(t, shape)
        dtype = np.dtype(t.dtype)
        if d.kind in GGML_BLOCK_BYTES:
            a = ggml_blocks(rng, d, tshape)
        elif t.dtype == "bfloat16":   # drawn in float32, rounded to nearest bf16 (the spec registered the dtype)
            a = _draw(rng, d, tshape, np.dtype(np.float32)).astype(dtype)
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
        # in place: the same values as a * std + mean, without two temporaries of the set's size (a fresh large
        # array is page faults, which cost more than the arithmetic on this kind of host)
        a *= d.std
        a += d.mean
    else:
        a = rng.uniform(d.low, d.high, tshape)
    return _transform(a, d).astype(dtype, copy=False)


#: the largest finite float16: a block's scale is clipped to it (a larger one would be stored as inf)
FP16_MAX = 65504.0


def ggml_blocks(rng: np.random.Generator, d, tshape: tuple[int, ...]) -> np.ndarray:
    """GGUF blocks (uint8, last axis one block's bytes) quantising normal(d.mean, d.std) weights as llama.cpp's
    reference quantisers do: Q4_1 stores fp16 d = (max - min) / 15 and m = min of its 32 weights, then nibbles q
    (byte j: element j low, element j + 16 high), value d*q + m; Q8_0 stores fp16 d = max|w| / 127 then int8 q,
    value d*q. A `special_fraction` of the blocks is an edge case: d = 0, every code at its largest (15, 127) or
    smallest (0, -128) value, or d negated. The export's selftest draws the same bytes (_runtime_selftest)."""
    nblk = int(np.prod(tshape[:-1]))
    w = rng.standard_normal((nblk, 32)) * d.std + d.mean
    q4 = d.kind == "ggml_q4_1"
    if q4:
        lo, hi = w.min(axis=1), w.max(axis=1)
        scale, offset = (hi - lo) / 15, lo
        qmin, qmax = 0, 15
    else:
        scale, offset = np.abs(w).max(axis=1) / 127, np.zeros(nblk)
        qmin, qmax = -127, 127
    scale = np.minimum(scale, FP16_MAX).astype("<f2")
    offset = np.clip(offset, -FP16_MAX, FP16_MAX).astype("<f2")
    s64 = scale.astype(np.float64)
    inv = np.divide(1.0, s64, out=np.zeros(nblk), where=s64 > 0)[:, None]
    q = np.clip(np.floor((w - offset.astype(np.float64)[:, None]) * inv + 0.5), qmin, qmax).astype(np.int16)
    if d.special_fraction > 0:
        special = rng.random(nblk) < d.special_fraction
        case = rng.integers(0, 4, size=nblk)
        scale[special & (case == 0)] = 0
        q[special & (case == 1)] = qmax
        q[special & (case == 2)] = 0 if q4 else -128
        scale[special & (case == 3)] *= -1
    head = [scale.view(np.uint8).reshape(nblk, 2)]
    if q4:
        head.append(offset.view(np.uint8).reshape(nblk, 2))
        body = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    else:
        body = q.astype(np.int8).view(np.uint8)
    return np.concatenate(head + [body], axis=1).reshape(tshape)


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

"""The host twin of kfactory's counter-based input generator (kfactory/targets/cuda/judge/kf_draw.h).

A verification input drawn on a GPU is a function of (seed, tensor index, element index) alone: Philox4x32-10 keyed
by the seed, then IEEE double arithmetic in a fixed order (the logarithm and cosine of Box-Muller as short
polynomials written out on both sides). This module computes the same bits with numpy, so that the judge
reproduces any element, row or whole set of a device-drawn input from the recorded seed: a failing row is shown
and kept as a regression input without the device. tests/test_counter_draw.py holds the C source, built for the
host, to these functions bit for bit.

What it draws: the float32 and bfloat16 inputs of distributions of kind normal, uniform or constant, with
`neg_inf_fraction` (each row keeps one column finite); `device_drawable` says why any other input is drawn on
the host instead (GGUF blocks, a transform, integer tensors).
"""
from __future__ import annotations

import numpy as np

from kfactory.problems import Problem
from kfactory.problems.spec import register_bfloat16

#: a check's distribution label for inputs this generator drew ("device:normal"): the label a regression input
#: keeps, so that the input is drawn again by this twin, not by numpy's generator (kfactory.judge.inputs.draw)
PREFIX = "device:"

#: distribution kinds and output dtypes as kf_draw.h numbers them
KINDS = {"normal": 0, "uniform": 1, "constant": 2}
DTYPES = {"float32": 0, "bfloat16": 1}
#: the Philox4x32 multipliers and Weyl key increments (Salmon et al., SC 2011)
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)
#: the streams of one tensor's counters: the value, the -inf mask's draw, a row's kept column
VALUE, MASK, KEEP = 0, 1, 2

_LOG = (0.043478260869565216, 0.047619047619047616, 0.05263157894736842, 0.058823529411764705,
        0.06666666666666667, 0.07692307692307693, 0.09090909090909091, 0.1111111111111111, 0.14285714285714285,
        0.2, 0.3333333333333333, 1.0)
_COS = (4.779477332387385e-14, -1.1470745597729725e-11, 2.08767569878681e-09, -2.755731922398589e-07,
        2.48015873015873e-05, -0.001388888888888889, 0.041666666666666664, -0.5, 1.0)
_SIN = (2.8114572543455206e-15, -7.647163731819816e-13, 1.6059043836821613e-10, -2.505210838544172e-08,
        2.7557319223985893e-06, -0.0001984126984126984, 0.008333333333333333, -0.16666666666666666, 1.0)


def philox(counter: np.ndarray, seed: int) -> np.ndarray:
    """Philox4x32-10 of counters (uint32, shape (n, 4)) under the 64-bit seed as key: uint32 words (n, 4)."""
    c = [counter[:, j].astype(np.uint64) for j in range(4)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(_W0)) & _MASK32, (k1 + np.uint64(_W1)) & _MASK32
        p0, p1 = np.uint64(_M0) * c[0], np.uint64(_M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & _MASK32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & _MASK32]
    return np.stack(c, axis=1).astype(np.uint32)


def _counters(index: np.ndarray, tensor: int, stream: int) -> np.ndarray:
    index = index.astype(np.uint64)
    out = np.empty((index.size, 4), dtype=np.uint32)
    out[:, 0] = index & _MASK32
    out[:, 1] = index >> np.uint64(32)
    out[:, 2] = tensor
    out[:, 3] = stream
    return out


def unit(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[0, 1) on the 2^-53 grid from two words (exact)."""
    return ((a >> 5).astype(np.float64) * 67108864.0 + (b >> 6).astype(np.float64)) * (1.0 / 9007199254740992.0)


def _horner(coefficients: tuple[float, ...], z: np.ndarray) -> np.ndarray:
    p = np.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        p = p * z + c
    return p


def log_unit(u: np.ndarray) -> np.ndarray:
    """log(u) for u in (0, 1], as kf_log computes it."""
    m, e = np.frexp(u)
    low = m < 0.7071067811865476
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e)
    s = (m - 1.0) / (m + 1.0)
    return e.astype(np.float64) * 0.6931471805599453 + 2.0 * s * _horner(_LOG, s * s)


def cos2pi(u: np.ndarray) -> np.ndarray:
    """cos(2 pi u) for u in [0, 1), as kf_cos2pi computes it."""
    t = u * 4.0
    q = np.floor(t)
    f = t - q
    fold = f > 0.5
    g = np.where(fold, 1.0 - f, f)
    a = g * 1.5707963267948966
    a2 = a * a
    c, s = _horner(_COS, a2), _horner(_SIN, a2) * a
    cos_t, sin_t = np.where(fold, s, c), np.where(fold, c, s)
    k = q.astype(np.int64)
    return np.select([k == 0, k == 1, k == 2], [cos_t, -sin_t, -cos_t], sin_t)


def values(index: np.ndarray, tensor: int, seed: int, kind: str, a: float, b: float) -> np.ndarray:
    """Elements `index` of a tensor before the -inf mask, in double (kf_value)."""
    if kind == "constant":
        return np.full(index.size, a, dtype=np.float64)
    w = philox(_counters(index, tensor, VALUE), seed)
    if kind == "uniform":
        return a + (b - a) * unit(w[:, 0], w[:, 1])
    u1, u2 = 1.0 - unit(w[:, 0], w[:, 1]), unit(w[:, 2], w[:, 3])
    return a + b * (np.sqrt(-2.0 * log_unit(u1)) * cos2pi(u2))


def masked(index: np.ndarray, cols: int, tensor: int, seed: int, fraction: float) -> np.ndarray:
    """Whether each element is -inf (kf_masked): a `fraction` of each row, one column per row kept finite."""
    if fraction <= 0:
        return np.zeros(index.size, dtype=bool)
    index = index.astype(np.uint64)
    rows, col = index // np.uint64(cols), index % np.uint64(cols)
    keep = philox(_counters(rows, tensor, KEEP), seed)[:, 0].astype(np.uint64) % np.uint64(cols)
    w = philox(_counters(index, tensor, MASK), seed)
    return (col != keep) & (unit(w[:, 0], w[:, 1]) < fraction)


def params(d) -> tuple[str, float, float]:
    """(kind, a, b) of a distribution as kf_draw takes them: normal (mean, std), uniform (low, high), constant
    (value, 0)."""
    if d.kind == "normal":
        return d.kind, float(d.mean), float(d.std)
    if d.kind == "uniform":
        return d.kind, float(d.low), float(d.high)
    return d.kind, float(d.value), 0.0


def elements(d, dtype: str, cols: int, tensor: int, seed: int, index: np.ndarray) -> np.ndarray:
    """Elements `index` (flat, row-major; rows of `cols`) of one input tensor, as the device draws them."""
    kind, a, b = params(d)
    x = values(index, tensor, seed, kind, a, b).astype(np.float32)
    x[masked(index, cols, tensor, seed, float(d.neg_inf_fraction))] = -np.inf
    if dtype == "float32":
        return x
    register_bfloat16()
    return x.astype(np.dtype(dtype))   # rounded to nearest even, as kf_bf16 does


def device_drawable(problem: Problem, dist_name: str) -> str | None:
    """None when every input of the distribution can be drawn by the counter-based generator; else why not."""
    dist = problem.spec.distributions[dist_name]
    for t in problem.spec.inputs:
        d = dist[t.name]
        if d.kind not in KINDS:
            return f"{t.name} is drawn as {d.kind}; the device draws {', '.join(KINDS)}"
        if t.dtype not in DTYPES:
            return f"{t.name} is {t.dtype}; the device draws {', '.join(DTYPES)}"
        if d.transform != "none" or d.factor != 1.0:
            return f"{t.name} is mapped by {d.transform} x {d.factor}; the device draws unmapped values"
    return None


def draw(problem: Problem, shape: dict[str, int], dist_name: str, seed: int,
         rows: slice | None = None) -> dict[str, np.ndarray]:
    """Every input of the problem at a shape as the device draws it from `seed` (tensor index = the input's place
    in the spec); `rows`: only those rows (along the last axis) of each tensor that has more than one, as
    (len, cols) arrays, and a one-row tensor (a weight vector) whole (a failing row reproduced with what it
    needs)."""
    why = device_drawable(problem, dist_name)
    if why is not None:
        raise ValueError(f"{problem.name} {dist_name}: {why}")
    dist = problem.spec.distributions[dist_name]
    out = {}
    for k, t in enumerate(problem.spec.inputs):
        tshape = problem.tensor_shape(t, shape)
        cols = int(tshape[-1]) if tshape else 1
        n = int(np.prod(tshape, dtype=np.int64))
        whole = rows is None or n <= cols
        lo, hi = (0, n // max(cols, 1)) if rows is None or whole else (rows.start or 0, rows.stop)
        index = np.arange(lo * cols, min(hi * cols, n), dtype=np.uint64)
        a = elements(dist[t.name], t.dtype, cols, k, seed, index)
        out[t.name] = a.reshape(tshape) if whole else a.reshape(-1, cols)
    return out

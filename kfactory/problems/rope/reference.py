"""rope: the float64 reference and the numpy baseline (adjacent-pair layout, as kfactory.models.reference.rope)."""
from __future__ import annotations

import numpy as np


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, P, 2] rotated pair by pair by the angles whose cos/sin are [T, P], in float64."""
    x = x.astype(np.float64)
    c = cos.astype(np.float64)[:, None, :]
    s = sin.astype(np.float64)[:, None, :]
    x0, x1 = x[..., 0], x[..., 1]
    return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """qr, kr: q and k rotated by each token's row of the cos/sin tables."""
    c, s = inputs["rcos"], inputs["rsin"]
    return {"qr": rotate(inputs["q"], c, s), "kr": rotate(inputs["k"], c, s)}


def numpy_rope(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], threads: int) -> None:
    """What a careful numpy user writes: strided views of the pairs, written into the preallocated outputs."""
    c = inputs["rcos"][:, None, :]
    s = inputs["rsin"][:, None, :]
    for src, dst in (("q", "qr"), ("k", "kr")):
        x, y = inputs[src], outputs[dst]
        x0, x1 = x[..., 0], x[..., 1]
        np.multiply(x0, c, out=y[..., 0])
        y[..., 0] -= x1 * s
        np.multiply(x0, s, out=y[..., 1])
        y[..., 1] += x1 * c


def baselines() -> dict:
    """Baselines available here: name -> fn(inputs, outputs, threads) writing outputs."""
    return {"numpy": numpy_rope}

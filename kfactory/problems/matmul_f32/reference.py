"""matmul_f32: the float64 reference and a numpy baseline.

w is fp32 [rows, cols] row-major (a model's projection, one output feature a row), x is fp32 [n, cols] (n
tokens); y[t, r] = sum_c x[t, c] * w[r, c], that is Y = X W^T, y fp32 [n, rows].
"""
from __future__ import annotations

import numpy as np


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Y = X W^T with every product and sum in float64 (the fp32 inputs are exact in float64)."""
    return {"y": inputs["x"].astype(np.float64) @ inputs["w"].astype(np.float64).T}


def numpy_matmul(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], threads: int) -> None:
    """What a numpy user writes: x @ w.T in float32 (BLAS sgemm)."""
    np.matmul(inputs["x"], inputs["w"].T, out=outputs["y"])


def baselines() -> dict:
    """Baselines available in this environment: name -> fn(inputs, outputs, threads) writing outputs."""
    return {"numpy": numpy_matmul}

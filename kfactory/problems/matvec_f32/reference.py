"""matvec_f32: the float64 reference and a numpy baseline.

w is fp32 [rows, cols], row-major; x is fp32 [cols]; y[r] = sum_c w[r, c] * x[c].
"""
from __future__ import annotations

import numpy as np

#: rows converted to float64 at once: bounds the temporaries (4096 x 1536 x 8 bytes = 50 MB)
ROWS_PER_CHUNK = 4096


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """y = w @ x, every product and sum in float64 (the fp32 inputs are exact in float64)."""
    w, x = inputs["w"], inputs["x"].astype(np.float64)
    y = np.empty(w.shape[0], dtype=np.float64)
    for lo in range(0, w.shape[0], ROWS_PER_CHUNK):
        y[lo:lo + ROWS_PER_CHUNK] = w[lo:lo + ROWS_PER_CHUNK].astype(np.float64) @ x
    return {"y": y}


def numpy_matvec(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], threads: int) -> None:
    """What a numpy user writes: w @ x in float32 (BLAS sgemv)."""
    np.matmul(inputs["w"], inputs["x"], out=outputs["y"])


def baselines() -> dict:
    """Baselines available in this environment: name -> fn(inputs, outputs, threads) writing outputs."""
    return {"numpy": numpy_matvec}

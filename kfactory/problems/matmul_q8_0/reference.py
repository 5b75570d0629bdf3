"""matmul_q8_0: the float64 reference and a numpy baseline.

w holds GGUF Q8_0 blocks, row-major [rows, blocks, 34]: bytes 0-1 the fp16 scale d (little-endian), 2-33 the
codes q as int8; element c of the block is d * q_c. x is [n, blocks, 32] (n tokens);
y[t, r] = sum_c w[r, c] x[t, c].
"""
from __future__ import annotations

import numpy as np

#: rows dequantised at once: bounds the float64 temporaries (4096 x 18 x 32 x 8 bytes = 19 MB at the LM head)
ROWS_PER_CHUNK = 4096


def dequantise(w: np.ndarray) -> np.ndarray:
    """The element values of Q8_0 blocks (uint8 [..., 34]) as float64 [..., 32], exactly."""
    d = np.ascontiguousarray(w[..., 0:2]).view("<f2").astype(np.float64)
    q = np.ascontiguousarray(w[..., 2:34]).view(np.int8).astype(np.float64)
    return d * q


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Y = X dequantise(W)^T, dequantised exactly and summed in float64."""
    w = inputs["w"]
    x = inputs["x"].astype(np.float64).reshape(inputs["x"].shape[0], -1)
    y = np.empty((x.shape[0], w.shape[0]), dtype=np.float64)
    for lo in range(0, w.shape[0], ROWS_PER_CHUNK):
        chunk = dequantise(w[lo:lo + ROWS_PER_CHUNK])
        y[:, lo:lo + ROWS_PER_CHUNK] = x @ chunk.reshape(chunk.shape[0], -1).T
    return {"y": y}


def numpy_matmul(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], threads: int) -> None:
    """What a numpy user writes: dequantise to float32 (every call: the weights stay quantised), then x @ w.T."""
    w, x = inputs["w"], inputs["x"]
    d = np.ascontiguousarray(w[..., 0:2]).view("<f2").astype(np.float32)
    vals = np.ascontiguousarray(w[..., 2:34]).view(np.int8).astype(np.float32) * d
    np.matmul(x.reshape(x.shape[0], -1), vals.reshape(w.shape[0], -1).T, out=outputs["y"])


def baselines() -> dict:
    """Baselines available in this environment: name -> fn(inputs, outputs, threads) writing outputs."""
    return {"numpy": numpy_matmul}

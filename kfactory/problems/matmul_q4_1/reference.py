"""matmul_q4_1: the float64 reference and a numpy baseline.

w holds GGUF Q4_1 blocks, row-major [rows, blocks, 20]: bytes 0-1 the fp16 scale d, 2-3 the fp16 offset m
(little-endian), 4-19 the codes, byte j holding element j in its low nibble and element j + 16 in its high
nibble; element c of the block is d * q_c + m. x is [n, blocks, 32] (n tokens); y[t, r] = sum_c w[r, c] x[t, c].
"""
from __future__ import annotations

import numpy as np

#: rows dequantised at once: bounds the float64 temporaries (4096 x 48 x 32 x 8 bytes = 50 MB)
ROWS_PER_CHUNK = 4096


def dequantise(w: np.ndarray) -> np.ndarray:
    """The element values of Q4_1 blocks (uint8 [..., 20]) as float64 [..., 32]: exact (an fp16 times a 4-bit
    integer plus an fp16 fits in a double's 53 bits)."""
    d = np.ascontiguousarray(w[..., 0:2]).view("<f2").astype(np.float64)
    m = np.ascontiguousarray(w[..., 2:4]).view("<f2").astype(np.float64)
    qs = w[..., 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float64)
    return d * q + m


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
    m = np.ascontiguousarray(w[..., 2:4]).view("<f2").astype(np.float32)
    qs = w[..., 4:20]
    vals = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32) * d + m
    np.matmul(x.reshape(x.shape[0], -1), vals.reshape(w.shape[0], -1).T, out=outputs["y"])


def baselines() -> dict:
    """Baselines available in this environment: name -> fn(inputs, outputs, threads) writing outputs."""
    return {"numpy": numpy_matmul}

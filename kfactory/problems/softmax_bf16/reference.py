"""softmax_bf16: the float64 reference and the baselines (torch on CUDA only)."""
from __future__ import annotations

import numpy as np

ROWS_PER_CHUNK = 1024  # bounds the float64 temporaries at 16384 x 8192


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Row-wise softmax in float64 (bf16 inputs are exact in float64); -inf entries get probability 0."""
    x = inputs["x"]
    y = np.empty(x.shape, dtype=np.float64)
    for lo in range(0, x.shape[0], ROWS_PER_CHUNK):
        xc = x[lo:lo + ROWS_PER_CHUNK].astype(np.float64)
        e = np.exp(xc - xc.max(axis=-1, keepdims=True))
        y[lo:lo + ROWS_PER_CHUNK] = e / e.sum(axis=-1, keepdims=True)
    return {"y": y}


def baselines() -> dict:
    """No cpu baselines: softmax_bf16 is a cuda problem."""
    return {}


def cuda_baselines() -> dict:
    """name -> fn(ins, outs) over dicts of torch CUDA tensors, writing outs["y"]; {} without torch or a GPU.
    torch.softmax on a bf16 tensor computes in fp32 and rounds once."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}

    def run(ins, outs):
        torch.softmax(ins["x"], dim=-1, out=outs["y"])

    return {"torch": run}

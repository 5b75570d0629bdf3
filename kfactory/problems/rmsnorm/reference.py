"""rmsnorm: the float64 reference and the baselines (torch on CUDA; QuACK where importable). eps is the problem's
param (problem.yaml `params:`), given to each function as a keyword argument."""
from __future__ import annotations

import numpy as np

ROWS_PER_CHUNK = 1024  # bounds the float64 temporaries at 32768 x 8192


def reference(inputs: dict[str, np.ndarray], *, eps: float) -> dict[str, np.ndarray]:
    """y = x / sqrt(mean(x^2) + eps) * w in float64 (bf16 inputs are exact in float64)."""
    x, w = inputs["x"], inputs["w"].astype(np.float64)
    y = np.empty(x.shape, dtype=np.float64)
    for lo in range(0, x.shape[0], ROWS_PER_CHUNK):
        xc = x[lo:lo + ROWS_PER_CHUNK].astype(np.float64)
        ms = np.einsum("ij,ij->i", xc, xc)[:, None] / x.shape[-1]
        y[lo:lo + ROWS_PER_CHUNK] = xc / np.sqrt(ms + eps) * w
    return {"y": y}


def baselines(**params) -> dict:
    """No cpu baselines: rmsnorm is a cuda problem."""
    return {}


def _torch_rmsnorm(eps: float):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    fused = getattr(torch.nn.functional, "rms_norm", None)

    def run(ins, outs):
        x, w = ins["x"], ins["w"]
        if fused is not None:   # torch >= 2.4: computes in fp32 and rounds once
            outs["y"].copy_(fused(x, (x.shape[-1],), weight=w, eps=eps))
            return
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        outs["y"].copy_(xf * rstd * w.float())

    return run


def _quack_rmsnorm(eps: float):
    try:
        import torch
        from quack.rmsnorm import rmsnorm
    except Exception:  # noqa: BLE001 (ImportError, or QuACK's CuTe DSL failing to initialise without a GPU)
        return None
    if not torch.cuda.is_available():
        return None

    def run(ins, outs):
        outs["y"].copy_(rmsnorm(ins["x"], ins["w"], eps=eps))

    return run


def cuda_baselines(*, eps: float) -> dict:
    """name -> fn(ins, outs) over dicts of torch CUDA tensors, writing outs["y"]; {} without torch or a GPU."""
    found = {}
    for name, make in (("torch", _torch_rmsnorm), ("quack", _quack_rmsnorm)):
        fn = make(eps)
        if fn is not None:
            found[name] = fn
    return found

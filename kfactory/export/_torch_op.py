"""Template of an exported kernel's torch op (kfactory export fills in _CONFIG and appends the op's definition;
this copy is never imported for its own sake).

The op runs the kernel on the tensors' own memory: on the cpu through the exported module's ctypes function
(the shared object build.sh builds), on a GPU by launching the cubin on the current stream through the CUDA
driver API. Its fake (meta) implementation gives the outputs' shapes, so it traces under torch.compile.
"""
# no `from __future__ import annotations`: torch.library.custom_op reads the op's annotations as types
import importlib
import sys
from pathlib import Path

import torch

_CONFIG: dict = {}  # kfactory-export: config

_kf_HERE = Path(__file__).resolve().parent
if str(_kf_HERE) not in sys.path:
    sys.path.insert(0, str(_kf_HERE))
_kf_mod = importlib.import_module(_CONFIG["module"])   # the Python export beside this file (NAME.py)
_kf_spec = _kf_mod._CONFIG

_kf_TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                    "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
                    "uint8": torch.uint8}


def _kf_check(tensors) -> None:
    """TypeError or ValueError naming the argument: dtype, contiguity, one device for all."""
    name = _kf_spec["name"]
    specs = _kf_spec["inputs"]
    if len(tensors) != len(specs):
        raise TypeError(f"{name} takes {len(specs)} tensors ({', '.join(s['name'] for s in specs)})")
    device = tensors[0].device
    for spec, t in zip(specs, tensors):
        if t.dtype != _kf_TORCH_DTYPES[spec["dtype"]]:
            raise TypeError(f"{name}: input {spec['name']!r} must be {spec['dtype']}, not {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: input {spec['name']!r} must be contiguous (call .contiguous())")
        if t.device != device:
            raise ValueError(f"{name}: input {spec['name']!r} is on {t.device}, input "
                             f"{specs[0]['name']!r} on {device}")
    if device.type != _kf_spec["target"]:
        raise ValueError(f"{name} is a {_kf_spec['target']} kernel; the inputs are on {device}")


def _kf_empty_outputs(tensors) -> list:
    """Uninitialised outputs of the right shapes and dtypes on the inputs' device (also on fake tensors)."""
    sym = _kf_mod._kf_symbols_of([tuple(t.shape) for t in tensors])
    return [torch.empty(_kf_mod._kf_shape(s, sym), dtype=_kf_TORCH_DTYPES[s["dtype"]], device=tensors[0].device)
            for s in _kf_spec["outputs"]]


def _kf_context(device):
    """The CUDA context torch runs `device` in (its primary context)."""
    cu = _kf_mod._kf_cuda_driver()
    torch.cuda.init()
    with torch.cuda.device(device):
        torch.cuda.current_stream(device).synchronize()   # makes torch's context current on this thread
        ctx = _kf_mod._kf_ck("cuCtxGetCurrent", cu.cuCtxGetCurrent())
    return ctx


def _kf_run(tensors, params: dict) -> list:
    """Run the kernel on `tensors` (the inputs, in order) with the params' values; the new outputs."""
    _kf_check(tensors)
    params = _kf_mod._kf_params(params)
    outs = _kf_empty_outputs(tensors)
    sym = _kf_mod._kf_symbols_of([tuple(t.shape) for t in tensors])
    names = [s["name"] for s in _kf_spec["inputs"] + _kf_spec["outputs"]]
    pointers = {n: t.data_ptr() for n, t in zip(names, list(tensors) + outs)}
    if _kf_spec["target"] == "cpu":
        scalars = _kf_mod._kf_scalars(sym, params)
        _kf_mod._kf_cpu_function()(*[pointers[a["name"]] if a["tensor"] else scalars[a["name"]]
                                     for a in _kf_spec["args"]])
    else:
        device = tensors[0].device
        cu, loaded = _kf_mod._kf_cuda_function(_kf_context(device))
        stream = torch.cuda.current_stream(device).cuda_stream
        _kf_mod._kf_enqueue(cu, loaded, pointers, sym, stream, params)
    return outs

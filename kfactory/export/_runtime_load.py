"""Part of the exported kernel's Python module (the template is _runtime.py, which names the parts): building
the kernel, loading it (a ctypes function on the cpu, a cubin through the CUDA driver API) and running it.

kfactory export appends this text after _runtime.py's without the docstring and the imports from kfactory, which
are here only so that linters read this file as the module it becomes."""
from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

from kfactory.export._runtime import (_CONFIG, _kf_CTYPES, _kf_check_array, _kf_name, _kf_outputs, _kf_params,
                                      _kf_scalars, _kf_symbols_of)

_kf_HERE = Path(__file__).resolve().parent
_kf_LOCK = threading.Lock()
_kf_LOADED: dict = {}
_kf_STATIC_SMEM = 48 << 10   # dynamic shared memory above this needs the kernel's opt-in attribute


class BuildError(RuntimeError):
    """The kernel's shared object or cubin could not be built (the compiler's output is in the message)."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


# -- building and loading ---------------------------------------------------------------------------------------

def build() -> Path:
    """Build the kernel's shared object (cpu) or cubin (cuda) unless it is newer than its sources, with the
    command build.sh runs; the path of the artifact. Called by the first kernel call."""
    b = _CONFIG["build"]
    artifact = _kf_HERE / b["artifact"]
    newest = max((_kf_HERE / s).stat().st_mtime for s in _CONFIG["sources"])
    if artifact.is_file() and artifact.stat().st_mtime >= newest:
        return artifact
    tmp = artifact.with_name(f".{artifact.name}.{os.getpid()}.tmp")
    fill = {"{cc}": os.environ.get("CC") or b["cc"], "{python}": sys.executable, "{out}": str(tmp)}
    argv = [fill.get(word, word) for word in b["argv"]]
    try:
        proc = subprocess.run(argv, cwd=_kf_HERE, capture_output=True, text=True)
    except OSError as exc:
        raise BuildError(f"{_kf_name()}: cannot run {argv[0]!r} to build {artifact.name}: {exc}") from exc
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{_kf_name()}: building {artifact.name} failed (exit {proc.returncode}): "
                         f"{' '.join(argv)}\n{(proc.stderr + proc.stdout)[-4000:]}")
    if tmp.exists():
        os.replace(tmp, artifact)   # atomic: another process never loads half a shared object
    return artifact


def _kf_cpu_function():
    """The kernel as a ctypes function (built on first use)."""
    with _kf_LOCK:
        if "cpu" not in _kf_LOADED:
            lib = ctypes.CDLL(str(build()))
            fn = getattr(lib, _kf_name())
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p if a["tensor"] else _kf_CTYPES[a["type"]] for a in _CONFIG["args"]]
            _kf_LOADED["cpu"] = (lib, fn)
        return _kf_LOADED["cpu"][1]


def _kf_ck(call: str, result):
    """The value(s) of a cuda-bindings call that returns (CUresult, values...); CudaError when it failed."""
    result = result if isinstance(result, tuple) else (result,)
    if int(result[0]) != 0:
        raise CudaError(f"{_kf_name()}: {call} failed: {result[0]!r}")
    rest = result[1:]
    return None if not rest else rest[0] if len(rest) == 1 else rest


def _kf_cuda_driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ImportError(f"{_kf_name()}: a cuda kernel needs cuda-python: pip install cuda-bindings") from exc
    return driver


def _kf_cuda_function(context=None):
    """(driver, function) of the kernel loaded into `context` (default: device KF_CUDA_DEVICE's primary
    context, made current), built on first use; one module per context."""
    cu = _kf_cuda_driver()
    with _kf_LOCK:
        if context is None:
            if "primary" not in _kf_LOADED:   # retained once, for the life of the process
                _kf_ck("cuInit", cu.cuInit(0))
                dev = _kf_ck("cuDeviceGet", cu.cuDeviceGet(int(os.environ.get("KF_CUDA_DEVICE", "0"))))
                _kf_LOADED["primary"] = _kf_ck("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
            context = _kf_LOADED["primary"]
        _kf_ck("cuCtxSetCurrent", cu.cuCtxSetCurrent(context))
        key = ("cuda", int(context))
        if key not in _kf_LOADED:
            image = ctypes.create_string_buffer(build().read_bytes())
            module = _kf_ck("cuModuleLoadData", cu.cuModuleLoadData(ctypes.addressof(image)))
            fn = _kf_ck("cuModuleGetFunction", cu.cuModuleGetFunction(module, _kf_name().encode()))
            _kf_LOADED[key] = (module, fn, image, {"smem": _kf_STATIC_SMEM})
        return cu, _kf_LOADED[key]


def _kf_cdiv(a, b):
    return -(-a // b) if isinstance(a, int) and isinstance(b, int) else math.ceil(a / b)


_kf_FUNCTIONS = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, "cdiv": _kf_cdiv}


def _kf_dims(what: str, value) -> tuple:
    vals = list(value) if isinstance(value, (tuple, list)) else [value]
    if not 1 <= len(vals) <= 3 or not all(isinstance(v, int) and v >= 1 for v in vals):
        raise ValueError(f"{_kf_name()}: the launch rule gave {what} = {value!r}")
    return tuple(vals + [1] * (3 - len(vals)))


def _kf_launch(sym: dict) -> tuple:
    """(grid, block, dynamic shared memory bytes) from the launch rule. Its expressions were checked by the
    exporter to hold only names, numbers, arithmetic, comparisons and the functions above."""
    rule = _CONFIG["launch"]
    names = {**_kf_FUNCTIONS, **rule.get("params", {}), **sym}

    def value(expr):
        if not isinstance(expr, str):
            return expr
        return eval(compile(expr, "<launch rule>", "eval"), {"__builtins__": {}}, names)  # noqa: S307

    smem = value(rule.get("smem") or "0")
    return _kf_dims("grid", value(rule["grid"])), _kf_dims("block", value(rule["block"])), int(smem)


def _kf_pack(values: list) -> tuple:
    """(address of a void* array pointing at each ctypes value, the objects to keep alive until the launch)."""
    arr = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
    return ctypes.addressof(arr), (arr, values)


def _kf_launch_args(pointers: dict, sym: dict, params: dict | None = None) -> list:
    scalars = _kf_scalars(sym, params)
    return [ctypes.c_uint64(int(pointers[a["name"]])) if a["tensor"] else _kf_CTYPES[a["type"]](scalars[a["name"]])
            for a in _CONFIG["args"]]


def _kf_enqueue(cu, loaded, pointers: dict, sym: dict, stream: int, params: dict | None = None) -> None:
    """Launch the kernel once on `stream` (a CUstream handle as an int; 0: the legacy default stream) with
    device pointers `pointers` (by tensor name) and the params' values (default: the problem's)."""
    _, fn, _, state = loaded
    grid, block, smem = _kf_launch(sym)
    if smem > state["smem"]:
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _kf_ck("cuFuncSetAttribute", cu.cuFuncSetAttribute(fn, attr, smem))
        state["smem"] = smem
    packed, keep = _kf_pack(_kf_launch_args(pointers, sym, params))
    _kf_ck("cuLaunchKernel", cu.cuLaunchKernel(fn, *grid, *block, smem, cu.CUstream(int(stream)), packed, 0))
    del keep


def _kf_run_cuda(inputs: list, outs: list, sym: dict, params: dict | None = None) -> None:
    """Copy the inputs to the GPU, launch, wait, copy the outputs back."""
    cu, loaded = _kf_cuda_function()
    pointers: dict = {}
    try:
        for spec, a in zip(_CONFIG["inputs"], inputs):
            pointers[spec["name"]] = _kf_ck("cuMemAlloc", cu.cuMemAlloc(max(1, a.nbytes)))
            _kf_ck("cuMemcpyHtoD", cu.cuMemcpyHtoD(pointers[spec["name"]], a.ctypes.data, a.nbytes))
        for spec, a in zip(_CONFIG["outputs"], outs):
            pointers[spec["name"]] = _kf_ck("cuMemAlloc", cu.cuMemAlloc(max(1, a.nbytes)))
        _kf_enqueue(cu, loaded, pointers, sym, 0, params)
        _kf_ck("cuCtxSynchronize", cu.cuCtxSynchronize())
        for spec, a in zip(_CONFIG["outputs"], outs):
            _kf_ck("cuMemcpyDtoH", cu.cuMemcpyDtoH(a.ctypes.data, pointers[spec["name"]], a.nbytes))
    finally:
        for ptr in pointers.values():
            cu.cuMemFree(ptr)


def _kf_call(inputs: tuple, out, params: dict | None = None):
    """Check the inputs, outputs and params; run the kernel; the output(s)."""
    params = _kf_params(params or {})
    specs = _CONFIG["inputs"]
    if len(inputs) != len(specs):
        raise TypeError(f"{_kf_name()}() takes {len(specs)} input(s) ({', '.join(s['name'] for s in specs)}), "
                        f"got {len(inputs)}")
    for spec, a in zip(specs, inputs):
        _kf_check_array("input", spec, a)
    sym = _kf_symbols_of([a.shape for a in inputs])
    outs = _kf_outputs(out, sym, list(inputs))
    if _CONFIG["target"] == "cuda":
        _kf_run_cuda(list(inputs), outs, sym, params)
    else:
        arrays = {s["name"]: a for s, a in zip(specs + _CONFIG["outputs"], list(inputs) + outs)}
        scalars = _kf_scalars(sym, params)
        _kf_cpu_function()(*[arrays[a["name"]].ctypes.data if a["tensor"] else scalars[a["name"]]
                             for a in _CONFIG["args"]])
    return outs[0] if len(outs) == 1 else tuple(outs)

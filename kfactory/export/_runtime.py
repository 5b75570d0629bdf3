"""Template of an exported kernel's Python module (kfactory export fills in _CONFIG and appends the public
function and the problem's reference; this copy is never imported for its own sake).

Only numpy and the standard library (cuda-bindings for a cuda kernel). Names are prefixed _kf_ so that the
problem's reference code, appended to the module, cannot collide with them.
"""
from __future__ import annotations

import ctypes
import math
import numbers
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np

_CONFIG: dict = {}  # kfactory-export: config

_kf_HERE = Path(__file__).resolve().parent
_kf_LOCK = threading.Lock()
_kf_LOADED: dict = {}
_kf_ALIGN = 64   # kfactory's runner hands kernels 64-byte aligned buffers; outputs made here are aligned alike
_kf_CTYPES: dict[str, type[ctypes._SimpleCData]] = {
    "int64": ctypes.c_int64, "int32": ctypes.c_int32, "uint64": ctypes.c_uint64, "uint32": ctypes.c_uint32,
    "long": ctypes.c_long, "ulong": ctypes.c_ulong, "float32": ctypes.c_float, "float64": ctypes.c_double}
_kf_STATIC_SMEM = 48 << 10   # dynamic shared memory above this needs the kernel's opt-in attribute


class BuildError(RuntimeError):
    """The kernel's shared object or cubin could not be built (the compiler's output is in the message)."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def _kf_name() -> str:
    return _CONFIG["name"]


# -- dtypes and arguments ---------------------------------------------------------------------------------------

def _kf_dtype(name: str) -> np.dtype:
    """numpy's dtype for a problem dtype; bfloat16 is ml_dtypes' where installed, else raw uint16 bits."""
    if name != "bfloat16":
        return np.dtype(name)
    try:
        return np.dtype("bfloat16")   # registered once ml_dtypes has been imported by anyone
    except TypeError:
        try:
            import ml_dtypes
        except ImportError:
            return np.dtype(np.uint16)
        return np.dtype(ml_dtypes.bfloat16)


def _kf_dtype_ok(a: np.ndarray, name: str) -> bool:
    return a.dtype.name == name or (name == "bfloat16" and a.dtype == np.uint16)


def _kf_check_array(role: str, spec: dict, a) -> None:
    """TypeError or ValueError naming the argument when `a` is not what the kernel takes."""
    name = spec["name"]
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{_kf_name()}: {role} {name!r} must be a numpy.ndarray, not {type(a).__name__}")
    if not _kf_dtype_ok(a, spec["dtype"]):
        extra = " (or uint16 holding bfloat16 bits)" if spec["dtype"] == "bfloat16" else ""
        raise TypeError(f"{_kf_name()}: {role} {name!r} must have dtype {spec['dtype']}{extra}, not {a.dtype}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{_kf_name()}: {role} {name!r} must be C-contiguous (pass np.ascontiguousarray({name}))")
    if not a.flags.aligned:
        raise ValueError(f"{_kf_name()}: {role} {name!r} is not aligned to its element size")
    if role == "output" and not a.flags.writeable:
        raise ValueError(f"{_kf_name()}: output {name!r} is read-only")


def _kf_symbols_of(shapes: list[tuple]) -> dict:
    """The shape symbols from the inputs' shapes, as the problem declares them; ValueError naming the input
    whose shape disagrees."""
    sym: dict = {}
    source: dict = {}
    for spec, shape in zip(_CONFIG["inputs"], shapes):
        dims, name = spec["shape"], spec["name"]
        if len(shape) != len(dims):
            raise ValueError(f"{_kf_name()}: input {name!r} must have {len(dims)} dimensions "
                             f"[{', '.join(map(str, dims))}], got shape {tuple(shape)}")
        for d, n in zip(dims, shape):
            if isinstance(d, int):
                if n != d:
                    raise ValueError(f"{_kf_name()}: input {name!r} must have size {d} where its shape says {d}, "
                                     f"got shape {tuple(shape)}")
            elif d in sym and sym[d] != n:
                raise ValueError(f"{_kf_name()}: input {name!r} has {d}={n} but input {source[d]!r} has "
                                 f"{d}={sym[d]}")
            else:
                sym[d], source[d] = n, name
    for d, n in sym.items():
        if n < 1:
            raise ValueError(f"{_kf_name()}: {d}={n}: the kernel was verified on sizes >= 1 only")
    return sym


def _kf_shape(spec: dict, sym: dict) -> tuple:
    return tuple(sym[d] if isinstance(d, str) else d for d in spec["shape"])


def _kf_params(given: dict) -> dict:
    """The value of each of the problem's params the kernel takes as an argument: `given` where it names one,
    else the problem's value. TypeError for a name the kernel does not take or a value of the wrong type,
    ValueError for a value outside the range the problem declares."""
    specs = _CONFIG.get("params", {})
    for name in given:
        if name not in specs:
            raise TypeError(f"{_kf_name()}: unknown parameter {name!r} (the kernel's are "
                            f"{', '.join(n for n, p in specs.items() if p['argument']) or 'none'})")
        if not specs[name]["argument"]:
            raise TypeError(f"{_kf_name()}: {name} = {specs[name]['value']!r} is compiled into this kernel and "
                            "cannot be changed")
    out = {}
    for name, spec in specs.items():
        if not spec["argument"]:
            continue
        value = given.get(name, spec["value"])
        want = numbers.Integral if spec["type"] == "int" else numbers.Real
        if isinstance(value, bool) or not isinstance(value, want):
            raise TypeError(f"{_kf_name()}: {name} must be {'an int' if spec['type'] == 'int' else 'a number'}, "
                            f"not {type(value).__name__}")
        value = int(value) if spec["type"] == "int" and isinstance(value, numbers.Integral) else float(value)
        if spec["type"] == "float" and not math.isfinite(value):
            raise ValueError(f"{_kf_name()}: {name}={value} is not finite")
        lo, hi = spec["min"], spec["max"]
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise ValueError(f"{_kf_name()}: {name}={value} is outside the range "
                             f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}] the problem declares")
        out[name] = value
    return out


def _kf_scalars(sym: dict, params: dict | None = None) -> dict:
    """Each scalar argument's value (a shape symbol's from `sym`, a param's from `params`, default: the
    problem's values), checked against the range of its C type."""
    params = _kf_params({}) if params is None else params
    out = {}
    for arg in _CONFIG["args"]:
        if arg["tensor"]:
            continue
        value = params[arg["name"]] if arg.get("param") else sym[arg["name"]]
        ctype = _kf_CTYPES[arg["type"]]
        if arg["type"] not in ("float32", "float64"):
            bits = 8 * ctypes.sizeof(ctype)
            lo, hi = (0, 2 ** bits - 1) if arg["type"].startswith("u") else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
            if not lo <= value <= hi:
                raise ValueError(f"{_kf_name()}: {arg['name']}={value} does not fit the kernel's {arg['c_type']}")
        out[arg["name"]] = value
    return out


def _kf_empty(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data is _kf_ALIGN-byte aligned."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + _kf_ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % _kf_ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _kf_outputs(out, sym: dict, inputs: list) -> list:
    specs = _CONFIG["outputs"]
    if out is None:
        return [_kf_empty(_kf_shape(s, sym), _kf_dtype(s["dtype"])) for s in specs]
    outs = [out] if isinstance(out, np.ndarray) else list(out)
    if len(outs) != len(specs):
        raise TypeError(f"{_kf_name()}: out must be {len(specs)} array(s) ({', '.join(s['name'] for s in specs)}), "
                        f"got {len(outs)}")
    for spec, a in zip(specs, outs):
        _kf_check_array("output", spec, a)
        if a.shape != _kf_shape(spec, sym):
            raise ValueError(f"{_kf_name()}: output {spec['name']!r} must have shape {_kf_shape(spec, sym)}, "
                             f"got {a.shape}")
        for ispec, x in zip(_CONFIG["inputs"], inputs):
            if np.may_share_memory(a, x):
                raise ValueError(f"{_kf_name()}: output {spec['name']!r} overlaps input {ispec['name']!r}; the "
                                 "kernel was verified with separate buffers")
    return outs


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


# -- selftest ---------------------------------------------------------------------------------------------------

def _kf_draw(rng, d: dict, shape: tuple, dtype: str) -> np.ndarray:
    """One input drawn as kfactory's verifier draws it (kfactory.judge.inputs.draw)."""
    if dtype == "bfloat16" and _kf_dtype("bfloat16") == np.uint16:
        raise RuntimeError(f"{_kf_name()}.selftest needs ml_dtypes for bfloat16 inputs: pip install ml_dtypes")
    draw_dtype = np.dtype(np.float32) if dtype == "bfloat16" else np.dtype(dtype)
    if d["kind"] == "constant":
        a = np.full(shape, d["value"], dtype=draw_dtype)
    else:
        if d["kind"] == "normal":
            a = rng.standard_normal(shape, dtype=np.float32 if draw_dtype == np.float32 else np.float64)
            a = a * d["std"] + d["mean"]
        else:
            a = rng.uniform(d["low"], d["high"], shape)
        if d["transform"] == "sigmoid":
            a = 0.5 * (1.0 + np.tanh(0.5 * a))
        elif d["transform"] == "logsigmoid":
            a = -np.logaddexp(0.0, -a)
        a = (a * d["factor"] if d["factor"] != 1.0 else a).astype(draw_dtype, copy=False)
    a = a.astype(_kf_dtype(dtype), copy=False)
    if d["neg_inf_fraction"] > 0:   # -inf entries, one finite entry kept per last-axis row
        mask = rng.random(a.shape) < d["neg_inf_fraction"]
        rows = mask.reshape(-1, a.shape[-1])
        rows[np.arange(rows.shape[0]), rng.integers(0, a.shape[-1], size=rows.shape[0])] = False
        a[mask] = -np.inf
    return np.ascontiguousarray(a)


def _kf_float64(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:   # raw bfloat16 bits
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _kf_compare(out: np.ndarray, ref: np.ndarray, tol: dict) -> str:
    """'' when `out` matches the float64 reference as kfactory's verifier requires (kfactory.judge.numerics), else
    why not: NaN/Inf only where the reference has them, every element within atol + rtol x |reference|, and the
    norm-relative error within norm_rel."""
    o, r = _kf_float64(out).ravel(), np.asarray(ref, dtype=np.float64).ravel()
    finite = np.isfinite(r)
    if not finite.all() and not np.array_equal(o[~finite], r[~finite], equal_nan=True):
        return "NaN/Inf pattern differs from the reference"
    bad = ~np.isfinite(o) & finite
    if bad.any():
        return f"{int(bad.sum())} non-finite outputs where the reference is finite"
    o, r = o[finite], r[finite]
    err = np.abs(o - r)
    allowed = tol["atol"] + tol["rtol"] * np.abs(r)
    if (err > allowed).any():
        i = int(np.argmax(err - allowed))
        return f"element {i}: |{o[i]!r} - {r[i]!r}| = {err[i]:.3g} > atol + rtol x |reference| = {allowed[i]:.3g}"
    ref_norm = float(np.linalg.norm(r))
    norm = float(np.linalg.norm(o - r)) / ref_norm if ref_norm > 0 else float(np.linalg.norm(o - r))
    if norm > tol["norm_rel"]:
        return f"norm-relative error {norm:.3g} > {tol['norm_rel']}"
    return ""


class SelftestUnavailable(RuntimeError):
    """selftest() has no reference to compare with: the problem's reference could not be embedded standalone."""


def selftest(seed: int | None = None, verbose: bool = False, **params) -> int:
    """Run the kernel on fresh random inputs (every distribution the problem declares, at its verification
    shapes) and compare with the problem's float64 reference under its tolerances; `params` (keyword
    arguments, as the kernel function takes them) run both at other values of the problem's params than its
    own. Returns the number of checks; raises AssertionError naming the shape, distribution and seed of the
    first mismatch, and SelftestUnavailable when the problem's reference could not be embedded in this module."""
    reference = globals().get("_kf_reference")
    if reference is None:
        raise SelftestUnavailable(f"{_kf_name()}.selftest: {_CONFIG['reference_missing']}")
    seed = secrets.randbits(63) if seed is None else seed
    rng = np.random.default_rng(seed)
    kernel_params = _kf_params(params)
    # the reference takes every param (those compiled into the kernel at their values), the kernel its own
    ref_params = {**{n: p["value"] for n, p in _CONFIG.get("params", {}).items()}, **kernel_params}
    checks = 0
    for shape in _CONFIG["selftest_shapes"]:
        for dist_name, dist in _CONFIG["distributions"].items():
            inputs = [_kf_draw(rng, dist[s["name"]], _kf_shape(s, shape), s["dtype"]) for s in _CONFIG["inputs"]]
            got = _kf_call(tuple(inputs), None, kernel_params)
            got = got if isinstance(got, tuple) else (got,)
            want = reference({s["name"]: a for s, a in zip(_CONFIG["inputs"], inputs)}, **ref_params)
            for spec, o in zip(_CONFIG["outputs"], got):
                why = _kf_compare(o, want[spec["name"]], _CONFIG["tolerance"][spec["dtype"]])
                where = f"output {spec['name']!r} at {shape} ({dist_name}, seed {seed}" + "".join(
                    f", {k}={v!r}" for k, v in params.items()) + ")"
                if why:
                    raise AssertionError(f"{_kf_name()}.selftest: {where}: {why}")
                if verbose:
                    print(f"ok {where}")
                checks += 1
    return checks

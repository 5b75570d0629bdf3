"""Template of an exported kernel's Python module, its first part: the configuration, the dtypes and the
checking of a call's arguments. kfactory export fills in _CONFIG, appends the other parts (_runtime_load.py:
building, loading and running the kernel; _runtime_selftest.py: selftest()), then the public function and the
problem's reference (templates.fill); this copy is never imported for its own sake.

Only numpy and the standard library (cuda-bindings for a cuda kernel). Names are prefixed _kf_ so that the
problem's reference code, appended to the module, cannot collide with them.
"""
from __future__ import annotations

import ctypes
import math
import numbers

import numpy as np

_CONFIG: dict = {}  # kfactory-export: config

_kf_ALIGN = 64   # kfactory's runner hands kernels 64-byte aligned buffers; outputs made here are aligned alike
_kf_CTYPES: dict[str, type[ctypes._SimpleCData]] = {
    "int64": ctypes.c_int64, "int32": ctypes.c_int32, "uint64": ctypes.c_uint64, "uint32": ctypes.c_uint32,
    "long": ctypes.c_long, "ulong": ctypes.c_ulong, "float32": ctypes.c_float, "float64": ctypes.c_double}


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

"""Programs of the cuda runner child: a cubin (or PTX text) loaded as a module and its entry function looked up, its
launch configuration evaluated from the launch rule at a shape (kfactory.targets.cuda.launch), its arguments packed
into a parameter buffer and launched; a torch baseline called on the same device buffers; CUDA graphs captured."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfactory.sandbox.child import KernelFault, raising_as_kernel
from kfactory.sandbox.protocol import FaultKind
from kfactory.targets.cuda import driver
from kfactory.targets.cuda.allocator import DevTensor
from kfactory.targets.cuda.driver import CudaError, check
from kfactory.targets.cuda.launch import Launch, evaluate_launch


STATIC_SMEM_LIMIT = 48 << 10
#: scalar argument types -> (the ctypes value the parameter buffer points at, the descriptor's field, conversion):
#: shape symbols and int parameters travel as int64, float parameters as their C type (f32: float, f64: double)
SCALARS = {"i64": (ctypes.c_int64, "int", int), "f32": (ctypes.c_float, "float", float),
           "f64": (ctypes.c_double, "float", float)}
#: __cuda_array_interface__ type strings; bfloat16 goes as int16 and is viewed as torch.bfloat16
TYPESTR = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<i2", "int32": "<i4",
           "int64": "<i8", "uint8": "|u1"}


@dataclass
class Program:
    """One cubin kernel: its function, argument types, launch rule, and the dynamic shared memory it may use so
    far (raised with cuFuncSetAttribute the first time a launch asks for more than the static 48 KiB)."""
    fn: object
    argtypes: list[str]
    rule: dict
    smem_set: int = STATIC_SMEM_LIMIT
    #: the module the function lives in (what an unload unloads)
    module: object = None

    def launch_for(self, shape: dict, smem_optin: int) -> Launch:
        """The launch configuration at `shape` (ValueError when the rule gives none this device can run)."""
        launch = evaluate_launch(self.rule, {k: int(v) for k, v in shape.items()})
        if launch.smem > smem_optin:
            raise ValueError(f"launch rule asks {launch.smem} bytes of dynamic shared memory; this device allows "
                             f"at most {smem_optin} per block")
        if launch.smem > self.smem_set:
            check("cuFuncSetAttribute", driver.cu.cuFuncSetAttribute(
                self.fn, driver.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                int(launch.smem)))
            self.smem_set = launch.smem
        return launch

    def enqueue(self, argset: list[dict], tensors: dict[str, DevTensor], launch: Launch, stream):
        """A zero-argument callable that launches the kernel once on `stream` with `argset` (tensors by name)."""
        if len(argset) < len(self.argtypes):
            raise ValueError(f"{len(self.argtypes)} kernel arguments declared, {len(argset)} given")
        values: list[Any] = []
        for t, a in zip(self.argtypes, argset):
            if t == "ptr":
                if a["name"] not in tensors:
                    raise ValueError(f"argument {a['name']!r} is declared a pointer but is not a tensor")
                values.append(ctypes.c_uint64(tensors[a["name"]].ptr))
            else:
                # the parameter buffer holds each argument at its own size: a C float must be a c_float
                ctype, field, conv = SCALARS[t]
                if field not in a:
                    raise ValueError(f"argument {a['name']!r} is declared {t} but is given {sorted(a)}")
                values.append(ctype(conv(a[field])))
        params, keep = pack(values)
        fn, (gx, gy, gz), (bx, by, bz), smem = self.fn, launch.grid, launch.block, launch.smem

        def run(keep=keep):
            check("cuLaunchKernel", driver.cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, 0))
        return run


def load_program(path: str, entry: str, argtypes: list[str], rule, modules: list) -> Program:
    """Load the cubin (or PTX) at `path` as a module (kept in `modules`) and look up `entry`. A driver that refuses
    the image or does not find the entry is the candidate's LOAD_FAILED (a device fault there ends the child); bad
    argument types or a missing launch rule are the request's, so the harness's (ValueError)."""
    argtypes = list(argtypes)
    if any(t not in SCALARS and t != "ptr" for t in argtypes):
        raise ValueError(f"argtypes must be 'ptr', 'i64', 'f32' or 'f64', got {argtypes}")
    if not isinstance(rule, dict):
        raise ValueError("a cubin needs a launch_rule {grid, block, smem, params}")
    buf = ctypes.create_string_buffer(Path(path).read_bytes())  # NUL-terminated too, so a PTX text loads as well
    try:
        mod = check("cuModuleLoadData", driver.cu.cuModuleLoadData(ctypes.addressof(buf)))
        modules.append(mod)
        fn = check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, entry.encode()))
    except CudaError as e:
        if e.kind == "device_fault":
            raise e.fatal() from e
        raise KernelFault(FaultKind.LOAD_FAILED, f"cannot load {entry!r} from the cubin: {e}", code=e.code) from e
    return Program(fn, argtypes, rule, module=mod)


def pack(values: list) -> tuple[int, list]:
    """(address of a void* array pointing at each ctypes value, the objects to keep alive)."""
    holders = list(values)
    arr = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
    return ctypes.addressof(arr), [arr, holders]


def enqueue_baseline(fn, tensors: dict[str, DevTensor]):
    """A zero-argument callable running torch baseline `fn(ins, outs)` on the device buffers (torch's stream)."""
    ins = {n: _torch(t) for n, t in tensors.items() if t.role == "in"}
    outs = {n: _torch(t) for n, t in tensors.items() if t.role == "out"}
    # a baseline's exception may come from a poisoned context (torch raises a CUDA error): the child ends
    return raising_as_kernel(lambda: fn(ins, outs), exiting=True)


class _CAI:
    """A device buffer with __cuda_array_interface__, for torch.as_tensor."""

    def __init__(self, ptr: int, shape: tuple, typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(int(s) for s in shape), "typestr": typestr,
                                         "data": (int(ptr), False), "strides": None, "version": 2}


def _torch(t: DevTensor):
    import torch
    x = torch.as_tensor(_CAI(t.ptr, t.shape, TYPESTR[t.dtype]))
    if t.dtype == "bfloat16":
        x = x.view(torch.bfloat16)
    if x.data_ptr() != t.ptr or x.device.type != "cuda":
        raise RuntimeError(f"torch copied tensor {t.name} instead of wrapping the device buffer")
    return x


def capture(stream, enqueues: list, graphs: list):
    """A CUDA graph of the given launches, captured on the non-default `stream`; (graph, exec) kept in `graphs`
    for destruction."""
    check("cuStreamBeginCapture", driver.cu.cuStreamBeginCapture(
        stream, driver.cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
    for enq in enqueues:
        enq()
    graph = check("cuStreamEndCapture", driver.cu.cuStreamEndCapture(stream))
    exe = check("cuGraphInstantiate", driver.cu.cuGraphInstantiate(graph, 0))
    graphs.append((graph, exe))
    return exe

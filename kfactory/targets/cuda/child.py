"""The cuda runner child: loads cubins (and the problem's torch baselines) and runs them on one GPU.

Started by kfactory.targets.cuda.target.CudaSession through kfactory.sandbox.parent.Runner as
`python -m kfactory.targets.cuda.child RFD WFD THREADS MEM_MB CPU_S` with CUDA_VISIBLE_DEVICES set to the
GPU's UUID, so the only visible device is device 0. It works in that device's PRIMARY context, which torch
in the same process shares. It speaks the typed protocol of kfactory.sandbox.protocol with the same
argument descriptors as the cpu child; the tensors live in shared-memory files and are copied to fresh
device buffers here.

Ops: load, call, bench, device, ceilings (see each op_*). A CUDA error during a call or a bench (a fault
of the kernel, a refused launch) ends this process after one reply whose fault is DEVICE_FAULT, LAUNCH_FAILED
or CUDA_ERROR with the CUresult code and exiting set: a faulting kernel poisons the context, so the parent
replaces the runner. An invalid launch rule (kfactory.targets.cuda.launch) is a LAUNCH_FAILED fault that does
not end the process (nothing ran). Any other exception is the runner's own (HARNESS, kfactory.sandbox.child.serve).
"""
from __future__ import annotations

import ctypes
import math
import os
import resource
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kfactory.sandbox.child import Child, KernelFault, _baseline, main, raising_as_kernel, sample_interleaved, warm_up
from kfactory.sandbox.protocol import Bench, Call, Ceilings, DeviceQuery, FaultKind, Load, Ping, Reply
from kfactory.targets.cuda.launch import Launch, evaluate_launch

try:
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - the module imports without cuda-bindings; ops then refuse
    cu = None

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
#: __cuda_array_interface__ type strings; bfloat16 goes as int16 and is viewed as torch.bfloat16
TYPESTR = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<i2", "int32": "<i4",
           "int64": "<i8"}
GUARD = 4096          # bytes of known pattern before and after every tensor of a checked call
GUARD_BYTE = 0xA5
GRAPH_TARGET_S = 200e-6  # a graph replay (or a run of back-to-back baseline calls) lasts at least this
MAX_GRAPH_LAUNCHES = 4096
STATIC_SMEM_LIMIT = 48 << 10
#: scalar argument types -> (the ctypes value the parameter buffer points at, the descriptor's field, conversion):
#: shape symbols and int parameters travel as int64, float parameters as their C type (f32: float, f64: double)
SCALARS = {"i64": (ctypes.c_int64, "int", int), "f32": (ctypes.c_float, "float", float),
           "f64": (ctypes.c_double, "float", float)}

#: CUresult names, mapped by value: a fault of the kernel (the context is unusable afterwards)
FAULT_NAMES = ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
               "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT",
               "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_LAUNCH_TIMEOUT",
               "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_TENSOR_MEMORY_LEAK")
#: ... a launch the driver refused wherever the error shows (too many resources for the configuration)
LAUNCH_NAMES = ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
                "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "CUDA_ERROR_INVALID_CLUSTER_SIZE")
#: the driver calls that launch work: any error from them that is not a fault is a refused launch
#: (CUDA_ERROR_INVALID_VALUE for a bad grid, block or shared-memory size, INVALID_HANDLE, NO_BINARY_FOR_GPU...)
LAUNCH_CALLS = ("cuLaunchKernel", "cuFuncSetAttribute", "cuGraphInstantiate", "cuGraphLaunch",
                "cuStreamBeginCapture", "cuStreamEndCapture")


def _codes(names) -> frozenset[int]:
    if cu is None:
        return frozenset()
    return frozenset(int(getattr(cu.CUresult, n)) for n in names if hasattr(cu.CUresult, n))


FAULT_CODES = _codes(FAULT_NAMES)
LAUNCH_CODES = _codes(LAUNCH_NAMES)


def classify(call: str, code: int) -> str:
    """"device_fault", "launch_failed" or "cuda_error" for CUresult `code` returned by driver call `call`
    (by value, never by message): any other error is the runner's, not the kernel's."""
    if code in FAULT_CODES:
        return "device_fault"
    if call in LAUNCH_CALLS or code in LAUNCH_CODES:
        return "launch_failed"
    return "cuda_error"


class CudaError(Exception):
    """A driver call returned an error."""

    def __init__(self, call: str, code: int):
        self.call, self.code, self.kind = call, int(code), classify(call, int(code))
        name = str(code)
        if cu is not None:
            try:
                name = cu.CUresult(self.code).name
            except ValueError:
                pass
        super().__init__(f"{call} failed: {name} ({self.code})")

    def fatal(self) -> KernelFault:
        """The fault this error is while the kernel's work is in flight: the context may be poisoned, so the child
        replies and exits (kfactory.sandbox.child.main)."""
        return KernelFault(FaultKind(self.kind), str(self), code=self.code, exiting=True)


class CudaUnavailable(OSError):
    """CUDA cannot start here (no driver, no GPU, no cuda-bindings): the runner's environment, not the kernel."""


def _ck(call: str, res):
    """The value(s) of a cuda-bindings call returning (CUresult, values...); raises CudaError on failure."""
    if not isinstance(res, tuple):
        res = (res,)
    err, rest = res[0], res[1:]
    if int(err) != 0:
        raise CudaError(call, int(err))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _dptr(addr: int):
    return cu.CUdeviceptr(int(addr))


def _nbytes(a: dict) -> int:
    return int(math.prod(a["shape"])) * ITEMSIZE[a["dtype"]]


@dataclass
class DevTensor:
    """One tensor on the device: `ptr` is what the kernel sees, `base` what was allocated (guards around)."""
    name: str
    role: str
    dtype: str
    shape: tuple
    nbytes: int
    base: int
    ptr: int
    guard: int
    host: np.ndarray  # the shared-memory bytes of the tensor (uint8)


class _CAI:
    """A device buffer with __cuda_array_interface__, for torch.as_tensor."""

    def __init__(self, ptr: int, shape: tuple, typestr: str):
        self.__cuda_array_interface__ = {"shape": tuple(int(s) for s in shape), "typestr": typestr,
                                         "data": (int(ptr), False), "strides": None, "version": 2}


def fma_source() -> str:
    """The fp32 peak probe: per thread 8 independent chains of 16 fused multiply-adds per iteration."""
    return r"""
extern "C" __global__ void fma_peak(float *out, long long iters, float b, float c) {
  float a0 = threadIdx.x * 1e-6f, a1 = a0 + 0.1f, a2 = a0 + 0.2f, a3 = a0 + 0.3f;
  float a4 = a0 + 0.4f, a5 = a0 + 0.5f, a6 = a0 + 0.6f, a7 = a0 + 0.7f;
  for (long long i = 0; i < iters; ++i) {
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      a0 = fmaf(a0, b, c); a1 = fmaf(a1, b, c); a2 = fmaf(a2, b, c); a3 = fmaf(a3, b, c);
      a4 = fmaf(a4, b, c); a5 = fmaf(a5, b, c); a6 = fmaf(a6, b, c); a7 = fmaf(a7, b, c);
    }
  }
  out[(long long)blockIdx.x * blockDim.x + threadIdx.x] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
"""


FMA_FLOPS_PER_ITER = 8 * 16 * 2


def arch_of(major: int, minor: int) -> str:
    """The compile architecture of a compute capability: sm_90a for 9.0, sm_100a for 10.0, else sm_XY."""
    if (major, minor) == (9, 0):
        return "sm_90a"
    if (major, minor) == (10, 0):
        return "sm_100a"
    return f"sm_{major}{minor}"


def _uuid_text(raw: bytes) -> str:
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class CudaChild(Child):
    """The loaded kernels of one runner, in the primary context of the one visible GPU."""

    def __init__(self, threads: int):
        super().__init__(threads)
        self.dev = None
        self.ctx = None
        self.meta: dict[str, dict] = {}       # cubin key -> {"argtypes", "rule", "smem_set"}
        self.modules: list = []
        self.prev_allocs: list[int] = []      # the previous call's buffers, freed after the next call's exist
        self.scratch: tuple[int, int] | None = None
        self.side_stream = None
        self.flush_value = 0

    # -- context, errors -------------------------------------------------------------------------------------

    def op_ping(self, req: Ping) -> Reply:
        """Also starts CUDA, so its cost (seconds on a GPU without persistence mode) falls in the start-up
        answer's generous timeout and not in the first load's; a failure is reported by the first real op."""
        try:
            self._init()
        except CudaUnavailable:
            pass
        return super().op_ping(req)

    def _init(self) -> None:
        if self.ctx is not None:
            return
        if cu is None:
            raise CudaUnavailable("cuda-bindings is not installed (from cuda.bindings import driver failed)")
        where = os.environ.get("CUDA_VISIBLE_DEVICES", "(all)")
        try:
            _ck("cuInit", cu.cuInit(0))
            if _ck("cuDeviceGetCount", cu.cuDeviceGetCount()) < 1:
                raise CudaUnavailable(f"no CUDA device visible (CUDA_VISIBLE_DEVICES={where})")
            dev = _ck("cuDeviceGet", cu.cuDeviceGet(0))
            try:  # block in synchronize instead of spinning: a runner has a CPU-time limit
                cu.cuDevicePrimaryCtxSetFlags(dev, int(cu.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC))
            except Exception:  # noqa: BLE001 - an optimisation only
                pass
            ctx = _ck("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
            _ck("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))
            flags = int(cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC)
            self.ev0 = _ck("cuEventCreate", cu.cuEventCreate(flags))
            self.ev1 = _ck("cuEventCreate", cu.cuEventCreate(flags))
            self.l2 = self._attr(dev, "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE")
            self.smem_optin = self._attr(dev, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        except CudaUnavailable:
            raise
        except CudaError as e:
            raise CudaUnavailable(f"CUDA cannot start on CUDA_VISIBLE_DEVICES={where}: {e}") from e
        except Exception as e:  # noqa: BLE001 - e.g. the driver library is missing (no GPU here)
            raise CudaUnavailable(f"CUDA cannot start on CUDA_VISIBLE_DEVICES={where}: "
                                  f"{type(e).__name__}: {e}") from e
        self.dev, self.ctx = dev, ctx
        self.stream0 = cu.CUstream(0)  # the legacy default stream: torch's default stream too

    @staticmethod
    def _attr(dev, name: str) -> int:
        return int(_ck("cuDeviceGetAttribute", cu.cuDeviceGetAttribute(getattr(cu.CUdevice_attribute, name), dev)))

    @staticmethod
    def _refused(e: Exception) -> KernelFault:
        """A launch that was never attempted (the rule gives an invalid configuration): typed, not fatal."""
        return KernelFault(FaultKind.LAUNCH_FAILED, str(e))

    @staticmethod
    def _cpu() -> dict:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        soft = resource.getrlimit(resource.RLIMIT_CPU)[0]
        return {"cpu_s": ru.ru_utime + ru.ru_stime, "cpu_limit_s": -1 if soft == resource.RLIM_INFINITY else soft}

    # -- memory ----------------------------------------------------------------------------------------------

    def _raw(self, a: dict) -> np.ndarray:
        """The bytes of a shared-memory tensor descriptor (mapped once per command)."""
        mm = self.maps.get(a["path"])
        if mm is None:
            mm = self.maps[a["path"]] = np.memmap(a["path"], dtype=np.uint8, mode="r+")
        return np.ndarray((_nbytes(a),), dtype=np.uint8, buffer=mm, offset=int(a.get("offset", 0)))

    def _alloc(self, nbytes: int) -> int:
        return int(_ck("cuMemAlloc", cu.cuMemAlloc(max(1, nbytes))))

    def _free(self, bases: list[int]) -> None:
        for b in bases:
            _ck("cuMemFree", cu.cuMemFree(_dptr(b)))

    def _poison(self, t: DevTensor) -> None:
        """NaN in every element of a float output (a quiet NaN pattern per dtype), 0xFF bytes otherwise."""
        p = _dptr(t.ptr)
        if t.dtype == "float32":
            _ck("cuMemsetD32", cu.cuMemsetD32(p, 0x7FC00000, t.nbytes // 4))
        elif t.dtype == "float64":  # 0x7FF800007FF80000 is a NaN
            _ck("cuMemsetD32", cu.cuMemsetD32(p, 0x7FF80000, t.nbytes // 4))
        elif t.dtype == "bfloat16":
            _ck("cuMemsetD16", cu.cuMemsetD16(p, 0x7FC0, t.nbytes // 2))
        elif t.dtype == "float16":
            _ck("cuMemsetD16", cu.cuMemsetD16(p, 0x7E00, t.nbytes // 2))
        else:
            _ck("cuMemsetD8", cu.cuMemsetD8(p, 0xFF, t.nbytes))

    def _h2d(self, t: DevTensor, host: np.ndarray) -> None:
        _ck("cuMemcpyHtoD", cu.cuMemcpyHtoD(_dptr(t.ptr), host.ctypes.data, t.nbytes))

    def _d2h(self, t: DevTensor, host: np.ndarray) -> None:
        _ck("cuMemcpyDtoH", cu.cuMemcpyDtoH(host.ctypes.data, _dptr(t.ptr), t.nbytes))

    def _upload(self, argset: list[dict], into: dict[str, DevTensor], guard: bool) -> dict[str, DevTensor]:
        """Fresh device buffers for every tensor of `argset` (filled into `into` as they are made, so a
        failure half way can free them): inputs copied from shared memory, outputs poisoned."""
        g = GUARD if guard else 0
        for a in argset:
            if "path" not in a:
                continue
            host = self._raw(a)
            nbytes = host.size
            base = self._alloc(nbytes + 2 * g)
            t = DevTensor(a["name"], a.get("role", "in"), a["dtype"], tuple(a["shape"]), nbytes, base, base + g, g,
                          host)
            into[a["name"]] = t
            if g:
                _ck("cuMemsetD8", cu.cuMemsetD8(_dptr(base), GUARD_BYTE, nbytes + 2 * g))
            if t.role == "out":
                self._poison(t)
            else:
                self._h2d(t, host)
        return into

    def _guards_intact(self, t: DevTensor) -> bool:
        if not t.guard:
            return True
        band = np.empty(t.guard, dtype=np.uint8)
        for start in (t.base, t.ptr + t.nbytes):
            _ck("cuMemcpyDtoH", cu.cuMemcpyDtoH(band.ctypes.data, _dptr(start), t.guard))
            if not bool((band == GUARD_BYTE).all()):
                return False
        return True

    # -- kernels ---------------------------------------------------------------------------------------------

    def op_load(self, req: Load) -> Reply:
        """kind "cubin": path, entry, argtypes, launch_rule; kind "baseline": module, name: the problem's
        reference.py, whose cuda_baselines()[name] is fn(ins, outs) on torch CUDA tensors."""
        self._init()
        key = req.key
        if req.kind == "cubin":
            argtypes = list(req.argtypes)
            if any(t not in SCALARS and t != "ptr" for t in argtypes):
                raise ValueError(f"argtypes must be 'ptr', 'i64', 'f32' or 'f64', got {argtypes}")
            if not isinstance(req.launch_rule, dict):
                raise ValueError("a cubin needs a launch_rule {grid, block, smem, params}")
            image = Path(req.path).read_bytes()
            buf = ctypes.create_string_buffer(image)  # NUL-terminated too, so a PTX text loads as well
            try:
                mod = _ck("cuModuleLoadData", cu.cuModuleLoadData(ctypes.addressof(buf)))
                self.modules.append(mod)
                fn = _ck("cuModuleGetFunction", cu.cuModuleGetFunction(mod, req.entry.encode()))
            except CudaError as e:
                if e.kind == "device_fault":
                    raise e.fatal() from e
                raise KernelFault(FaultKind.LOAD_FAILED, f"cannot load {req.entry!r} from the cubin: {e}",
                                  code=e.code) from e
            self.kernels[key] = fn
            self.meta[key] = {"argtypes": argtypes, "rule": req.launch_rule, "smem_set": STATIC_SMEM_LIMIT}
        elif req.kind == "baseline":
            self.kernels[key] = _baseline(req, "cuda_baselines", "kf_problem_ref_cuda")
        else:
            raise ValueError(f"unknown kind {req.kind!r} for the cuda runner (cubin or baseline)")
        self.kinds[key] = req.kind
        return Reply()

    def _launch_for(self, key: str, shape: dict) -> Launch:
        """The launch configuration of cubin `key` at `shape` (ValueError when the rule gives none)."""
        launch = evaluate_launch(self.meta[key]["rule"], {k: int(v) for k, v in shape.items()})
        if launch.smem > self.smem_optin:
            raise ValueError(f"launch rule asks {launch.smem} bytes of dynamic shared memory; this device allows "
                             f"at most {self.smem_optin} per block")
        meta = self.meta[key]
        if launch.smem > meta["smem_set"]:
            _ck("cuFuncSetAttribute", cu.cuFuncSetAttribute(
                self.kernels[key], cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                int(launch.smem)))
            meta["smem_set"] = launch.smem
        return launch

    @staticmethod
    def _pack(values: list) -> tuple[int, list]:
        """(address of a void* array pointing at each ctypes value, the objects to keep alive)."""
        holders = list(values)
        arr = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
        return ctypes.addressof(arr), [arr, holders]

    def _enqueue(self, key: str, argset: list[dict], tensors: dict[str, DevTensor], launch: Launch | None,
                 stream):
        """A zero-argument callable that enqueues kernel `key` once on `stream` (baselines: torch's stream)."""
        fn = self.kernels[key]
        if self.kinds[key] == "cubin":
            argtypes = self.meta[key]["argtypes"]
            if len(argset) < len(argtypes):
                raise ValueError(f"{len(argtypes)} kernel arguments declared, {len(argset)} given")
            values = []
            for t, a in zip(argtypes, argset):
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
            params, keep = self._pack(values)
            (gx, gy, gz), (bx, by, bz), smem = launch.grid, launch.block, launch.smem

            def run(keep=keep):
                _ck("cuLaunchKernel", cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, 0))
            return run
        ins = {n: self._torch(t) for n, t in tensors.items() if t.role == "in"}
        outs = {n: self._torch(t) for n, t in tensors.items() if t.role == "out"}
        # a baseline's exception may come from a poisoned context (torch raises a CUDA error): the child ends
        return raising_as_kernel(lambda: fn(ins, outs), exiting=True)

    def _torch(self, t: DevTensor):
        import torch
        x = torch.as_tensor(_CAI(t.ptr, t.shape, TYPESTR[t.dtype]))
        if t.dtype == "bfloat16":
            x = x.view(torch.bfloat16)
        if x.data_ptr() != t.ptr or x.device.type != "cuda":
            raise RuntimeError(f"torch copied tensor {t.name} instead of wrapping the device buffer")
        return x

    def _time(self, stream, enqueue) -> float:
        """Seconds between two events recorded on `stream` around `enqueue()`."""
        _ck("cuEventRecord", cu.cuEventRecord(self.ev0, stream))
        enqueue()
        _ck("cuEventRecord", cu.cuEventRecord(self.ev1, stream))
        _ck("cuEventSynchronize", cu.cuEventSynchronize(self.ev1))
        return float(_ck("cuEventElapsedTime", cu.cuEventElapsedTime(self.ev0, self.ev1))) * 1e-3

    # -- ops -------------------------------------------------------------------------------------------------

    def op_call(self, req: Call) -> Reply:
        """Fresh device buffers with guard bands, inputs uploaded, outputs poisoned; one timed run, then one
        per entry of "steps" on the same buffers (the previous outputs saved to the step's "outputs", its
        "inputs" uploaded, the outputs poisoned again). Outputs AND inputs are copied back to shared memory
        (the parent checks that inputs were not written). {"seconds": [per run], "out_of_bounds": [names]}"""
        self._init()
        key = req.key
        launch = None
        if self.kinds[key] == "cubin":
            try:
                launch = self._launch_for(key, req.shape)
            except ValueError as e:
                raise self._refused(e) from e
        tensors: dict[str, DevTensor] = {}
        try:
            self._upload(req.args, tensors, guard=True)
            run = self._enqueue(key, req.args, tensors, launch, self.stream0)
            seconds = [self._time(self.stream0, run)]
            for step in req.steps:
                for name, desc in step["outputs"].items():
                    self._d2h(tensors[name], self._raw(desc))
                for name, desc in step["inputs"].items():
                    self._h2d(tensors[name], self._raw(desc))
                for name in step.get("poison", {}):
                    self._poison(tensors[name])
                seconds.append(self._time(self.stream0, run))
            _ck("cuCtxSynchronize", cu.cuCtxSynchronize())
            oob = sorted(n for n, t in tensors.items() if not self._guards_intact(t))
            for t in tensors.values():
                self._d2h(t, t.host)
            # keep this call's buffers until the next call has its own: consecutive calls never share addresses
            old, self.prev_allocs = self.prev_allocs, [t.base for t in tensors.values()]
            self._free(old)
        except CudaError as e:
            raise e.fatal() from e
        except BaseException:
            self._free_quietly([t.base for t in tensors.values()])
            raise
        return Reply(seconds=seconds, out_of_bounds=oob, **self._cpu())

    def _free_quietly(self, bases: list[int]) -> None:
        try:
            self._free(bases)
        except CudaError as e:
            raise e.fatal() from e

    def _flush(self, stream, nbytes: int) -> None:
        """Write a scratch buffer of 2 x L2 (outside the timed region) so the next sample starts cold."""
        if not nbytes:
            return
        if self.scratch is None:
            self.scratch = (self._alloc(nbytes), nbytes)
        self.flush_value = (self.flush_value + 1) & 0xFF
        _ck("cuMemsetD8Async", cu.cuMemsetD8Async(_dptr(self.scratch[0]), self.flush_value, self.scratch[1], stream))

    def _stream(self):
        if self.side_stream is None:
            self.side_stream = _ck("cuStreamCreate", cu.cuStreamCreate(int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)))
        return self.side_stream

    def _capture(self, stream, enqueues: list, graphs: list):
        """A CUDA graph of the given launches, captured on the non-default `stream`; (graph, exec) kept in
        `graphs` for destruction."""
        _ck("cuStreamBeginCapture", cu.cuStreamBeginCapture(
            stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for enq in enqueues:
            enq()
        graph = _ck("cuStreamEndCapture", cu.cuStreamEndCapture(stream))
        exe = _ck("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
        graphs.append((graph, exe))
        return exe

    def _sampler(self, key: str, sets: list, launch: Launch | None, mode: str, flush_bytes: int,
                 graphs: list) -> tuple:
        """(sample(i) -> seconds of one launch, launches per sample, one enqueue per argument set) for kernel
        `key` over its argument sets.
        events: one launch on the legacy default stream between two events. graph (cubins): a graph of N
        launches rotating over the sets, replayed on a non-default stream, its time divided by N. graph
        (torch baselines, which are not captured): N back-to-back calls between two events, divided by N."""
        cubin = self.kinds[key] == "cubin"
        stream = self._stream() if (mode == "graph" and cubin) else self.stream0
        enq = [self._enqueue(key, argset, tensors, launch, stream) for argset, tensors in sets]

        def one(i: int) -> float:
            self._flush(stream, flush_bytes)
            return self._time(stream, enq[i % len(enq)])

        if mode != "graph":
            return one, 1, enq
        first = statistics.median(one(i) for i in range(3))
        n = max(1, min(MAX_GRAPH_LAUNCHES, math.ceil(GRAPH_TARGET_S / max(first, 1e-7))))
        if not cubin:
            def many(i: int, n=n) -> float:
                self._flush(stream, flush_bytes)
                return self._time(stream, lambda: [enq[(i * n + j) % len(enq)]() for j in range(n)]) / n
            return many, n, enq
        exe, n_exe = None, n
        for attempt in range(2):  # the first guess comes from an events time, which overstates a tiny kernel
            exe, n_exe = self._capture(stream, [enq[j % len(enq)] for j in range(n)], graphs), n
            self._flush(stream, flush_bytes)
            replay = self._time(stream, lambda exe=exe: _ck("cuGraphLaunch", cu.cuGraphLaunch(exe, stream)))
            if attempt == 1 or replay >= 0.75 * GRAPH_TARGET_S or n >= MAX_GRAPH_LAUNCHES:
                break
            n = max(1, min(MAX_GRAPH_LAUNCHES, math.ceil(n * 1.25 * GRAPH_TARGET_S / max(replay, 1e-7))))

        def replayed(i: int, exe=exe, n=n_exe) -> float:
            self._flush(stream, flush_bytes)
            return self._time(stream, lambda: _ck("cuGraphLaunch", cu.cuGraphLaunch(exe, stream))) / n
        return replayed, n_exe, enq

    def op_bench(self, req: Bench) -> Reply:
        """Interleaved timing (A B A B ...) as the cpu child's op_bench, on device buffers made once per
        argument set (inputs uploaded once, outputs poisoned once, not between samples), rotated round robin,
        L2 flushed before every sample unless the pool is over 2 x L2; "mode" events or graph. Afterwards
        the outputs of every argument set are copied back to shared memory."""
        self._init()
        mode = req.mode
        if mode not in ("events", "graph"):
            raise ValueError(f"mode must be events or graph, not {mode!r}")
        keys = [k.key for k in req.kernels]
        launches: dict[str, Launch | None] = {}
        for k in keys:
            try:
                launches[k] = self._launch_for(k, req.shape) if self.kinds[k] == "cubin" else None
            except ValueError as e:
                raise self._refused(e) from e
        sets: dict[str, list] = {k: [] for k in keys}
        graphs: list = []
        try:
            for k in req.kernels:
                for argset in k.argsets:
                    tensors: dict[str, DevTensor] = {}
                    sets[k.key].append((argset, tensors))
                    self._upload(argset, tensors, guard=False)
            pool = sum(t.nbytes for v in sets.values() for _, ts in v for t in ts.values())
            flush_bytes = 2 * self.l2 if pool < 2 * self.l2 else 0
            samplers, per_sample, enqueues = {}, {}, {}
            for k in keys:
                samplers[k], per_sample[k], enqueues[k] = self._sampler(k, sets[k], launches[k], mode, flush_bytes,
                                                                        graphs)
            self._warm_up_device(samplers, float(req.warmup_s), max(len(v) for v in sets.values()))
            samples, _ = sample_interleaved(samplers, req)
            # every set's output is checked by the parent, and a short loop (or a graph of fewer launches than
            # sets) may not have reached them all: each set gets one more run, like a timed one (same buffers)
            for k in keys:
                for enq in enqueues[k]:
                    enq()
            _ck("cuCtxSynchronize", cu.cuCtxSynchronize())
            for v in sets.values():
                for _, tensors in v:
                    for t in tensors.values():
                        if t.role == "out":
                            self._d2h(t, t.host)
            for graph, exe in graphs:
                _ck("cuGraphExecDestroy", cu.cuGraphExecDestroy(exe))
                _ck("cuGraphDestroy", cu.cuGraphDestroy(graph))
            graphs.clear()
            self._free([t.base for v in sets.values() for _, ts in v for t in ts.values()])
        except CudaError as e:
            raise e.fatal() from e
        except BaseException:
            self._free_quietly([t.base for v in sets.values() for _, ts in v for t in ts.values()])
            raise
        return Reply(samples=samples, mode=mode, launches_per_sample=per_sample, flushed=bool(flush_bytes),
                     **self._cpu())

    @staticmethod
    def _warm_up_device(samplers: dict, warmup_s: float, sets: int) -> int:
        """Sample every kernel until a round's device time has settled (runner_child.warm_up), and at least
        once on each of its `sets` argument sets (sample i runs set i mod sets), so no timed sample is a set's
        first run: a kernel that computes only on a freshly poisoned output is then timed by its repeat runs
        alone, as the cpu runner's warm-up ensures; the samples are dropped, the rounds it took returned."""
        return warm_up(lambda n: sum(s(n) for s in samplers.values()), warmup_s, min_rounds=sets)

    def op_device(self, req: DeviceQuery) -> Reply:
        """info: {"name", "uuid", "arch", "sm_count", "l2_bytes", "mem_bytes", "smem_optin", "cc"}."""
        return Reply(info=self._device_info())

    def _device_info(self) -> dict:
        self._init()
        dev = self.dev
        name = _ck("cuDeviceGetName", cu.cuDeviceGetName(256, dev))
        name = (name.split(b"\0")[0].decode(errors="replace") if isinstance(name, (bytes, bytearray))
                else str(name).split("\0")[0])
        uuid = _uuid_text(_ck("cuDeviceGetUuid", cu.cuDeviceGetUuid(dev)).bytes)
        major = self._attr(dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = self._attr(dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        return {"name": name.strip(), "uuid": uuid, "arch": arch_of(major, minor), "cc": f"{major}.{minor}",
                "sm_count": self._attr(dev, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
                "l2_bytes": self.l2, "smem_optin": self.smem_optin,
                "mem_bytes": int(_ck("cuDeviceTotalMem", cu.cuDeviceTotalMem(dev)))}

    def op_ceilings(self, req: Ceilings) -> Reply:
        """Measured ceilings, as info: {"mem_bandwidth_gbps" (device-to-device copy, bytes read + written),
        "peak_gflops" (fp32 FMA chains), "peak_bf16_gflops" (torch.matmul 8192^3 bf16; 0 without torch),
        "notes": [why a figure is 0]}."""
        self._init()
        out = {"mem_bandwidth_gbps": 0.0, "peak_gflops": 0.0, "peak_bf16_gflops": 0.0, "notes": []}
        try:
            out["mem_bandwidth_gbps"] = self._copy_bandwidth(int(req.copy_bytes))
            out["peak_gflops"] = self._fp32_peak(req.arch or self._device_info()["arch"])
        except CudaError as e:
            raise e.fatal() from e
        except Exception as e:  # noqa: BLE001 - the probe could not compile: report why, keep the rest
            out["notes"].append(f"fp32 probe: {type(e).__name__}: {e}")
        try:
            out["peak_bf16_gflops"] = self._bf16_peak(int(req.matmul_n))
        except ImportError as e:
            out["notes"].append(f"bf16 probe: torch not importable: {e}")
        except Exception as e:  # noqa: BLE001
            out["notes"].append(f"bf16 probe: {type(e).__name__}: {e}")
        return Reply(info=out)

    def _copy_bandwidth(self, nbytes: int) -> float:
        free, _total = _ck("cuMemGetInfo", cu.cuMemGetInfo())
        nbytes = max(1 << 20, min(nbytes, int(free) // 4))
        src, dst = self._alloc(nbytes), self._alloc(nbytes)
        try:
            _ck("cuMemsetD8", cu.cuMemsetD8(_dptr(src), 1, nbytes))
            copy = lambda: _ck("cuMemcpyDtoDAsync", cu.cuMemcpyDtoDAsync(  # noqa: E731
                _dptr(dst), _dptr(src), nbytes, self.stream0))
            for _ in range(2):
                self._time(self.stream0, copy)
            med = statistics.median(self._time(self.stream0, copy) for _ in range(10))
        finally:
            self._free([src, dst])
        return 2 * nbytes / med / 1e9

    def _fp32_peak(self, arch: str) -> float:
        from kfactory.targets.cuda.compile import compile_cuda
        res = compile_cuda(fma_source(), "cuda", "", "fma_peak", arch, None)
        if not res.ok:
            raise RuntimeError(f"the fp32 probe did not compile: {res.message} {res.log[-500:]}")
        buf = ctypes.create_string_buffer(res.artifact)
        mod = _ck("cuModuleLoadData", cu.cuModuleLoadData(ctypes.addressof(buf)))
        self.modules.append(mod)
        fn = _ck("cuModuleGetFunction", cu.cuModuleGetFunction(mod, b"fma_peak"))
        sms = self._attr(self.dev, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        block, grid = 256, sms * 8
        threads = block * grid
        iters = 1 << 14
        out = self._alloc(threads * 4)
        try:
            params, keep = self._pack([ctypes.c_uint64(out), ctypes.c_int64(iters), ctypes.c_float(0.999999),
                                       ctypes.c_float(1e-6)])

            def run(keep=keep):
                _ck("cuLaunchKernel", cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, self.stream0, params, 0))
            self._time(self.stream0, run)
            best = min(self._time(self.stream0, run) for _ in range(5))
        finally:
            self._free([out])
        return threads * iters * FMA_FLOPS_PER_ITER / best / 1e9

    def _bf16_peak(self, n: int) -> float:
        import torch
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        times = []
        for _ in range(10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.matmul(a, b, out=c)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e-3)
        del a, b, c
        torch.cuda.empty_cache()
        return 2 * n**3 / statistics.median(times) / 1e9


if __name__ == "__main__":
    main(CudaChild)

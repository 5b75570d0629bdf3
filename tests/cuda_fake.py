"""The fake CUDA driver the cuda child's tests run on where there is no GPU: device memory is host memory and kernels
are Python functions; and the sessions built over it (in this process, through the runner protocol's encoding)."""
from __future__ import annotations

import ctypes
import struct
import subprocess
import time
import types
from pathlib import Path

import numpy as np
from kfactory.problems import load_problem
from kfactory.sandbox import protocol
from kfactory.sandbox.child import serve
from kfactory.sandbox.parent import fault_error


class _Fake:
    """Enough of cuda.bindings.driver for the child: device memory is host memory, kernels are Python."""

    def __init__(self, real):
        self.real = real
        for n in ("CUresult", "CUdevice_attribute", "CUctx_flags", "CUevent_flags", "CUstream_flags",
                  "CUstreamCaptureMode", "CUfunction_attribute", "CUdeviceptr", "CUstream"):
            setattr(self, n, getattr(real, n))
        self.mem: dict[int, ctypes.Array] = {}
        self.sticky = 0
        self.capturing = None
        self.events: dict[int, float] = {}
        self.kernels = {"kernel": (4, _softmax_kernel), "oob": (4, _oob_kernel), "fma_peak": (4, lambda v: None)}
        self.smem_attr = {}
        self.launches = 0

    def _r(self, *vals):
        return (self.CUresult(self.sticky), *vals)

    def cuInit(self, flags): return self._r()
    def cuDeviceGetCount(self): return self._r(1)
    def cuDeviceGet(self, i): return self._r(0)
    def cuDevicePrimaryCtxSetFlags(self, dev, flags): return self._r()
    def cuDevicePrimaryCtxRetain(self, dev): return self._r(1)
    def cuCtxSetCurrent(self, ctx): return self._r()
    def cuEventCreate(self, flags):
        self.n_events = getattr(self, "n_events", 0) + 1
        return self._r(100 + self.n_events)

    def cuDeviceGetAttribute(self, attr, dev):
        A = self.CUdevice_attribute
        return self._r({A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: 1 << 20,
                        A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448,
                        A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 4,
                        A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
                        A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0}[attr])

    def cuMemAlloc(self, n):
        buf = (ctypes.c_uint8 * n)()
        self.mem[ctypes.addressof(buf)] = buf
        return self._r(self.CUdeviceptr(ctypes.addressof(buf)))

    def cuMemFree(self, p):
        assert int(p) in self.mem, "freeing what was not allocated"
        del self.mem[int(p)]
        return self._r()

    def _check(self, addr, n):
        assert any(b <= addr and addr + n <= b + len(buf) for b, buf in self.mem.items()), "out of the allocations"

    def _memset(self, p, value, n, ctype):
        self._check(int(p), n * ctypes.sizeof(ctype))
        np.ctypeslib.as_array((ctype * n).from_address(int(p)))[:] = value
        return self._r()

    def cuMemsetD32(self, p, v, n): return self._memset(p, v, n, ctypes.c_uint32)
    def cuMemsetD16(self, p, v, n): return self._memset(p, v, n, ctypes.c_uint16)
    def cuMemsetD8(self, p, v, n): return self._memset(p, v, n, ctypes.c_uint8)
    def cuMemsetD8Async(self, p, v, n, s): return self._memset(p, v, n, ctypes.c_uint8)

    def cuMemcpyHtoD(self, dst, src, n):
        assert isinstance(src, int)
        self._check(int(dst), n)
        ctypes.memmove(int(dst), src, n)
        return self._r()

    def cuMemcpyDtoH(self, dst, src, n):
        assert isinstance(dst, int)
        self._check(int(src), n)
        ctypes.memmove(dst, int(src), n)
        return self._r()

    def cuMemcpyDtoDAsync(self, dst, src, n, s):
        ctypes.memmove(int(dst), int(src), n)
        return self._r()

    def cuMemGetInfo(self): return self._r(1 << 30, 1 << 31)
    def cuModuleLoadData(self, image):
        assert isinstance(image, int)
        return self._r(7)

    def cuModuleUnload(self, mod):
        self.unloaded = getattr(self, "unloaded", 0) + 1
        return self._r()

    def cuModuleGetFunction(self, mod, name):
        assert isinstance(name, bytes)
        if name.decode() not in self.kernels:
            return (self.CUresult.CUDA_ERROR_NOT_FOUND, None)
        return self._r(name.decode())

    def cuFuncSetAttribute(self, fn, attr, value):
        self.smem_attr[fn] = value
        return self._r()

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        assert extra == 0 and isinstance(params, int)
        if smem > 48 << 10 and self.smem_attr.get(fn, 0) < smem:
            return (self.CUresult.CUDA_ERROR_INVALID_VALUE,)
        nargs, body = self.kernels[fn]
        ptrs = (ctypes.c_void_p * nargs).from_address(params)
        raw = [ctypes.c_uint64.from_address(ptrs[i]).value for i in range(nargs)]
        call = lambda: self._run(body, raw, (gx, gy, gz))  # noqa: E731 - the parameters were copied at launch
        if self.capturing is not None:
            self.capturing.append(call)
        else:
            call()
        return self._r()

    def _run(self, body, raw, grid):
        self.launches += 1
        self.grid = grid   # what a kernel that writes one result a block (kf_compare) needs to know
        if body(raw) == "fault":
            self.sticky = int(self.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS)

    def cuEventRecord(self, ev, stream):
        self.events[ev] = time.perf_counter()
        return self._r()

    def cuEventSynchronize(self, ev): return self._r()
    def cuCtxSynchronize(self): return self._r()
    def cuEventElapsedTime(self, a, b): return self._r(max(1e-4, (self.events[b] - self.events[a]) * 1e3))
    def cuStreamCreate(self, flags): return self._r(self.CUstream(5))

    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return self._r()

    def cuStreamEndCapture(self, stream):
        graph, self.capturing = self.capturing, None
        return self._r(graph)

    def cuGraphInstantiate(self, graph, flags): return self._r(list(graph))

    def cuGraphLaunch(self, exe, stream):
        for call in exe:
            call()
        return self._r()

    def cuGraphExecDestroy(self, exe): return self._r()
    def cuGraphDestroy(self, g): return self._r()
    def cuDeviceGetName(self, n, dev): return self._r(b"Fake H200" + b"\0" * (n - 9))
    def cuDeviceGetUuid(self, dev): return self._r(types.SimpleNamespace(bytes=bytes(range(16))))
    def cuDeviceTotalMem(self, dev): return self._r(141 << 30)


def _as_i64(v: int) -> int:
    return ctypes.c_int64(v).value


def _as_i32(v: int) -> int:
    return ctypes.c_int32(v & 0xFFFFFFFF).value   # a 4-byte parameter read as 8: the high half is not its


def _as_f64(v: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", v))[0]


def host_build(source: str, so: Path) -> ctypes.CDLL:
    """Device source built for this host with the system compiler, as its tests' twin: the element and row
    functions in the #else branch's loops, no fused multiply-adds (the device builds with --fmad=false)."""
    subprocess.run(["cc", "-x", "c", "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(so), "-", "-lm"],
                   input=source, text=True, check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def judge_host(so: Path) -> ctypes.CDLL:
    """The judge's kernels (kfactory/targets/cuda/judge/kf_judge.cu) built for this host, typed."""
    from kfactory.targets.cuda import judge_kernels
    lib = host_build(judge_kernels.source(), so)
    c = ctypes
    lib.kf_draw_host.argtypes = [c.c_void_p, c.c_int, c.c_longlong, c.c_longlong, c.c_ulonglong, c.c_uint, c.c_int,
                                 c.c_double, c.c_double, c.c_double]
    lib.kf_compare_host.argtypes = [c.c_void_p, c.c_int, c.c_void_p, c.c_longlong, c.c_double, c.c_double, c.c_int,
                                    c.c_void_p]
    lib.kf_count_diff_host.argtypes = [c.c_void_p, c.c_void_p, c.c_longlong, c.c_void_p]
    lib.kf_count_unequal_host.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_longlong, c.c_void_p]
    return lib


def judge_kernels(fake: "_Fake", judge: ctypes.CDLL, softmax_ref: ctypes.CDLL) -> dict:
    """kf_draw, kf_compare, kf_count_diff, kf_count_unequal and softmax's reference_f64 for the fake driver, each
    run by its host build on the launch's parameters (kf_compare's partials one per block of the launch's grid)."""
    def draw(raw):
        judge.kf_draw_host(raw[0], _as_i32(raw[1]), _as_i64(raw[2]), _as_i64(raw[3]), raw[4], raw[5] & 0xFFFFFFFF,
                           _as_i32(raw[6]), _as_f64(raw[7]), _as_f64(raw[8]), _as_f64(raw[9]))

    def compare(raw):
        judge.kf_compare_host(raw[0], _as_i32(raw[1]), raw[2], _as_i64(raw[3]), _as_f64(raw[4]), _as_f64(raw[5]),
                              fake.grid[0], raw[6])

    def reference(raw):
        softmax_ref.reference_f64_host(ctypes.c_void_p(raw[0]), ctypes.c_void_p(raw[1]),
                                       ctypes.c_longlong(_as_i64(raw[2])), ctypes.c_longlong(_as_i64(raw[3])))
    def count_diff(raw):
        judge.kf_count_diff_host(raw[0], raw[1], _as_i64(raw[2]), raw[3])

    def count_unequal(raw):
        judge.kf_count_unequal_host(raw[0], raw[1], _as_i32(raw[2]), _as_i64(raw[3]), raw[4])

    return {"kf_draw": (10, draw), "kf_compare": (7, compare), "kf_count_diff": (4, count_diff),
            "kf_count_unequal": (5, count_unequal), "reference_f64": (4, reference)}


def _softmax_kernel(raw):
    x_addr, y_addr, rows, cols = raw[0], raw[1], _as_i64(raw[2]), _as_i64(raw[3])
    n = rows * cols
    x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x_addr)).reshape(rows, cols)
    y = np.ctypeslib.as_array((ctypes.c_float * n).from_address(y_addr)).reshape(rows, cols)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    y[...] = e / e.sum(axis=-1, keepdims=True)


def _oob_kernel(raw):
    _softmax_kernel(raw)
    return "fault"


class _InProcessRunner:
    """Runner's interface over a CudaChild in this process (the fake driver cannot cross a fork): every request
    and reply goes through the protocol's encoding and the child's serve(), as over the pipe; a fault that says
    the child is exiting kills it (counted), as Runner does."""

    def __init__(self, child):
        self.child, self.loaded, self.timeout_s, self.last_reply, self.killed = child, set(), 20.0, None, 0

    def request(self, req, timeout_s=None):
        req = protocol.decode_request(protocol.encode_request(req))
        reply = protocol.decode_reply(protocol.encode_reply(serve(self.child, req)))
        self.last_reply = reply
        if reply.fault is not None:
            if reply.fault.exiting:
                self.kill()
            raise fault_error(reply.fault)
        return reply

    def ensure_loaded(self, load):
        if load.key not in self.loaded:
            self.request(load)
            self.loaded.add(load.key)

    def unload(self, key):
        from kfactory.sandbox.protocol import Unload
        held = key in self.loaded
        self.loaded.discard(key)
        return self.request(Unload(key)) if held else None

    def kill(self):
        self.killed += 1

    def stop(self):
        pass


def _bare_session(cuda, settings, problem=None):
    """A CudaSession without a GPU behind it (no NVML, no runner process)."""
    target = cuda.make("sm_90a", settings)
    target._gpu = ("GPU-fake", "Fake H200")
    return cuda.CudaSession(target, problem or load_problem("softmax"))


def _x(rows, cols, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)}


def _ref(x):
    e = np.exp(x["x"].astype(np.float64) - x["x"].max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

"""The cuda device's measured ceilings, probed in the runner child: device-to-device copy bandwidth, the fp32 peak of
independent FMA chains, and the bf16 matmul peak through torch (0 without it)."""
from __future__ import annotations

import ctypes
import statistics

from kfactory.targets.cuda import driver
from kfactory.targets.cuda.allocator import Allocator
from kfactory.targets.cuda.device import CudaDevice
from kfactory.targets.cuda.driver import check, dptr
from kfactory.targets.cuda.program import pack


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


def copy_bandwidth(device: CudaDevice, mem: Allocator, nbytes: int) -> float:
    """GB/s of a device-to-device copy (bytes read + written), the median of 10 after 2 warm-up copies."""
    free, _total = check("cuMemGetInfo", driver.cu.cuMemGetInfo())
    nbytes = max(1 << 20, min(nbytes, int(free) // 4))
    src, dst = mem.alloc(nbytes), mem.alloc(nbytes)
    try:
        check("cuMemsetD8", driver.cu.cuMemsetD8(dptr(src), 1, nbytes))
        copy = lambda: check("cuMemcpyDtoDAsync", driver.cu.cuMemcpyDtoDAsync(  # noqa: E731
            dptr(dst), dptr(src), nbytes, device.stream0))
        for _ in range(2):
            device.time(device.stream0, copy)
        med = statistics.median(device.time(device.stream0, copy) for _ in range(10))
    finally:
        mem.free([src, dst])
    return 2 * nbytes / med / 1e9


def fp32_peak(device: CudaDevice, mem: Allocator, modules: list, arch: str) -> float:
    """GFLOP/s of the FMA probe (fma_source), compiled for `arch`, on 8 blocks per SM; the best of 5."""
    from kfactory.targets.cuda.compile import compile_cuda
    res = compile_cuda(fma_source(), "cuda", "", "fma_peak", arch, None)
    if not res.ok:
        raise RuntimeError(f"the fp32 probe did not compile: {res.message} {res.log[-500:]}")
    buf = ctypes.create_string_buffer(res.artifact)
    mod = check("cuModuleLoadData", driver.cu.cuModuleLoadData(ctypes.addressof(buf)))
    modules.append(mod)
    fn = check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, b"fma_peak"))
    sms = device.attr(device.dev, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
    block, grid = 256, sms * 8
    threads = block * grid
    iters = 1 << 14
    out = mem.alloc(threads * 4)
    try:
        params, keep = pack([ctypes.c_uint64(out), ctypes.c_int64(iters), ctypes.c_float(0.999999),
                             ctypes.c_float(1e-6)])

        def run(keep=keep):
            check("cuLaunchKernel", driver.cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, device.stream0, params, 0))
        device.time(device.stream0, run)
        best = min(device.time(device.stream0, run) for _ in range(5))
    finally:
        mem.free([out])
    return threads * iters * FMA_FLOPS_PER_ITER / best / 1e9


def bf16_peak(n: int) -> float:
    """GFLOP/s of torch.matmul on n x n bf16 matrices (ImportError without torch)."""
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

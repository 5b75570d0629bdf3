"""The judge's work done where the outputs are (issue 23), in the cuda runner child: a verification input drawn in
place from its recorded seed (kf_draw; kfactory.judge.counter_rng reproduces any row on the host), a problem's
float64 reference computed by its own device kernel (spec `reference_f64`), and an output compared with that
reference in per-block partials (kf_compare) that come back as a few kilobytes instead of the output and its
reference. The kernels are the judge's, never a candidate's (kfactory/targets/cuda/judge/).
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from kfactory.judge import counter_rng
from kfactory.targets.cuda import driver, judge_kernels
from kfactory.targets.cuda.driver import check, dptr
from kfactory.targets.cuda.launch import evaluate_launch
from kfactory.targets.cuda.program import pack

#: threads a block of kf_draw, and the most blocks either judge kernel takes (grid-stride loops do the rest)
DRAW_THREADS = 256
MAX_BLOCKS = 4096


class DeviceJudgeError(RuntimeError):
    """A judge kernel could not be built or a problem has no device reference: the judge takes the host path."""


def _cubin(source: str, flags: str, entry: str, arch: str, cache_dir) -> bytes:
    from kfactory.targets.cuda.compile import compile_cuda
    res = compile_cuda(source, "cuda", flags, entry, arch, cache_dir)
    if not res.ok:
        raise DeviceJudgeError(f"the judge's {entry} did not build for {arch}: {res.message} {res.log[-800:]}")
    return res.artifact


class DeviceJudge:
    """The judge's kernels in the current CUDA context (the child's; `device` started). Modules are appended to
    `modules`, which the child unloads with its own."""

    def __init__(self, device, mem, modules: list, arch: str, cache_dir=None):
        self.device, self.mem, self.modules, self.arch, self.cache_dir = device, mem, modules, arch, cache_dir
        image = _cubin(judge_kernels.source(), judge_kernels.FLAGS, judge_kernels.DRAW, arch, cache_dir)
        mod = self._load(image)
        self.draw_fn = check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, judge_kernels.DRAW.encode()))
        self.compare_fn = check("cuModuleGetFunction",
                                driver.cu.cuModuleGetFunction(mod, judge_kernels.COMPARE.encode()))
        self.references: dict[str, Any] = {}

    def _load(self, image: bytes):
        buf = ctypes.create_string_buffer(image)
        mod = check("cuModuleLoadData", driver.cu.cuModuleLoadData(ctypes.addressof(buf)))
        self.modules.append(mod)
        return mod

    def _launch(self, fn, blocks: int, threads: int, values: list) -> None:
        params, keep = pack(values)
        check("cuLaunchKernel", driver.cu.cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, self.device.stream0,
                                                         params, 0))
        del keep   # the driver copies the parameters at launch

    def draw(self, addr: int, dtype: str, n: int, cols: int, seed: int, tensor: int, dist) -> None:
        """Fill the device buffer at `addr` (n elements of `dtype`, rows of `cols`) with input tensor number
        `tensor` of a set drawn from `seed` by distribution `dist` (counter_rng.elements on the host)."""
        kind, a, b = counter_rng.params(dist)
        blocks = max(1, min(MAX_BLOCKS, -(-n // DRAW_THREADS)))
        self._launch(self.draw_fn, blocks, DRAW_THREADS, [
            ctypes.c_uint64(addr), ctypes.c_int(counter_rng.DTYPES[dtype]), ctypes.c_longlong(n),
            ctypes.c_longlong(max(1, cols)), ctypes.c_uint64(seed), ctypes.c_uint(tensor),
            ctypes.c_int(counter_rng.KINDS[kind]), ctypes.c_double(a), ctypes.c_double(b),
            ctypes.c_double(float(dist.neg_inf_fraction))])

    def reference(self, problem, shape: dict[str, int], inputs: dict[str, int], outputs: dict[str, int]) -> None:
        """Run the problem's float64 reference kernel on device inputs (name -> address) into float64 output
        buffers (name -> address), at `shape`, with the problem's params."""
        fn, rule = self._reference(problem)
        launch = evaluate_launch(rule, shape)
        values: list = [ctypes.c_uint64(inputs[t.name]) for t in problem.spec.inputs]
        values += [ctypes.c_uint64(outputs[t.name]) for t in problem.spec.outputs]
        values += [ctypes.c_longlong(shape[s]) for s in problem.spec.symbols]
        values += [ctypes.c_double(float(v)) for v in problem.params.values()]
        params, keep = pack(values)
        check("cuLaunchKernel", driver.cu.cuLaunchKernel(fn, *launch.grid, *launch.block, launch.smem,
                                                         self.device.stream0, params, 0))
        del keep

    def _reference(self, problem):
        if problem.name not in self.references:
            found = problem.reference_f64("cuda")
            if found is None:
                raise DeviceJudgeError(f"problem {problem.name} has no float64 device reference (reference_f64)")
            source, flags, launch = found
            mod = self._load(_cubin(source, flags, "reference_f64", self.arch, self.cache_dir))
            fn = check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, b"reference_f64"))
            self.references[problem.name] = (fn, {**launch, "params": {}})
        return self.references[problem.name]

    def compare(self, out: int, dtype: str, ref: int, n: int, atol: float, rtol: float) -> dict:
        """The comparison figures (judge_kernels.merge's keys) of n output elements of `dtype` at `out` against
        their float64 reference at `ref`, reduced on the device."""
        threads = judge_kernels.COMPARE_THREADS
        blocks = max(1, min(MAX_BLOCKS, -(-n // threads)))
        partials = np.zeros(blocks, dtype=judge_kernels.STATS)
        dev = self.mem.alloc(partials.nbytes)
        try:
            self._launch(self.compare_fn, blocks, threads, [
                ctypes.c_uint64(out), ctypes.c_int(counter_rng.DTYPES[dtype]), ctypes.c_uint64(ref),
                ctypes.c_longlong(n), ctypes.c_double(atol), ctypes.c_double(rtol), ctypes.c_uint64(dev)])
            check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(partials.ctypes.data, dptr(dev), partials.nbytes))
        finally:
            self.mem.free([dev])
        return judge_kernels.merge(partials)

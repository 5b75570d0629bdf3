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

    def __init__(self, device, mem, modules: list, arch: str, cache_dir=None, image: bytes | None = None):
        """`image`: the judge kernels' cubin as the parent built it (judge_kernels.source()); None builds it here."""
        self.device, self.mem, self.modules, self.arch, self.cache_dir = device, mem, modules, arch, cache_dir
        if image is None:
            image = _cubin(judge_kernels.source(), judge_kernels.FLAGS, judge_kernels.DRAW, arch, cache_dir)
        mod = self._load(image)
        self.draw_fn = check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, judge_kernels.DRAW.encode()))
        self.compare_fn = check("cuModuleGetFunction",
                                driver.cu.cuModuleGetFunction(mod, judge_kernels.COMPARE.encode()))
        self.diff_fn = check("cuModuleGetFunction",
                             driver.cu.cuModuleGetFunction(mod, judge_kernels.COUNT_DIFF.encode()))
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
        self.draw_raw(addr, dtype, n, cols, seed, tensor, kind, a, b, float(dist.neg_inf_fraction))

    def draw_raw(self, addr: int, dtype: str, n: int, cols: int, seed: int, tensor: int, kind: str, a: float,
                 b: float, neg_inf: float) -> None:
        """draw() from the distribution's numbers (counter_rng.params) as a request carries them."""
        blocks = max(1, min(MAX_BLOCKS, -(-n // DRAW_THREADS)))
        self._launch(self.draw_fn, blocks, DRAW_THREADS, [
            ctypes.c_uint64(addr), ctypes.c_int(counter_rng.DTYPES[dtype]), ctypes.c_longlong(n),
            ctypes.c_longlong(max(1, cols)), ctypes.c_uint64(seed), ctypes.c_uint(tensor),
            ctypes.c_int(counter_rng.KINDS[kind]), ctypes.c_double(a), ctypes.c_double(b), ctypes.c_double(neg_inf)])

    def count_diff(self, a: int, b: int, nbytes: int) -> int:
        """How many of `nbytes` bytes differ between device buffers a and b."""
        dev = self.mem.alloc(8)
        try:
            check("cuMemsetD8", driver.cu.cuMemsetD8(dptr(dev), 0, 8))
            blocks = max(1, min(MAX_BLOCKS, -(-nbytes // DRAW_THREADS)))
            self._launch(self.diff_fn, blocks, DRAW_THREADS, [ctypes.c_uint64(a), ctypes.c_uint64(b),
                                                               ctypes.c_longlong(nbytes), ctypes.c_uint64(dev)])
            count = np.zeros(1, dtype=np.uint64)
            check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(count.ctypes.data, dptr(dev), 8))
        finally:
            self.mem.free([dev])
        return int(count[0])

    def reference(self, problem, shape: dict[str, int], inputs: dict[str, int], outputs: dict[str, int]) -> None:
        """Run the problem's float64 reference kernel on device inputs (name -> address) into float64 output
        buffers (name -> address), at `shape`, with the problem's params."""
        if problem.name not in self.references:
            found = problem.reference_f64("cuda")
            if found is None:
                raise DeviceJudgeError(f"problem {problem.name} has no float64 device reference (reference_f64)")
            source, flags, launch = found
            self.references[problem.name] = self._reference_fn(
                _cubin(source, flags, "reference_f64", self.arch, self.cache_dir), launch)
        pointers = [inputs[t.name] for t in problem.spec.inputs] + [outputs[t.name] for t in problem.spec.outputs]
        self.run_reference(self.references[problem.name], shape, pointers, [shape[s] for s in problem.spec.symbols],
                           list(problem.params.values()))

    def load_reference(self, path: str, launch: dict):
        """A problem's float64 reference kernel from its cubin at `path` (compiled by the parent), loaded once."""
        if path not in self.references:
            with open(path, "rb") as f:
                self.references[path] = self._reference_fn(f.read(), launch)
        return self.references[path]

    def _reference_fn(self, image: bytes, launch: dict):
        mod = self._load(image)
        return check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, b"reference_f64")), \
            {**launch, "params": {}}

    def run_reference(self, loaded, shape: dict[str, int], pointers: list[int], symbols: list[int],
                      params: list[float]) -> None:
        """Launch a loaded reference kernel: its tensors (inputs, then float64 outputs, in the spec's order), the
        shape symbols, the problem's params."""
        fn, rule = loaded
        launch = evaluate_launch(rule, shape)
        values: list = [ctypes.c_uint64(p) for p in pointers]
        values += [ctypes.c_longlong(int(v)) for v in symbols] + [ctypes.c_double(float(v)) for v in params]
        params_buf, keep = pack(values)
        check("cuLaunchKernel", driver.cu.cuLaunchKernel(fn, *launch.grid, *launch.block, launch.smem,
                                                         self.device.stream0, params_buf, 0))
        del keep

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


# -- the parent's side: what a device check asks for --------------------------------------------------------

def unavailable(problem, shape: dict[str, int], dist: str) -> str | None:
    """None when a check of `problem` at `shape` from `dist` can be judged on the device: the problem ships a
    float64 reference kernel, every input can be drawn there and every output compared there; else why not."""
    if problem.reference_f64("cuda") is None:
        return f"problem {problem.name} has no float64 device reference (reference_f64)"
    if (why := counter_rng.device_drawable(problem, dist)) is not None:
        return why
    for t in problem.spec.outputs:
        if t.dtype not in counter_rng.DTYPES:
            return f"output {t.name} is {t.dtype}; the device compares {', '.join(counter_rng.DTYPES)}"
    return None


def device_argset(problem, abi_args: list[str], shape: dict[str, int], dist: str, seed: int) -> list[dict]:
    """The DeviceCheck request's arguments: the ABI's order (then tensors outside it), inputs with the numbers
    of their draw (tensor index = the input's place in the spec, as counter_rng.draw numbers them), outputs with
    their tolerance, scalars as a call's."""
    from kfactory.sandbox.shm_args import scalar_arg
    spec, out = problem.spec, {}
    distribution = spec.distributions[dist]
    for k, t in enumerate(spec.inputs):
        tshape = problem.tensor_shape(t, shape)
        kind, a, b = counter_rng.params(distribution[t.name])
        out[t.name] = {"name": t.name, "role": "in", "dtype": t.dtype, "shape": list(tshape),
                       "draw": {"seed": int(seed), "tensor": k, "kind": kind, "a": a, "b": b,
                                "neg_inf": float(distribution[t.name].neg_inf_fraction),
                                "cols": int(tshape[-1]) if tshape else 1}}
    for t in spec.outputs:
        tol = spec.tolerance[t.dtype]
        out[t.name] = {"name": t.name, "role": "out", "dtype": t.dtype, "shape": list(problem.tensor_shape(t, shape)),
                       "compare": {"atol": float(tol.atol), "rtol": float(tol.rtol)}}
    ordered = [out.pop(a) if a in out else scalar_arg(problem, a, shape) for a in abi_args]
    return ordered + list(out.values())


def reference_request(problem, shape: dict[str, int], judge_path: str, reference_path: str) -> dict:
    """DeviceCheck.reference: the judge's and the problem's reference cubins, the reference's launch rule and
    arguments."""
    _, _, launch = problem.reference_f64("cuda")
    return {"judge": judge_path, "path": reference_path, "launch": launch,
            "inputs": [t.name for t in problem.spec.inputs], "outputs": [t.name for t in problem.spec.outputs],
            "symbols": [int(shape[s]) for s in problem.spec.symbols],
            "params": [float(v) for v in problem.params.values()]}


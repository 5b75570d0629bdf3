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
    """The judge's kernels or a problem's float64 reference kernel did not build for the device."""


class DeviceJudge:
    """The judge's kernels in the current CUDA context (the child's; `device` started), from their cubin `image`
    (judge_kernels.source() as the parent built it). Modules are appended to `modules`, kept with the child's."""

    def __init__(self, device, mem, modules: list, image: bytes):
        self.device, self.mem, self.modules = device, mem, modules
        mod = self._load(image)
        self.draw_fn, self.compare_fn, self.diff_fn, self.unequal_fn = (
            check("cuModuleGetFunction", driver.cu.cuModuleGetFunction(mod, name.encode()))
            for name in (judge_kernels.DRAW, judge_kernels.COMPARE, judge_kernels.COUNT_DIFF,
                         judge_kernels.COUNT_UNEQUAL))
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

    def draw(self, addr: int, dtype: str, n: int, spec: dict) -> None:
        """Fill the device buffer at `addr` (n elements of `dtype`) with the input a request's "draw" descriptor
        names (draw_spec: seed, tensor index, distribution, rows of `cols`); counter_rng.elements on the host."""
        blocks = max(1, min(MAX_BLOCKS, -(-n // DRAW_THREADS)))
        self._launch(self.draw_fn, blocks, DRAW_THREADS, [
            ctypes.c_uint64(addr), ctypes.c_int(counter_rng.DTYPES[dtype]), ctypes.c_longlong(n),
            ctypes.c_longlong(max(1, spec["cols"])), ctypes.c_uint64(spec["seed"]), ctypes.c_uint(spec["tensor"]),
            ctypes.c_int(counter_rng.KINDS[spec["kind"]]), ctypes.c_double(spec["a"]), ctypes.c_double(spec["b"]),
            ctypes.c_double(spec["neg_inf"])])

    def count_diff(self, a: int, b: int, nbytes: int) -> int:
        """How many of `nbytes` bytes differ between device buffers a and b (what a kernel wrote into an input)."""
        return self._count(self.diff_fn, nbytes, lambda dev: [ctypes.c_uint64(a), ctypes.c_uint64(b),
                                                                ctypes.c_longlong(nbytes), ctypes.c_uint64(dev)])

    def count_unequal(self, a: int, b: int, dtype: str, n: int) -> int:
        """How many of n elements of `dtype` differ in value between device buffers a and b (two runs' outputs:
        a NaN equals a NaN, -0 equals 0, as the host counts them: numerics.differing_elements)."""
        return self._count(self.unequal_fn, n, lambda dev: [
            ctypes.c_uint64(a), ctypes.c_uint64(b), ctypes.c_int(counter_rng.DTYPES[dtype]), ctypes.c_longlong(n),
            ctypes.c_uint64(dev)])

    def _count(self, fn, n: int, params) -> int:
        """Run a counting kernel over n items into a zeroed device counter (`params(counter)`: its parameters)."""
        dev = self.mem.alloc(8)
        try:
            check("cuMemsetD8", driver.cu.cuMemsetD8(dptr(dev), 0, 8))
            self._launch(fn, max(1, min(MAX_BLOCKS, -(-n // DRAW_THREADS))), DRAW_THREADS, params(dev))
            count = np.zeros(1, dtype=np.uint64)
            check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(count.ctypes.data, dptr(dev), 8))
        finally:
            self.mem.free([dev])
        return int(count[0])

    def reference(self, ref: dict, shape: dict[str, int], inputs: dict[str, int], outputs: dict[str, int]) -> None:
        """Run the problem's float64 reference kernel (`ref`: reference_request's dict; its cubin loaded once) on
        device inputs (name -> address) into float64 output buffers (name -> address) at `shape`."""
        if ref["path"] not in self.references:
            with open(ref["path"], "rb") as f:
                mod = self._load(f.read())
            self.references[ref["path"]] = check("cuModuleGetFunction",
                                                 driver.cu.cuModuleGetFunction(mod, b"reference_f64"))
        launch = evaluate_launch({**ref["launch"], "params": {}}, shape)
        values: list = [ctypes.c_uint64(inputs[n]) for n in ref["inputs"]]
        values += [ctypes.c_uint64(outputs[n]) for n in ref["outputs"]]
        values += [ctypes.c_longlong(int(v)) for v in ref["symbols"]]
        values += [ctypes.c_double(float(v)) for v in ref["params"]]
        params, keep = pack(values)
        check("cuLaunchKernel", driver.cu.cuLaunchKernel(self.references[ref["path"]], *launch.grid, *launch.block,
                                                         launch.smem, self.device.stream0, params, 0))
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


def draw_spec(dist, seed: int, tensor: int, cols: int) -> dict:
    """A request's "draw" descriptor of input tensor number `tensor` (its place in the spec, as counter_rng.draw
    numbers them) drawn from `seed` by distribution `dist`, in rows of `cols` (DeviceJudge.draw)."""
    kind, a, b = counter_rng.params(dist)
    return {"seed": int(seed), "tensor": tensor, "kind": kind, "a": a, "b": b,
            "neg_inf": float(dist.neg_inf_fraction), "cols": cols}


def device_argset(problem, abi_args: list[str], shape: dict[str, int], dist: str, seed: int) -> list[dict]:
    """The DeviceCheck request's arguments: the ABI's order (then tensors outside it), inputs with the numbers
    of their draw (tensor index = the input's place in the spec, as counter_rng.draw numbers them), outputs with
    their tolerance, scalars as a call's."""
    from kfactory.sandbox.shm_args import scalar_arg
    spec, out = problem.spec, {}
    distribution = spec.distributions[dist]
    for k, t in enumerate(spec.inputs):
        tshape = problem.tensor_shape(t, shape)
        out[t.name] = {"name": t.name, "role": "in", "dtype": t.dtype, "shape": list(tshape),
                       "draw": draw_spec(distribution[t.name], seed, k, int(tshape[-1]) if tshape else 1)}
    for t in spec.outputs:
        tol = spec.tolerance[t.dtype]
        out[t.name] = {"name": t.name, "role": "out", "dtype": t.dtype, "shape": list(problem.tensor_shape(t, shape)),
                       "compare": {"atol": float(tol.atol), "rtol": float(tol.rtol)}}
    ordered = [out.pop(a) if a in out else scalar_arg(problem, a, shape) for a in abi_args]
    return ordered + list(out.values())


def reference_request(problem, shape: dict[str, int], judge_path: str, reference_path: str) -> dict:
    """DeviceCheck.reference: the judge's and the problem's reference cubins, the reference's launch rule and
    arguments (DeviceJudge.reference)."""
    _, _, launch = problem.reference_f64("cuda")
    return {"judge": judge_path, "path": reference_path, "launch": launch,
            "inputs": [t.name for t in problem.spec.inputs], "outputs": [t.name for t in problem.spec.outputs],
            "symbols": [int(shape[s]) for s in problem.spec.symbols],
            "params": [float(v) for v in problem.params.values()]}


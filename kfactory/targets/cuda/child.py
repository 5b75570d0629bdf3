"""The cuda runner child: loads cubins (and the problem's torch baselines) and runs them on one GPU.

Started by kfactory.targets.cuda.target.CudaSession through kfactory.sandbox.parent.Runner as
`python -m kfactory.targets.cuda.child RFD WFD THREADS MEM_MB CPU_S` with CUDA_VISIBLE_DEVICES set to the
GPU's UUID, so the only visible device is device 0. It works in that device's PRIMARY context, which torch
in the same process shares. It speaks the typed protocol of kfactory.sandbox.protocol with the same
argument descriptors as the cpu child; the tensors live in shared-memory files and are copied to fresh
device buffers here.

Ops: load, call, bench, device, ceilings, device_check, unload (see each op_*). A CUDA error during a call or a
bench (a fault of the kernel, a refused launch) ends this process after one reply whose fault is DEVICE_FAULT,
LAUNCH_FAILED or CUDA_ERROR with the CUresult code and exiting set: a faulting kernel poisons the context, so the
parent replaces the runner. An invalid launch rule (kfactory.targets.cuda.launch) is a LAUNCH_FAILED fault that does
not end the process (nothing ran). Any other exception is the runner's own (HARNESS, kfactory.sandbox.child.serve).

The parts, split the way tinygrad's runtime/ops_cuda.py splits a backend: driver.py (the driver API, errors
classified by value), device.py (context, events, streams), allocator.py (device buffers, guard bands, the L2
flush), program.py (module load, function lookup, launch, graphs), sampling.py (timing samplers), probes.py (the
device's ceilings); this module is the op loop over them.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kfactory.sandbox.child import Child, KernelFault, _baseline, main, sample_interleaved
from kfactory.sandbox.protocol import (Arg, Bench, Call, Ceilings, DeviceCheck, DeviceQuery, FaultKind, Load, Ping,
                                       Reply, Unload)
from kfactory.targets.cuda import driver, probes
from kfactory.targets.cuda.allocator import Allocator, DevTensor, _nbytes
from kfactory.targets.cuda.device import CudaDevice, arch_of, cpu_usage  # noqa: F401 - arch_of: callers' name
from kfactory.targets.cuda.driver import CudaError, CudaUnavailable, check, classify, dptr  # noqa: F401 - classify: ditto
from kfactory.targets.cuda.launch import Launch
from kfactory.targets.cuda.program import enqueue_baseline, load_program
from kfactory.targets.cuda.sampling import sampler, warm_up_device


class CudaChild(Child):
    """The loaded kernels of one runner, in the primary context of the one visible GPU: the op loop over a device
    (kfactory.targets.cuda.device), an allocator (.allocator) and programs (.program)."""

    def __init__(self, threads: int):
        super().__init__(threads)
        self.device = CudaDevice()
        self.mem = Allocator(self._raw)
        self.modules: list = []               # every module loaded, kept for the life of the context
        self.prev_allocs: list[int] = []      # the previous call's buffers, freed after the next call's exist
        self.judge: Any = None                # the judge's own kernels (judge_device.DeviceJudge), once asked for

    def op_ping(self, req: Ping) -> Reply:
        """Also starts CUDA, so its cost (seconds on a GPU without persistence mode) falls in the start-up
        answer's generous timeout and not in the first load's; a failure is reported by the first real op."""
        try:
            self.device.start()
        except CudaUnavailable:
            pass
        return super().op_ping(req)

    @staticmethod
    def _refused(e: Exception) -> KernelFault:
        """A launch that was never attempted (the rule gives an invalid configuration): typed, not fatal."""
        return KernelFault(FaultKind.LAUNCH_FAILED, str(e))

    def _raw(self, a: Arg) -> np.ndarray:
        """The bytes of a shared-memory tensor descriptor (its file mapped as Child._mapping maps it: once per
        command, or for good when it is an arena the parent keeps)."""
        return np.ndarray((_nbytes(a),), dtype=np.uint8, buffer=self._mapping(a["path"]),
                          offset=int(a.get("offset", 0)))

    def op_load(self, req: Load) -> Reply:
        """kind "cubin": path, entry, argtypes, launch_rule; kind "baseline": module, name: the problem's
        reference.py, whose cuda_baselines()[name] is fn(ins, outs) on torch CUDA tensors."""
        self.device.start()
        if req.kind == "cubin":
            self.kernels[req.key] = load_program(req.path, req.entry, req.argtypes, req.launch_rule, self.modules)
        elif req.kind == "baseline":
            self.kernels[req.key] = _baseline(req, "cuda_baselines", "kf_problem_ref_cuda")
        else:
            raise ValueError(f"unknown kind {req.kind!r} for the cuda runner (cubin or baseline)")
        self.kinds[req.key] = req.kind
        return Reply()

    def _launch_for(self, key: str, shape: dict) -> Launch:
        """The launch configuration of cubin `key` at `shape` (ValueError when the rule gives none)."""
        return self.kernels[key].launch_for(shape, self.device.smem_optin)

    def _enqueue(self, key: str, argset: list[Arg], tensors: dict[str, DevTensor], launch: Launch | None,
                 stream):
        """A zero-argument callable that enqueues kernel `key` once on `stream` (baselines: torch's stream)."""
        if self.kinds[key] == "cubin":
            return self.kernels[key].enqueue(argset, tensors, launch, stream)
        return enqueue_baseline(self.kernels[key], tensors)

    def op_call(self, req: Call) -> Reply:
        """Fresh device buffers with guard bands, inputs uploaded, outputs poisoned; one timed run, then one
        per entry of "steps" on the same buffers (the previous outputs saved to the step's "outputs", its
        "inputs" uploaded, the outputs poisoned again). Outputs AND inputs are copied back to shared memory
        (the parent checks that inputs were not written). {"seconds": [per run], "out_of_bounds": [names]}"""
        self.device.start()
        key = req.key
        launch = None
        if self.kinds[key] == "cubin":
            try:
                launch = self._launch_for(key, req.shape)
            except ValueError as e:
                raise self._refused(e) from e
        tensors: dict[str, DevTensor] = {}
        try:
            self.mem.upload(req.args, tensors, guard=True)
            run = self._enqueue(key, req.args, tensors, launch, self.device.stream0)
            seconds = [self.device.time(self.device.stream0, run)]
            for step in req.steps:
                for name, desc in step["outputs"].items():
                    self.mem.d2h(tensors[name], self._raw(desc))
                for name, desc in step["inputs"].items():
                    self.mem.h2d(tensors[name], self._raw(desc))
                for name in step.get("poison", {}):
                    self.mem.poison(tensors[name])
                seconds.append(self.device.time(self.device.stream0, run))
            check("cuCtxSynchronize", driver.cu.cuCtxSynchronize())
            oob = sorted(n for n, t in tensors.items() if not self.mem.guards_intact(t))
            for t in tensors.values():
                self.mem.d2h(t, t.host)
            # keep this call's buffers until the next call has its own: consecutive calls never share addresses
            old, self.prev_allocs = self.prev_allocs, [t.base for t in tensors.values()]
            self.mem.free(old)
        except CudaError as e:
            raise e.fatal() from e
        except BaseException:
            self.mem.free_or_fatal([t.base for t in tensors.values()])
            raise
        return Reply(seconds=seconds, out_of_bounds=oob, **cpu_usage())

    def op_unload(self, req: Unload) -> Reply:
        """The module of cubin `key` unloaded and the last call's buffers freed (protocol.Unload); info says
        what device memory is still held, for the parent's leak check."""
        self.device.start()
        program = self.kernels.pop(req.key, None)
        kind = self.kinds.pop(req.key, None)
        try:
            if kind == "cubin" and program.module is not None:
                check("cuModuleUnload", driver.cu.cuModuleUnload(program.module))
                self.modules = [m for m in self.modules if m is not program.module]
            old, self.prev_allocs = self.prev_allocs, []
            self.mem.free(old)
            free, _total = check("cuMemGetInfo", driver.cu.cuMemGetInfo())
        except CudaError as e:
            raise e.fatal() from e
        return Reply(info={"live_bytes": self.mem.live_bytes(), "free_bytes": int(free)}, **cpu_usage())

    def op_device_check(self, req: DeviceCheck) -> Reply:
        """Inputs drawn in place, the float64 reference computed and the outputs compared on the device
        (protocol.DeviceCheck); nothing but figures comes back."""
        self.device.start()
        if self.kinds.get(req.key) != "cubin":
            raise ValueError(f"device_check runs cubins, not {self.kinds.get(req.key)!r} {req.key!r}")
        try:
            launch = self._launch_for(req.key, req.shape)
        except ValueError as e:
            raise self._refused(e) from e
        self._device_judge(req.reference["judge"])
        tensors: dict[str, DevTensor] = {}
        scratch: dict[str, int] = {}
        try:
            for a in req.args:
                if "draw" in a or "compare" in a:
                    tensors[a["name"]] = self.mem.fresh(a, guard=True)
            info = _device_checked(self, req, launch, tensors, scratch)
            check("cuCtxSynchronize", driver.cu.cuCtxSynchronize())
            oob = sorted(n for n, t in tensors.items() if not self.mem.guards_intact(t))
        except CudaError as e:
            raise e.fatal() from e
        finally:
            self.mem.free_or_fatal([t.base for t in tensors.values()] + list(scratch.values()))
        return Reply(seconds=info.pop("seconds"), out_of_bounds=oob, info=info, **cpu_usage())

    def op_bench(self, req: Bench) -> Reply:
        """Interleaved timing (A B A B ...) as the cpu child's op_bench, on device buffers made once per
        argument set (inputs uploaded once, outputs poisoned once, not between samples), rotated round robin,
        L2 flushed before every sample unless the pool is over 2 x L2; "mode" events or graph. Afterwards
        the outputs of every argument set are copied back to shared memory."""
        self.device.start()
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
        if req.reference is not None:
            self._device_judge(req.reference["judge"])
        sets: dict[str, list] = {k: [] for k in keys}
        graphs: list = []
        info: dict = {}
        try:
            for kern in req.kernels:
                for argset in kern.argsets:
                    tensors: dict[str, DevTensor] = {}
                    sets[kern.key].append((argset, tensors))
                    if any("draw" in a for a in argset):
                        self._drawn_set(argset, tensors)
                    else:
                        self.mem.upload(argset, tensors, guard=False)
            # the draws and poison went to the legacy stream; a graph runs on a non-blocking one
            check("cuCtxSynchronize", driver.cu.cuCtxSynchronize())
            pool = sum(t.nbytes for v in sets.values() for _, ts in v for t in ts.values())
            flush_bytes = 2 * self.device.l2 if pool < 2 * self.device.l2 else 0
            samplers, per_sample, enqueues = {}, {}, {}
            for k in keys:
                cubin = self.kinds[k] == "cubin"
                # graphs are captured on the side stream; events time the legacy default stream (torch's too)
                stream = self.device.stream() if (mode == "graph" and cubin) else self.device.stream0
                enqueues[k] = [self._enqueue(k, argset, tensors, launches[k], stream) for argset, tensors in sets[k]]
                samplers[k], per_sample[k] = sampler(self.device, self.mem, enqueues[k], stream, cubin, mode,
                                                     flush_bytes, graphs)
            self._warm_up_device(samplers, float(req.warmup_s), max(len(v) for v in sets.values()))
            samples, _ = sample_interleaved(samplers, req)
            # every set's output is checked by the parent, and a short loop (or a graph of fewer launches than
            # sets) may not have reached them all: each set gets one more run, like a timed one (same buffers)
            for k in keys:
                for enq in enqueues[k]:
                    enq()
            check("cuCtxSynchronize", driver.cu.cuCtxSynchronize())
            if req.reference is not None and req.reference.get("compare", True):   # drawn sets: compared here
                compared = {k: [self._compared_set(req.reference, req.shape, argset, tensors)
                                for argset, tensors in v] for k, v in sets.items()}
                info["figures"] = {k: [fig for fig, _ in v] for k, v in compared.items()}
                info["mutated"] = {k: [written for _, written in v] for k, v in compared.items()}
            for v in sets.values():
                for _, tensors in v:
                    for t in tensors.values():
                        if t.role == "out" and t.host.size:
                            self.mem.d2h(t, t.host)
            for graph, exe in graphs:
                check("cuGraphExecDestroy", driver.cu.cuGraphExecDestroy(exe))
                check("cuGraphDestroy", driver.cu.cuGraphDestroy(graph))
            graphs.clear()
            self.mem.free([t.base for v in sets.values() for _, ts in v for t in ts.values()])
        except CudaError as e:
            raise e.fatal() from e
        except BaseException:
            self.mem.free_or_fatal([t.base for v in sets.values() for _, ts in v for t in ts.values()])
            raise
        return Reply(samples=samples, mode=mode, launches_per_sample=per_sample, flushed=bool(flush_bytes),
                     info=info, **cpu_usage())

    def _device_judge(self, judge_path: str):
        """The judge's kernels (judge_device.DeviceJudge), loaded from the parent's cubin the first time."""
        from kfactory.targets.cuda.judge_device import DeviceJudge
        if self.judge is None:
            with open(judge_path, "rb") as f:
                self.judge = DeviceJudge(self.device, self.mem, self.modules, f.read())
        return self.judge

    def _drawn_set(self, argset: list[Arg], tensors: dict[str, DevTensor]) -> None:
        """A bench's argument set made on the device: inputs drawn in place, outputs poisoned (no guard bands,
        as the bench's uploaded sets have none)."""
        for a in argset:
            if "draw" in a or "compare" in a:
                t = tensors[a["name"]] = self.mem.fresh(a, guard=False)
                if "draw" in a:
                    self.judge.draw(t.ptr, t.dtype, t.elements, a["draw"])
                else:
                    self.mem.poison(t)

    def _compared_set(self, ref: dict, shape: dict, argset: list[Arg],
                      tensors: dict[str, DevTensor]) -> tuple[dict, dict[str, int]]:
        """({output: figures}, {input: bytes the kernel wrote}) of a drawn set after its timed calls: its inputs
        drawn again, compared with what the calls left, and the float64 reference (`ref` as
        DeviceCheck.reference) computed from the fresh draw, not from inputs the kernel could have written."""
        outs = [a for a in argset if "compare" in a]
        scratch: dict[str, int] = {}
        try:
            (figures,), written = _against_fresh_draw(self, ref, shape, argset, tensors, scratch,
                                                      [{a["name"]: tensors[a["name"]].ptr for a in outs}])
            return figures, written
        finally:
            self.mem.free(list(scratch.values()))

    #: kept here, where the tests of the warm-up find it
    _warm_up_device = staticmethod(warm_up_device)

    def op_device(self, req: DeviceQuery) -> Reply:
        """info: {"name", "uuid", "arch", "sm_count", "l2_bytes", "mem_bytes", "smem_optin", "cc"}."""
        return Reply(info=self.device.info())

    def op_ceilings(self, req: Ceilings) -> Reply:
        """Measured ceilings, as info: {"mem_bandwidth_gbps" (device-to-device copy, bytes read + written),
        "peak_gflops" (fp32 FMA chains), "peak_bf16_gflops" (torch.matmul 8192^3 bf16; 0 without torch),
        "notes": [why a figure is 0]}."""
        self.device.start()
        out: dict[str, Any] = {"mem_bandwidth_gbps": 0.0, "peak_gflops": 0.0, "peak_bf16_gflops": 0.0, "notes": []}
        try:
            out["mem_bandwidth_gbps"] = probes.copy_bandwidth(self.device, self.mem, int(req.copy_bytes))
            arch = req.arch or self.device.info()["arch"]
            out["peak_gflops"] = probes.fp32_peak(self.device, self.mem, self.modules, arch)
        except CudaError as e:
            raise e.fatal() from e
        except Exception as e:  # noqa: BLE001 - the probe could not compile: report why, keep the rest
            out["notes"].append(f"fp32 probe: {type(e).__name__}: {e}")
        try:
            out["peak_bf16_gflops"] = probes.bf16_peak(int(req.matmul_n))
        except ImportError as e:
            out["notes"].append(f"bf16 probe: torch not importable: {e}")
        except Exception as e:  # noqa: BLE001
            out["notes"].append(f"bf16 probe: {type(e).__name__}: {e}")
        return Reply(info=out)


def _reference_buffers(child: CudaChild, ref: dict, shape: dict, inputs: dict[str, int],
                      tensors: dict[str, DevTensor], outs: list[Arg]) -> dict[str, int]:
    """A float64 buffer per compared output, holding the problem's reference (DeviceCheck's `ref`) on the inputs
    at `inputs` (name -> device address: a fresh draw), computed on the device; the caller frees them."""
    refs = {a["name"]: child.mem.alloc(8 * tensors[a["name"]].elements) for a in outs}
    try:
        child.judge.reference(ref, shape, {n: inputs[n] for n in ref["inputs"]}, refs)
    except BaseException:
        child.mem.free_or_fatal(list(refs.values()))
        raise
    return refs


def _against_fresh_draw(child: CudaChild, ref: dict, shape: dict, args: list[Arg], tensors: dict[str, DevTensor],
                        scratch: dict[str, int], outputs: list[dict[str, int]]) -> tuple[list[dict], dict[str, int]]:
    """The judgement after the candidate's last run: each drawn input of `args` drawn again from its descriptor
    into a new buffer and compared with what the kernel left, the float64 reference (`ref`, DeviceCheck's)
    computed from that fresh draw, and each of `outputs` (per run: output -> device address of its values)
    compared with it. ([{output: figures} per run], {input: bytes the kernel wrote}); the new buffers are kept
    in `scratch` for the caller to free."""
    again, written = {}, {}
    for a in (a for a in args if "draw" in a):
        t = tensors[a["name"]]
        again[t.name] = scratch["again:" + t.name] = child.mem.alloc(t.nbytes)
        child.judge.draw(again[t.name], t.dtype, t.elements, a["draw"])
        written[t.name] = child.judge.count_diff(again[t.name], t.ptr, t.nbytes)
    outs = [a for a in args if "compare" in a]
    refs = _reference_buffers(child, ref, shape, again, tensors, outs)
    scratch.update({"ref:" + n: b for n, b in refs.items()})
    return [_figures(child.judge, outs, at, tensors, refs) for at in outputs], written


def _figures(judge, outs: list[Arg], at: dict[str, int], tensors: dict[str, DevTensor],
             refs: dict[str, int]) -> dict[str, dict]:
    """{output: figures} of each compared output (its values at device address `at[name]`) against its
    reference buffer, at its "compare" tolerance."""
    return {a["name"]: judge.compare(at[a["name"]], a["dtype"], refs[a["name"]], tensors[a["name"]].elements,
                                     a["compare"]["atol"], a["compare"]["rtol"]) for a in outs}


def _device_checked(child: CudaChild, req: DeviceCheck, launch: Launch, tensors: dict[str, DevTensor],
                    scratch: dict[str, int]) -> dict:
    """The body of op_device_check over buffers already made (`scratch` collects the others it makes, for the
    caller to free): draw, `runs` timed runs (outputs poisoned before each, each run's outputs copied aside),
    then the inputs drawn again and compared with what the kernel left, the float64 reference computed from
    that fresh draw (after the candidate's last run, so it cannot reach it), and each run compared with it and
    every later run with the first by value (as the host compares two runs)."""
    judge, mem, stream = child.judge, child.mem, child.device.stream0
    draws = [a for a in req.args if "draw" in a]
    outs = [a for a in req.args if "compare" in a]
    for a in draws:
        t = tensors[a["name"]]
        judge.draw(t.ptr, t.dtype, t.elements, a["draw"])
    run = child._enqueue(req.key, req.args, tensors, launch, stream)
    seconds: list[float] = []
    kept: list[dict[str, int]] = []
    for r in range(max(1, req.runs)):
        for a in outs:
            mem.poison(tensors[a["name"]])
        seconds.append(child.device.time(stream, run))
        kept.append({})
        for a in outs:
            t = tensors[a["name"]]
            kept[r][t.name] = scratch[f"run{r}:{t.name}"] = mem.alloc(t.nbytes)
            check("cuMemcpyDtoDAsync", driver.cu.cuMemcpyDtoDAsync(dptr(kept[r][t.name]), dptr(t.ptr), t.nbytes,
                                                                   stream))
    figures, mutated = _against_fresh_draw(child, req.reference, req.shape, req.args, tensors, scratch, kept)
    differ = [{a["name"]: judge.count_unequal(at[a["name"]], kept[0][a["name"]], tensors[a["name"]].dtype,
                                              tensors[a["name"]].elements) for a in outs} for at in kept[1:]]
    return {"seconds": seconds, "figures": figures, "differ": differ, "mutated": mutated}


def __getattr__(name: str):
    """`cu`, read where it used to live: the driver module is its one home (kfactory.targets.cuda.driver.cu)."""
    if name == "cu":
        return driver.cu
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main(CudaChild)

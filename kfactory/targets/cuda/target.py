"""The cuda target: CUDA C++ / PTX compiled to a cubin (kfactory.targets.cuda.compile), run and timed through
the CUDA driver API in a runner child (kfactory.targets.cuda.child) pinned to one GPU, NVML telemetry
around every measurement (kfactory.targets.cuda.nvml).

Which GPU: env KFACTORY_GPU (a UUID or an index), else GPU 0, resolved to its UUID with NVML and handed to
the runner as CUDA_VISIBLE_DEVICES=<uuid>. Clocks and power limits are never changed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
from pathlib import Path

import numpy as np

from kfactory.judge import quiet
from kfactory.observability.log import get_logger
from kfactory.platform.fsutil import atomic_write
from kfactory.problems.params import abi_argtypes
from kfactory.sandbox.parent import Runner, RunnerFault
from kfactory.sandbox.shm import ArenaRing, request_buffers, ring_bytes
from kfactory.sandbox.protocol import Bench, BenchKernel, Call, Ceilings, DeviceCheck, DeviceQuery, Load
from kfactory.targets.cuda import judge_device, judge_kernels, nvml
from kfactory.targets.base import (BenchResult, CallResult, CompileResult, DeviceChecked, DeviceCheckUnavailable,
                                   Session, Target)
from kfactory.targets.cpu.ceiling import read_cached, write_cached
from kfactory.sandbox.shm_args import (bench_argsets, bench_bytes, build_argset, call_bytes, sequence_results,
                                       stage_steps)
from kfactory.v1 import events_pb2 as pb

log = get_logger("cuda")
CHILD = "kfactory.targets.cuda.child"
OPTIONS = ("", "sm_80", "sm_90a", "sm_100a")
#: below this median (one launch timed with events) a bench uses CUDA graphs: launch gaps would dominate
GRAPH_BELOW_S = 20e-6
CEILINGS_TIMEOUT_S = 600


def _runner(settings, uuid: str, timeout_s: float | None = None, max_runs: int | None = None) -> Runner:
    return Runner(1, timeout_s or settings.runner_timeout_s, mem_mb=0, max_runs=max_runs or settings.runner_max_runs,
                  child_module=CHILD, env={"CUDA_VISIBLE_DEVICES": uuid})


class CudaTarget(Target):
    name = "cuda"
    languages = ("cuda", "ptx")

    def __init__(self, option: str, settings):
        self.option, self.settings = option, settings
        self.data_dir = Path(settings.data_dir)
        self.cubin_dir = self.data_dir / "cubin"
        self.cubin_dir.mkdir(parents=True, exist_ok=True)
        self._gpu: tuple[str, str] | None = None
        self._info: dict | None = None
        self._device: pb.DeviceInfo | None = None

    def gpu(self) -> tuple[str, str]:
        """(uuid, model) of the GPU this target uses; NvmlUnavailable (a RuntimeError) when there is none."""
        if self._gpu is None:
            spec = os.environ.get("KFACTORY_GPU", "")
            try:
                self._gpu = nvml.resolve_gpu(spec)
            except nvml.NvmlUnavailable as e:
                raise nvml.NvmlUnavailable(f"the cuda target has no GPU to use (KFACTORY_GPU={spec!r}): {e}") from e
        return self._gpu

    def info(self) -> dict:
        """The runner child's "device" reply (name, uuid, arch, sm_count, l2_bytes, mem_bytes), cached."""
        if self._info is None:
            uuid, _ = self.gpu()
            runner = _runner(self.settings, uuid, timeout_s=60)
            try:
                self._info = runner.request(DeviceQuery(), timeout_s=60).info
            finally:
                runner.stop()
            if self.option and self._info.get("arch") != self.option:
                log.warning("the cuda target's architecture differs from the GPU's", option=self.option,
                            gpu_arch=self._info.get("arch"))
        return self._info

    def device(self) -> pb.DeviceInfo:
        """The GPU and its measured ceilings (measured once per GPU UUID, cached in data_dir/ceilings.json)."""
        if self._device is None:
            info = self.info()
            uuid, model = self.gpu()
            figures = self._ceilings(uuid, info)
            self._device = pb.DeviceInfo(
                target="cuda", model=info.get("name") or model, device_id=uuid, uuid=uuid, arch=info["arch"],
                mem_bandwidth_gbps=figures["mem_bandwidth_gbps"], peak_gflops=figures["peak_gflops"],
                peak_bf16_gflops=figures["peak_bf16_gflops"], l2_bytes=int(info["l2_bytes"]),
                sm_count=int(info["sm_count"]))
        return self._device

    def _ceilings(self, uuid: str, info: dict) -> dict[str, float]:
        names = ("mem_bandwidth_gbps", "peak_gflops", "peak_bf16_gflops")
        key = f"cuda-{uuid}"
        found = read_cached(self.data_dir, key, names)
        if found is not None:
            return found
        runner = _runner(self.settings, uuid, timeout_s=CEILINGS_TIMEOUT_S)
        try:
            reply = runner.request(Ceilings(arch=info["arch"]), timeout_s=CEILINGS_TIMEOUT_S).info
        except RunnerFault as e:
            log.warning("could not measure the GPU's ceilings; floors and roofline fractions will be 0",
                        error=str(e))
            return {n: 0.0 for n in names}
        finally:
            runner.stop()
        figures = {n: float(reply.get(n, 0.0)) for n in names}
        if reply.get("notes"):
            log.warning("some GPU ceilings could not be measured", notes=reply["notes"])
        if all(figures.values()):  # a partial measurement is not cached: the next start tries again
            write_cached(self.data_dir, key, figures, model=info.get("name", ""))
        log.info("measured GPU ceilings", device=uuid, **{k: round(v, 1) for k, v in figures.items()})
        return figures

    def cache_bytes(self) -> int:
        """2 x the GPU's L2."""
        return 2 * int(self.info()["l2_bytes"])

    def compile(self, source: str, language: str, flags: str, entry: str) -> CompileResult:
        """NVRTC (+ nvJitLink) to a cubin for this target's architecture (kfactory.targets.cuda.compile)."""
        try:
            from kfactory.targets.cuda.arch import resolve_arch
            from kfactory.targets.cuda.compile import compile_cuda
        except ImportError as e:
            return CompileResult(False, pb.CompileReport(compiler="nvrtc"), reason=pb.COMPILE_ERROR,
                                 message=f"the cuda compiler is not available: {e}")
        try:
            arch = resolve_arch(self.option)
        except ValueError as e:
            return CompileResult(False, pb.CompileReport(compiler="nvrtc"), reason=pb.UNSUPPORTED_ARCH,
                                 message=str(e))
        from kfactory.targets.cuda.precompile import serve

        # a cubin compiled ahead for this source, flags and architecture (kfactory precompile) costs no compile here
        if (served := serve(self.settings, source, language, flags, entry, arch)) is not None:
            return served
        return compile_cuda(source, language, flags, entry, arch, self.data_dir / "cuda_cache")

    def session(self, problem, threads: int) -> "CudaSession":
        return CudaSession(self, problem)


class CudaSession(Session):
    """Kernels of one problem in one cuda runner child on this target's GPU."""

    def __init__(self, target: CudaTarget, problem):
        self.target, self.problem = target, problem
        self.uuid, self.model = target.gpu()
        self.runner = _runner(target.settings, self.uuid)
        # requests' buffers come from a ring of arenas the runner keeps mapped (kfactory.sandbox.shm.ArenaRing): a
        # GPU-sized input set is hundreds of MB, and a fresh tmpfs file for each request paid its page faults and
        # its freeing every time
        s = target.settings
        self.ring = ArenaRing(ring_bytes(s.cuda_arena_mb)) if s.runner_arenas else None
        self.loads: dict[str, Load] = {}
        self.judge_paths: tuple[str, str] | None = None   # the judge's and the reference's cubins, once built
        # the cuda ABI; a problem without one is called with its cpu argument order (pointers, then int64s)
        kind = "cuda" if "cuda" in problem.spec.abi else "cpu"
        self.abi_args = list(problem.spec.abi[kind].args)
        self.argtypes = abi_argtypes(problem, kind)

    # -- loading ---------------------------------------------------------------------------------------------

    def load_artifact(self, key: str, artifact: bytes, entry: str, launch: dict | None = None) -> None:
        """Kernel `key` is cubin `artifact`'s `entry`, launched by `launch` ({"grid", "block", "smem",
        "params"}, or its JSON text); a cubin without a launch rule is refused with a ValueError."""
        if isinstance(launch, str):
            launch = json.loads(launch) if launch.strip() else None
        if not launch:
            raise ValueError(f"kernel {key!r}: a cuda kernel needs a launch rule {{grid, block, smem, params}} "
                             "(a family's launch section, or a '// kfactory: grid=... block=...' header)")
        if not isinstance(launch, dict) or not launch.get("grid") or not launch.get("block"):
            raise ValueError(f"kernel {key!r}: the launch rule must give grid and block, got {launch!r}")
        path = self._cubin_file(artifact)
        self.loads[key] = Load(key, "cubin", path=str(path), entry=entry, argtypes=list(self.argtypes),
                               launch_rule={"grid": launch["grid"], "block": launch["block"],
                                            "smem": launch.get("smem", "0"), "params": launch.get("params") or {}})

    def _cubin_file(self, artifact: bytes) -> Path:
        """The file the runner loads a cubin from (content-addressed in the target's cubin directory)."""
        path = self.target.cubin_dir / f"{hashlib.sha256(artifact).hexdigest()}.cubin"
        if not path.exists():
            atomic_write(path, artifact)
        return path

    def load_baseline(self, key: str, name: str) -> None:
        """Baseline `name` of the problem's reference.py cuda_baselines() (torch on the GPU)."""
        self.loads[key] = Load(key, "baseline", module=str(self.problem.directory / "reference.py"), name=name,
                               params=dict(self.problem.params))

    def _ensure(self, key: str) -> None:
        self.runner.ensure_loaded(self.loads[key])

    def _request(self, req, timeout_s: float | None = None):
        reply = self.runner.request(req, timeout_s)
        # a runner has a CPU-time limit for its whole life: replace it well before it is reached
        if reply.cpu_limit_s > 0 and reply.cpu_s > 0.5 * reply.cpu_limit_s:
            self.runner.stop()
        return reply

    # -- running ---------------------------------------------------------------------------------------------

    def call_sequence(self, key: str, shape: dict[str, int], steps: list[dict[str, np.ndarray]]) -> list[CallResult]:
        """One run per step on the same device buffers (fresh ones, with guard bands, for the first step);
        before each later step the runner saves the outputs, uploads that step's inputs and poisons the
        outputs. Out-of-bounds writes are seen in the device-side guard bands (any step)."""
        self._ensure(key)
        with request_buffers(self.ring, call_bytes(self.problem, shape, len(steps)), reserve=False) as (bufs, keep):
            argset, views = build_argset(self.problem, self.abi_args, bufs, shape, steps[0])
            staged, step_cmds = stage_steps(self.problem, bufs, shape, steps)
            req = Call(key, argset, steps=step_cmds, shape=dict(shape), keep=keep)
            reply = self._request(req, timeout_s=self.runner.timeout_s * len(steps))
            # in an arena, the outputs are read where the runner wrote them (valid until the ring comes round)
            return sequence_results(self.problem, steps, staged, views, reply.seconds, list(reply.out_of_bounds),
                                    copy=keep is None)

    def unload(self, key: str) -> None:
        """The runner unloads `key`'s module and frees the last call's buffers; a child that then still holds
        device buffers besides its scratch leaked them (the harness's fault, never a candidate's: kernels cannot
        allocate through our allocator) and is replaced, which frees its context."""
        self.loads.pop(key, None)
        reply = self.runner.unload(key)
        if reply is not None and reply.info.get("live_bytes"):
            log.warning("the cuda runner holds device memory after a candidate was unloaded; replacing it",
                        key=key, live_bytes=reply.info["live_bytes"])
            self.runner.stop()

    def device_check_unavailable(self, shape: dict[str, int], dist: str) -> str | None:
        """None where the GPU judges this check itself (Settings.device_judge, and judge_device.unavailable)."""
        if not self.target.settings.device_judge:
            return "the device judge is off (Settings.device_judge)"
        return judge_device.unavailable(self.problem, shape, dist)

    def device_check(self, key: str, shape: dict[str, int], dist: str, seed: int, runs: int = 2) -> DeviceChecked:
        """Session.device_check on the GPU (protocol.DeviceCheck): the judge's kernels and the problem's float64
        reference compiled here once, for the runner to load."""
        self._require_judge(shape, dist)
        self._ensure(key)
        req = DeviceCheck(key, judge_device.device_argset(self.problem, self.abi_args, shape, dist, seed),
                          judge_device.reference_request(self.problem, shape, *self._judge_paths()), dict(shape), runs)
        reply = self._request(req, timeout_s=self.runner.timeout_s * (runs + 2))
        info = reply.info
        return DeviceChecked(list(reply.seconds), info["figures"], info["differ"], info["mutated"],
                             list(reply.out_of_bounds))

    def _require_judge(self, shape: dict[str, int], dist: str) -> None:
        """DeviceCheckUnavailable, with the reason, unless the GPU can judge this shape and distribution."""
        why = self.device_check_unavailable(shape, dist)
        if why is not None:
            raise DeviceCheckUnavailable(f"{self.problem.name} {dist}: {why}")

    def _judge_paths(self) -> tuple[str, str]:
        """The judge's and the problem's float64 reference cubins, built (or served from a bundle) once."""
        if self.judge_paths is None:
            source, flags, _ = self.problem.reference_f64("cuda")
            self.judge_paths = (self._judge_cubin(judge_kernels.source(), judge_kernels.FLAGS, judge_kernels.DRAW),
                                self._judge_cubin(source, flags, "reference_f64"))
        return self.judge_paths

    def _judge_cubin(self, source: str, flags: str, entry: str) -> str:
        res = self.target.compile(source, "cuda", flags, entry)
        if not res.ok:
            raise judge_device.DeviceJudgeError(f"the judge's {entry} did not build: {res.message} {res.log[-800:]}")
        return str(self._cubin_file(res.artifact))

    def _pick_mode(self, base: Bench) -> str:
        """graph when a quick events-mode probe (first input set only) puts some kernel under GRAPH_BELOW_S."""
        probe = dataclasses.replace(base, mode="events", min_samples=5, min_s=0.0, max_s=0.05, noise=1.0,
                                    warmup_s=0.005, kernels=[BenchKernel(k.key, k.argsets[:1]) for k in base.kernels],
                                    reference=base.reference and {**base.reference, "compare": False})
        reply = self._request(probe, timeout_s=self.runner.timeout_s + 5)
        fastest = min(statistics.median(s) for s in reply.samples.values())
        return "graph" if fastest < GRAPH_BELOW_S else "events"

    def bench_drawn(self, keys, shape, dist, seeds, *, min_samples, min_s, max_s, noise, warmup_s,
                    compare: bool = True, precision: float = 0.0, mode: str | None = None) -> BenchResult:
        """Session.bench_drawn on the GPU: each key's sets drawn in place from `seeds`, compared there after the
        timing unless compare is False (protocol.Bench with "draw" descriptors and a reference)."""
        self._require_judge(shape, dist)
        argsets = [judge_device.device_argset(self.problem, self.abi_args, shape, dist, s) for s in seeds]
        reference = judge_device.reference_request(self.problem, shape, *self._judge_paths())
        base = Bench([BenchKernel(k, argsets) for k in keys], min_samples=min_samples, min_s=min_s, max_s=max_s,
                     noise=noise, warmup_s=warmup_s, precision=precision, shape=dict(shape),
                     reference={**reference, "compare": compare})
        return self._timed(keys, base, mode, lambda reply, tel: BenchResult(
            reply.samples, {}, telemetry=tel, figures=reply.info.get("figures", {}),
            mutated=reply.info.get("mutated", {})))

    def ready_buffers(self, benches: list[tuple[dict[str, int], int, int]]) -> None:
        """The ring's arenas grown for the largest of those benches (ArenaRing.ready), a piece at a time as host
        work."""
        if self.ring is not None:
            self.ring.ready([bench_bytes(self.problem, *b) for b in benches], quiet.host_work)

    def bench(self, keys, shape, input_sets, *, min_samples, min_s, max_s, noise, warmup_s,
              precision: float = 0.0, mode: str | None = None) -> BenchResult:
        """Interleaved timing on the GPU (see cuda_child.op_bench); `mode` events, graph, or None to pick by a
        probe. NVML is read before and after (the result's telemetry); a throttled measurement is retried once."""
        nbytes = bench_bytes(self.problem, shape, len(keys), len(input_sets))
        with request_buffers(self.ring, nbytes, reserve=True) as (bufs, keep):
            per_key = bench_argsets(self.problem, self.abi_args, bufs, shape, keys, input_sets)
            base = Bench([BenchKernel(k, [a for a, _ in per_key[k]]) for k in keys], min_samples=min_samples,
                         min_s=min_s, max_s=max_s, noise=noise, warmup_s=warmup_s, precision=precision,
                         shape=dict(shape), keep=keep)
            copy = np.array if keep is None else (lambda v: v)   # an arena's views stay valid, as call_sequence's
            outputs = [t.name for t in self.problem.spec.outputs]
            return self._timed(keys, base, mode, lambda reply, tel: BenchResult(
                reply.samples, {k: [{n: copy(views[n]) for n in outputs} for _, views in per_key[k]] for k in keys},
                telemetry=tel))

    def _timed(self, keys, base: Bench, mode: str | None, result) -> BenchResult:
        """Bench request `base` at `mode` (None: picked by a probe), NVML read around it and a throttled one
        retried once; `result(reply, telemetry per key)` makes the BenchResult."""
        for k in keys:
            self._ensure(k)
        if mode is None:
            mode = self._pick_mode(base)
        req = dataclasses.replace(base, mode=mode)
        timeout = base.max_s + 10 * base.warmup_s + self.runner.timeout_s + 30  # + graph capture and uploads
        retries = 0
        while True:
            before = nvml.read(self.uuid)
            reply = self._request(req, timeout_s=timeout)
            after = nvml.read(self.uuid)
            tel = nvml.telemetry(before, after, self.model, self.uuid)
            if not tel.throttled or retries >= 1:
                break
            retries += 1
            log.info("measurement throttled; retrying once", reasons=list(tel.throttle_reasons))
        tel.retries = retries
        telemetry = {}
        for k in keys:
            telemetry[k] = pb.GpuTelemetry()
            telemetry[k].CopyFrom(tel)
        out = result(reply, telemetry)
        out.mode = reply.mode or mode
        return out

    def close(self) -> None:
        self.runner.stop()
        if self.ring is not None:
            self.ring.close()


def make(option: str, settings) -> CudaTarget:
    if option not in OPTIONS:
        raise ValueError(f"unknown cuda architecture {option!r}; use one of: cuda, "
                         + ", ".join(f"cuda:{o}" for o in OPTIONS if o))
    return CudaTarget(option, settings)

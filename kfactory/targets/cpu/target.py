"""The cpu target: C/C++ compiled by the system compiler into a shared object, run in a runner child."""
from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from kfactory.judge import quiet
from kfactory.observability.stagetime import span
from kfactory.platform import scratch
from kfactory.platform.fsutil import atomic_write
from kfactory.problems.params import abi_argtypes
from kfactory.sandbox.parent import HarnessError, Runner
from kfactory.sandbox.shm import ArenaRing, ShmBuffers, request_buffers, ring_bytes
from kfactory.sandbox.protocol import Bench, BenchKernel, Call, Load
from kfactory.targets.cpu import cache
from kfactory.targets.cpu.ceiling import ceilings
from kfactory.targets.cpu.cpuinfo import cpu_flags, native_tag, read_cpuinfo
from kfactory.targets.cpu.rules import check_imports, check_source
from kfactory.targets.entry import missing_entry
from kfactory.targets.flags import FlagRefused, check_flags
from kfactory.targets.base import BenchResult, CallResult, CompileResult, Session, Target, check_not_interrupted
from kfactory.sandbox.shm_args import (bench_argsets, bench_bytes, build_argset, call_bytes, sequence_results,
                                       stage_steps)
from kfactory.v1 import events_pb2 as pb

COMPILE_TIMEOUT_S = 120
#: the prefix of a compile's scratch directory's name (kfactory.cli.check knows it, to strip it from logs)
SCRATCH_PREFIX = "kf-cc"
#: a kernel that does nothing, for measuring the cost of a call itself (arguments are ignored in C)
NULL_KERNEL = "void kernel(void) {}\n"
LANG_FLAG = {"c": "c", "cpp": "c++"}


#: instruction-set flags that decide which kernels a cpu can run, and so its speed: part of a host's identity
ISA_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")
#: /proc/cpuinfo fields that tell one processor generation from another (x86, then Arm)
_GENERATION = ("vendor_id", "cpu family", "model", "stepping", "CPU implementer", "CPU part", "CPU variant")


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_identity(cpuinfo: str) -> str:
    """What tells a processor apart beyond its model name, from /proc/cpuinfo's text: the first processor's
    vendor, family, model and stepping (or Arm's implementer, part and variant) and which ISA_FLAGS it has. A
    virtual machine may name every generation of a vendor's processors alike ("AMD EPYC" for a Zen 3 without
    AVX-512 and a Zen 4 with it, both seen here), and the name alone made them one device: one ceilings entry,
    one device in the evidence that warm starts trust."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if (key := key.strip()) in _GENERATION:
            fields.setdefault(key, value.strip())
    flags = cpu_flags(cpuinfo)
    generation = ";".join(f"{k}={v}" for k, v in sorted(fields.items()))
    return generation + "|" + ",".join(f for f in ISA_FLAGS if f in flags)


def _llc_bytes() -> int:
    idx = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    try:
        text = idx.read_text().strip()
        return int(text.rstrip("K")) * 1024 if text.endswith("K") else int(text)
    except (OSError, ValueError):
        return 32 << 20


class CpuTarget(Target):
    name = "cpu"
    languages = tuple(LANG_FLAG)

    def __init__(self, settings):
        self.settings = settings
        self.cache_dir = Path(settings.data_dir) / "so"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # compiled kernels by what decides them (cache.py): shared between data directories where the setting says
        self.cache = cache.CompileCache(settings.cpu_object_cache or Path(settings.data_dir) / "cc_cache")
        self._device: pb.DeviceInfo | None = None

    def device(self) -> pb.DeviceInfo:
        """This host, with its measured ceilings (copy and read bandwidth, peak fp32 and int8; measured once per host
        and thread count, cached: kfactory.targets.cpu.ceiling)."""
        if self._device is None:
            info = read_cpuinfo()
            model, host = _cpu_model(info), platform.node()
            identity = f"{host}|{model}|{cpu_identity(info)}"
            dev = pb.DeviceInfo(target="cpu", model=f"{model} ({self.settings.threads} threads)",
                                device_id="cpu-" + hashlib.sha256(identity.encode()).hexdigest()[:16],
                                threads=self.settings.threads)
            figures = ceilings(self, f"{dev.device_id}/{dev.threads}", dev.threads)
            dev.mem_bandwidth_gbps, dev.peak_gflops = figures["mem_bandwidth_gbps"], figures["peak_gflops"]
            dev.read_bandwidth_gbps = figures["read_bandwidth_gbps"]
            dev.peak_int8_gops = figures["peak_int8_gops"]
            self._device = dev
        return self._device

    def cache_bytes(self) -> int:
        """Twice the last-level cache: the settings' cpu_cache_mb where set, else what /sys reports."""
        llc = self.settings.cpu_cache_mb << 20 if self.settings.cpu_cache_mb else _llc_bytes()
        return 2 * llc

    def compile(self, source: str, language: str, flags: str, entry: str) -> CompileResult:
        """cc -shared -fPIC FLAGS; a failure is a typed result carrying the compiler's log. Flags off the whitelist
        (kfactory.targets.flags) are a STATIC_CHECK failure and cc is never run: a flag such as -wrapper or -B
        would run a program of the caller's choosing here."""
        if language not in LANG_FLAG:
            return CompileResult(False, pb.CompileReport(compiler=self.settings.cc), reason=pb.COMPILE_ERROR,
                                 message=f"the cpu target compiles c or cpp, not {language!r}")
        try:
            words = check_flags("cpu", flags)
        except FlagRefused as exc:
            return _refused([exc], pb.CompileReport(compiler=self.settings.cc), "flag")
        violations = check_source(source)
        if violations:
            return _refused(violations, pb.CompileReport(compiler=self.settings.cc), "source")
        t0 = time.perf_counter()
        ident = cache.compiler_identity(self.settings.cc)
        k = cache.key(ident, native_tag(self.settings.cc), _command("CC", language, words, "OUT", "SRC"), source)
        if ident and (hit := self.cache.load(k)) is not None:
            hit.report.seconds, hit.report.cached = time.perf_counter() - t0, True
            # its symbols read again, as after a compile (a reading changed since applies to it)
            undefined, functions = _dynamic_symbols(hit.path)
            del hit.report.imports[:]
            hit.report.imports.extend(undefined)
            return _judged(hit.artifact, hit.report, hit.log, undefined, functions, entry)
        return self._build(source, language, words, entry, k if ident else "")

    def _build(self, source: str, language: str, words: list[str], entry: str, k: str) -> CompileResult:
        """Run the compiler and check what it made; a success is filed in the cache under key `k` (none: "")."""
        # a compiler killed mid-compile leaves this directory: the next process that compiles removes it
        with scratch.owned_tempdir(SCRATCH_PREFIX) as tmp:
            src, out = tmp / f"k.{language}", tmp / "k.so"
            src.write_text(source)
            cmd = _command(self.settings.cc, language, words, str(out), str(src))
            t0 = time.perf_counter()
            returncode, stderr = quiet.run_compiler(cmd, COMPILE_TIMEOUT_S)
            if returncode is None:
                return CompileResult(False, pb.CompileReport(compiler=" ".join(cmd)), reason=pb.COMPILE_ERROR,
                                     message=f"compiler ran past {COMPILE_TIMEOUT_S}s")
            log = stderr[-20000:]
            report = pb.CompileReport(compiler=" ".join(cmd), seconds=time.perf_counter() - t0,
                                      log_excerpt=log[:2000], warnings=log.count("warning:"))
            check_not_interrupted(returncode, self.settings.cc)
            if returncode != 0:
                return CompileResult(False, report, log=log, reason=pb.COMPILE_ERROR,
                                     message=f"{self.settings.cc} exited with {returncode}")
            artifact = out.read_bytes()
            report.artifact_bytes = len(artifact)
            undefined, functions = _dynamic_symbols(out)
            report.imports.extend(undefined)
            result = _judged(artifact, report, log, undefined, functions, entry)
            if result.ok and k:
                self.cache.store(k, artifact, report, log)
            return result

    def session(self, problem, threads: int) -> "CpuSession":
        return CpuSession(self, problem, threads)


def _command(cc: str, language: str, words: list[str], out: str, src: str) -> list[str]:
    """The compile's command line. -z defs: an object that could not be loaded (an unresolved symbol) fails here,
    typed, not in the runner; -lm also brings glibc's libmvec for loops vectorised over expf."""
    return [cc, "-x", LANG_FLAG[language], "-shared", "-fPIC", *words, "-o", out, src, "-x", "none", "-Wl,-z,defs",
            "-lm"]


def _judged(artifact: bytes, report: pb.CompileReport, log: str, undefined: list[str], functions: set[str],
            entry: str) -> CompileResult:
    """A compiled object (just built, or from the cache) checked as the sandbox and the runner need it: what it
    imports, and that it defines `entry`."""
    violations = check_imports(undefined)
    if violations:
        return _refused(violations, report, "object")
    # a misspelt or C++-mangled entry compiles and links: said here, not as a crash when the runner loads it
    if missing := missing_entry(functions, entry, "the shared object"):
        return CompileResult(False, report, log=log, reason=pb.COMPILE_ERROR, message=missing)
    return CompileResult(True, report, artifact=artifact, log=log)


def _refused(violations, report: pb.CompileReport, what: str) -> CompileResult:
    text = "\n".join(str(v) for v in violations)
    report.log_excerpt = text[:2000]
    return CompileResult(False, report, log=text, reason=pb.STATIC_CHECK,
                         message=f"the {what} breaks a sandbox rule: {violations[0]}")


def _dynamic_symbols(path: Path) -> tuple[list[str], set[str]]:
    """The shared object's undefined symbols (sorted: what it imports, versioned as expf@GLIBC_2.27) and the
    functions it defines, by name (kernel@@V1 is kernel), as dlsym sees them (nm -D: a static or hidden function is
    not there). HarnessError when nm is missing or cannot read it: the harness's failure, not the kernel's;
    CompilerInterrupted when a signal stopped it."""
    nm = shutil.which("nm")
    if nm is None:
        raise HarnessError("nm (binutils) is needed to read a compiled kernel's symbols: install binutils")
    proc = subprocess.run([nm, "-D", str(path)], capture_output=True, text=True)
    # a Ctrl-C or a shutdown reaches nm in the compiler's process group: no verdict, as for the compiler itself
    check_not_interrupted(proc.returncode, "nm")
    if proc.returncode != 0:
        said = next((line for line in proc.stderr.splitlines() if line.strip()), f"exit {proc.returncode}")
        raise HarnessError(f"nm could not read the compiled kernel {path.name}: {said}")
    undefined, functions = set(), set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:                       # no address: undefined ("U expf", "w __gmon_start__")
            undefined.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TWi":  # text, weak (C++ inline) or indirect (ifunc) function
            functions.add(parts[2].split("@", 1)[0])
    return sorted(undefined), functions


class CpuSession(Session):
    """Kernels of one problem in one runner process with OMP_NUM_THREADS=threads."""

    def __init__(self, target: CpuTarget, problem, threads: int):
        s = target.settings
        self.target, self.problem, self.threads = target, problem, threads
        self.runner = Runner(threads, s.runner_timeout_s, s.runner_mem_mb, s.runner_max_runs)
        # requests' buffers come from a ring of arenas the runner keeps mapped (kfactory.sandbox.shm.ArenaRing); one
        # larger than an arena may be takes fresh buffers instead. Not tied to the runner's address space: the
        # buffers are mapped beside its limit (sandbox/child.py). On a host with a 480 MiB cache a softmax
        # 4096x4096 timing needs 1 GiB of sets, which the old eighth of the limit (512 MiB) sent to fresh files,
        # fallocated and faulted in every time: 0.6 s of a screen's 1 s
        self.ring = ArenaRing(ring_bytes(s.cpu_arena_mb)) if s.runner_arenas else None
        self.loads: dict[str, Load] = {}
        self._overhead: float | None = None
        self.abi_args = problem.spec.abi["cpu"].args
        self.argtypes = abi_argtypes(problem, "cpu")

    def load_artifact(self, key: str, artifact: bytes, entry: str, launch: dict | None = None) -> None:
        path = self.target.cache_dir / f"{hashlib.sha256(artifact).hexdigest()}.so"
        if not path.exists():   # a temporary file of its own (two sessions may store the same kernel at once)
            atomic_write(path, artifact)
        self.loads[key] = Load(key, "so", path=str(path), entry=entry, argtypes=list(self.argtypes))

    def load_baseline(self, key: str, name: str) -> None:
        self.loads[key] = Load(key, "baseline", module=str(self.problem.directory / "reference.py"), name=name,
                               params=dict(self.problem.params))

    def unload(self, key: str) -> None:
        """The runner drops `key` (its library stays mapped: protocol.Unload)."""
        self.loads.pop(key, None)
        self.runner.unload(key)

    def call_sequence(self, key: str, shape: dict[str, int], steps: list[dict[str, np.ndarray]]) -> list[CallResult]:
        """Run the kernel once per step on the SAME buffers (fresh ones, with guard bands, for the first step):
        before each step the runner writes that step's inputs into them and poisons the outputs."""
        self.runner.ensure_loaded(self.loads[key])
        with request_buffers(self.ring, call_bytes(self.problem, shape, len(steps)), reserve=False) as (bufs, keep):
            guards: list = []
            with span("buffers"):
                argset, views = build_argset(self.problem, self.abi_args, bufs, shape, steps[0], guards)
                staged, step_cmds = stage_steps(self.problem, bufs, shape, steps)
            req = Call(key, argset, steps=step_cmds, keep=keep)
            reply = self.runner.request(req, timeout_s=self.runner.timeout_s * len(steps))
            with span("buffers"):
                oob = sorted({name for name, band in guards if not ShmBuffers.intact([band])})
                # in an arena, the outputs are read where the kernel wrote them (valid until the ring comes round)
                return sequence_results(self.problem, steps, staged, views, reply.seconds, oob, copy=keep is None)

    def ready_buffers(self, benches: list[tuple[dict[str, int], int, int]]) -> None:
        """The ring's arenas grown for the largest of those benches (ArenaRing.ready), a piece at a time as host
        work."""
        if self.ring is not None:
            self.ring.ready([bench_bytes(self.problem, *b) for b in benches], quiet.host_work)

    def bench(self, keys, shape, input_sets, *, min_samples, min_s, max_s, noise, warmup_s,
              precision=0.0) -> BenchResult:
        for k in keys:
            self.runner.ensure_loaded(self.loads[k])
        with request_buffers(self.ring, bench_bytes(self.problem, shape, len(keys), len(input_sets)),
                             reserve=True) as (bufs, keep):
            with span("buffers"):
                per_key = bench_argsets(self.problem, self.abi_args, bufs, shape, keys, input_sets)
            req = Bench([BenchKernel(k, [a for a, _ in per_key[k]]) for k in keys], min_samples=min_samples,
                        min_s=min_s, max_s=max_s, noise=noise, warmup_s=warmup_s, precision=precision, keep=keep)
            # this host's cores are the device: the process's compiles and draws ahead keep off them meanwhile
            with quiet.timing(on_host=True):
                reply = self.runner.request(req, timeout_s=max_s + 10 * warmup_s + self.runner.timeout_s)
            # the output of every set the runner reached, as the last timed call on it left it: all are checked
            # (in an arena, read where the kernel wrote them)
            copy = np.array if keep is None else (lambda v: v)
            with span("buffers"):
                outs = {k: [{t.name: copy(views[t.name]) for t in self.problem.spec.outputs}
                            for _, views in per_key[k][:reply.reached[k]]] for k in keys}
        return BenchResult(reply.samples, outs)

    def call_overhead_s(self) -> float:
        """The median time of a call that does nothing, through the same path as a kernel's (the runner's
        ctypes call with this ABI); measured once per session. The speed-of-light check subtracts it, so a
        kernel that skips its work is compared with the floor by the work it did, not by the call's cost."""
        if self._overhead is None:
            res = self.target.compile(NULL_KERNEL, "c", "-O2", "kernel")
            if not res.ok:
                raise RuntimeError(f"the empty kernel did not compile: {res.message}")
            self.load_artifact("__null__", res.artifact, "kernel")
            shape = min(self.problem.shapes("all"), key=lambda s: int(np.prod(list(s.values()))))
            zeros = {t.name: np.zeros(self.problem.tensor_shape(t, shape), t.dtype) for t in self.problem.spec.inputs}
            timed = self.bench(["__null__"], shape, [zeros], min_samples=200, min_s=0.02, max_s=0.2, noise=0.05,
                               warmup_s=0.01)
            self._overhead = float(np.median(timed.samples["__null__"]))
        return self._overhead

    def close(self) -> None:
        self.runner.stop()
        if self.ring is not None:
            self.ring.close()


def make(option: str, settings) -> CpuTarget:
    if option:
        raise ValueError(f"the cpu target takes no option (got 'cpu:{option}')")
    return CpuTarget(settings)

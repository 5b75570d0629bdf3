"""The cuda target's compile path: CUDA C++ through NVRTC to PTX, or hand-written PTX, linked to a cubin by nvJitLink.

Both libraries come from PyPI wheels (cuda-bindings, nvidia-cuda-nvrtc, nvidia-nvjitlink); no system toolkit, no
nvcc and no GPU are needed. The resource report (registers, shared memory, stack, spills, constant memory) is parsed
from nvJitLink's verbose info log.

One path for both languages: CUDA C++ is compiled by NVRTC to PTX for the virtual architecture (compute_90a for
sm_90a), and that PTX goes into nvJitLink exactly as a hand-written PTX candidate does. PTX rather than LTO-IR because
PTX from an NVRTC of one version is accepted by any nvJitLink at least as new (LTO-IR ties the two more tightly), it
is text we can read, and the two languages then share one link, one log format and one failure table.

A candidate's flags pass kfactory.targets.flags' cuda whitelist before anything else (compile_cuda refuses them
before the cache or the toolchain is touched, and candidate_flags, which every NVRTC and nvJitLink option list is
built from, checks them again): -I/--include-path and -include/--pre-include would read the compiler pod's files
into a kernel, --time=/--fdevice-time-trace= would write files there. A refused flag is a STATIC_CHECK result.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from kfactory.targets.base import CompileResult
from kfactory.targets.cuda.arch import _arch_problem
from kfactory.targets.cuda.cubin_cache import _cache_load, _cache_store, cache_key
from kfactory.targets.cuda.link import _ARCH_STATUSES, _nvjitlink, link_options
from kfactory.targets.cuda.nvrtc import _nvrtc_ptx, nvrtc_options
from kfactory.targets.cuda.report import _missing_entry, classify_log, first_error, parse_resource_report
from kfactory.targets.cuda.toolchain import toolchain_description
from kfactory.targets.flags import FlagRefused, check_flags
from kfactory.v1 import events_pb2 as pb


LOG_EXCERPT = 2000

#: how many real compilations this process ran (a cache hit does not count); tests read it through compile_count()
_COMPILES = 0


def compile_count() -> int:
    """Real compilations run in this process so far (cache hits excluded)."""
    return _COMPILES


def compile_cuda(source: str, language: str, flags: str, entry: str, arch: str,
                 cache_dir: Path | None) -> CompileResult:
    """Compile a candidate to a cubin for `arch` ('sm_90a'): language 'cuda' (CUDA C++ through NVRTC to PTX, then
    nvJitLink) or 'ptx' (straight into nvJitLink). `flags` are extra NVRTC options (shlex split, on the cuda
    whitelist of kfactory.targets.flags, else STATIC_CHECK without touching the toolchain); `entry` must be an
    extern "C" kernel in the cubin. A bad candidate or architecture is a typed result (COMPILE_ERROR,
    RESOURCE_LIMIT, UNSUPPORTED_ARCH, STATIC_CHECK) with the compiler's message; only CudaToolchainMissing is
    raised.
    With a cache_dir, results are content-addressed there and a hit does not compile."""
    try:
        check_flags("cuda", flags)
    except FlagRefused as exc:
        # before the cache, so an entry written before a flag was refused is never served, and before the toolchain
        report = pb.CompileReport(compiler=f"nvrtc -arch={arch}", arch=arch)
        return _flag_refused(report, time.perf_counter(), "", exc)
    compiler = f"{toolchain_description()} -arch={arch}"
    key = cache_key(source, language, flags, entry, arch)
    t0 = time.perf_counter()
    if cache_dir is not None and (hit := _cache_load(Path(cache_dir), key)) is not None:
        hit.report.seconds = time.perf_counter() - t0   # the lookup's, as the cpu target's cache says
        return hit
    result = _compile(source, language, flags, entry, arch, compiler)
    if cache_dir is not None:
        try:
            _cache_store(Path(cache_dir), key, result)
        except OSError:
            pass   # a cache that cannot be written costs a recompile later, not this result
    return result


def _compile(source: str, language: str, flags: str, entry: str, arch: str, compiler: str) -> CompileResult:
    global _COMPILES
    _COMPILES += 1
    t0 = time.perf_counter()
    report = pb.CompileReport(compiler=compiler, arch=arch)
    if language not in ("cuda", "ptx"):
        return _failed(report, t0, "", pb.COMPILE_ERROR, f"the cuda target compiles cuda or ptx, not {language!r}")
    if problem := _arch_problem(arch):
        return _failed(report, t0, problem, pb.UNSUPPORTED_ARCH, problem)
    nvrtc_log = ""
    if language == "cuda":
        try:
            options = nvrtc_options(arch, flags)
        except FlagRefused as exc:   # off the whitelist, or unsplittable (an unclosed quote)
            return _flag_refused(report, t0, "", exc)
        ok, nvrtc_log, ptx = _nvrtc_ptx(source, options)
        if not ok:
            return _failed(report, t0, nvrtc_log, classify_log(nvrtc_log), f"nvrtc: {first_error(nvrtc_log)}")
    else:
        ptx = source.encode()
    return _link_step(report, t0, nvrtc_log, ptx, arch, flags, entry)


def _link_step(report, t0, nvrtc_log: str, ptx: bytes, arch: str, flags: str, entry: str) -> CompileResult:
    try:
        options = link_options(arch, flags)
    except FlagRefused as exc:
        return _flag_refused(report, t0, nvrtc_log, exc)
    link = _nvjitlink(ptx, options)
    log = "\n".join(part for part in (nvrtc_log.strip(), link.error_log.strip(), link.info_log.strip()) if part)
    if not link.ok:
        reason = pb.UNSUPPORTED_ARCH if link.status in _ARCH_STATUSES else classify_log(link.error_log)
        return _failed(report, t0, log, reason, f"nvJitLink {link.status}: {first_error(link.error_log or log)}")
    report.artifact_bytes = len(link.cubin)
    for field, value in parse_resource_report(link.info_log, entry).items():
        setattr(report, field, value)
    if missing := _missing_entry(link.cubin, entry):
        return _failed(report, t0, log, pb.COMPILE_ERROR, missing)
    _finish(report, t0, log)
    return CompileResult(True, report, artifact=link.cubin, log=log)


def _finish(report: pb.CompileReport, t0: float, log: str) -> None:
    report.seconds = time.perf_counter() - t0
    report.log_excerpt = log[:LOG_EXCERPT]
    report.warnings = sum(1 for ln in log.splitlines() if re.search(r"\bwarning\b", ln, re.I))


def _failed(report: pb.CompileReport, t0: float, log: str, reason: int, message: str) -> CompileResult:
    _finish(report, t0, log)
    return CompileResult(False, report, log=log, reason=reason, message=message)


def _flag_refused(report: pb.CompileReport, t0: float, log: str, exc: FlagRefused) -> CompileResult:
    """A flag off the cuda whitelist: STATIC_CHECK, as the cpu target and the agents' checks name it."""
    return _failed(report, t0, log, pb.STATIC_CHECK, f"the flag breaks a sandbox rule: {exc}")

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

import hashlib
import importlib
import json
import os
import re
import struct
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from google.protobuf import json_format

from kfactory.platform.fsutil import atomic_write
from kfactory.targets.base import CompileResult
from kfactory.targets.flags import FlagRefused, check_flags, join_pairs
from kfactory.v1 import events_pb2 as pb

ARCHES = ("sm_80", "sm_90a", "sm_100a")
INSTALL_HINT = "pip install cuda-bindings nvidia-cuda-nvrtc nvidia-nvjitlink"
LOG_EXCERPT = 2000
# sm_NN, sm_NNa (arch-specific: wgmma, TMA, tcgen05) and sm_NNf (family-specific, CUDA 12.9 on)
ARCH_RE = re.compile(r"sm_(\d{1,3})([af]?)")

#: how many real compilations this process ran (a cache hit does not count); tests read it through compile_count()
_COMPILES = 0


class CudaToolchainMissing(RuntimeError):
    """cuda-bindings, NVRTC or nvJitLink cannot be imported or loaded here."""

    def __init__(self, detail: str = ""):
        extra = f" ({detail})" if detail else ""
        super().__init__(f"the cuda target needs NVRTC and nvJitLink: {INSTALL_HINT}{extra}")


def compile_count() -> int:
    """Real compilations run in this process so far (cache hits excluded)."""
    return _COMPILES


# ---------------------------------------------------------------------------------------------------------------
# the toolchain


@dataclass(frozen=True)
class _Toolchain:
    nvrtc: object
    nvjitlink: object
    nvrtc_version: str
    nvjitlink_version: str
    supported: tuple[int, ...]       # the sm numbers NVRTC can compile for
    header_dir: str                  # where cuda_bf16.h / cuda_fp16.h are, or ""


@lru_cache(maxsize=1)
def _toolchain() -> _Toolchain:
    try:
        nvrtc = importlib.import_module("cuda.bindings.nvrtc")
        nvjitlink = importlib.import_module("cuda.bindings.nvjitlink")
        err, major, minor = nvrtc.nvrtcVersion()
        _check_nvrtc(nvrtc, err, "nvrtcVersion")
        err, supported = nvrtc.nvrtcGetSupportedArchs()
        _check_nvrtc(nvrtc, err, "nvrtcGetSupportedArchs")
        link_version = _nvjitlink_version(nvjitlink)
    except CudaToolchainMissing:
        raise
    except Exception as exc:  # ImportError, or the wheel's shared library failing to load
        raise CudaToolchainMissing(f"{type(exc).__name__}: {exc}") from exc
    return _Toolchain(nvrtc, nvjitlink, f"{major}.{minor}", link_version, tuple(supported), _header_dir())


def _nvjitlink_version(nvjitlink) -> str:
    """'13.5'; older cuda-bindings may lack nvjitlink.version(), which must not make the toolchain 'missing'."""
    try:
        return ".".join(str(v) for v in nvjitlink.version())
    except Exception:  # noqa: BLE001 - any failure here only loses a version string
        return "?"


def _check_nvrtc(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CudaToolchainMissing(f"{what} returned {err!r}")


def _header_dir() -> str:
    """The include directory holding cuda_bf16.h/cuda_fp16.h, or "".

    NVRTC's wheel carries no built-in cuda_bf16.h or cuda_fp16.h; the nvidia-cuda-runtime wheel has them, under
    nvidia/cu13/include (13.x) or nvidia/cuda_runtime/include (12.x). A CUDA_HOME toolkit is used only as a last
    resort and is never required."""
    roots: list[Path] = []
    try:
        import nvidia
        roots = [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    candidates = [r / sub / "include" for r in roots for sub in ("cu13", "cu12", "cuda_runtime")]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append(Path(os.environ[env]) / "include")
    return next((str(c) for c in candidates if (c / "cuda_bf16.h").is_file()), "")


def toolchain_description() -> str:
    """'nvrtc 13.5 + nvJitLink 13.5', for reports and cache keys."""
    tc = _toolchain()
    return f"nvrtc {tc.nvrtc_version} + nvJitLink {tc.nvjitlink_version}"


# ---------------------------------------------------------------------------------------------------------------
# architectures


def resolve_arch(option: str) -> str:
    """'sm_90a' -> 'sm_90a'; '' (plain `cuda`) -> the architecture of GPU 0, read through the driver API.

    9.0 maps to sm_90a and 10.0 to sm_100a (the arch-specific targets, so wgmma/TMA/tcgen05 are available);
    anything else to sm_{major}{minor}. Whether NVRTC knows the architecture is compile_cuda's question (it answers
    UNSUPPORTED_ARCH); here only the form is checked. Raises ValueError when the option is malformed or when no
    architecture is named and there is no GPU."""
    option = option.strip()
    if option:
        if not ARCH_RE.fullmatch(option):
            raise ValueError(f"malformed cuda architecture {option!r}: expected sm_NN or sm_NNa, e.g. cuda:sm_90a")
        return option
    major, minor = _gpu0_capability()
    return {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get((major, minor), f"sm_{major}{minor}")


def _gpu0_capability() -> tuple[int, int]:
    no_gpu = "no GPU here: name the architecture, e.g. cuda:sm_90a"
    try:
        from cuda.bindings import driver
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise ValueError(f"{no_gpu} (cuInit: {err!r})")
        err, dev = driver.cuDeviceGet(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise ValueError(f"{no_gpu} (cuDeviceGet: {err!r})")
        attr = driver.CUdevice_attribute
        cc = []
        for which in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                      attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR):
            err, value = driver.cuDeviceGetAttribute(which, dev)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise ValueError(f"{no_gpu} (cuDeviceGetAttribute: {err!r})")
            cc.append(int(value))
        return cc[0], cc[1]
    except ValueError:
        raise
    except Exception as exc:  # no cuda-bindings, or no libcuda (no driver): either way there is no GPU to ask
        raise ValueError(f"{no_gpu} ({type(exc).__name__}: {exc})") from exc


def _arch_problem(arch: str) -> str:
    """Why this toolchain cannot compile for `arch`, or "" when it can.

    Checked before nvJitLink sees the name: nvJitLink 13.5 crashes the process (SIGSEGV) on some unknown names
    such as sm_1, so an unknown architecture must never reach it."""
    m = ARCH_RE.fullmatch(arch)
    if not m:
        return f"malformed architecture {arch!r} (expected sm_NN or sm_NNa)"
    tc = _toolchain()
    if int(m.group(1)) not in tc.supported:
        return (f"{toolchain_description()} does not know {arch}; it supports "
                + ", ".join(f"sm_{n}" for n in tc.supported))
    return _probe_virtual_arch(_virtual_arch(arch))


def _virtual_arch(arch: str) -> str:
    """sm_90a -> compute_90a: NVRTC emits PTX for the virtual architecture, suffix kept."""
    return "compute_" + arch[len("sm_"):]


@lru_cache(maxsize=None)
def _probe_virtual_arch(virtual: str) -> str:
    """Compile an empty kernel for `virtual`: NVRTC's own answer on a suffix (compute_80a does not exist)."""
    ok, log, _ = _nvrtc_ptx('extern "C" __global__ void kf_probe() {}', [f"-arch={virtual}"])
    return "" if ok else f"NVRTC does not know {virtual}: {log.strip()[:300]}"


# ---------------------------------------------------------------------------------------------------------------
# NVRTC and nvJitLink


def nvrtc_options(arch: str, flags: str) -> list[str]:
    """The NVRTC options used for CUDA C++: defaults first, then the candidate's flags (candidate_flags; raises
    FlagRefused for a flag off the whitelist, before the toolchain is asked anything)."""
    candidate = candidate_flags(flags)
    opts = [
        f"-arch={_virtual_arch(arch)}",
        "--std=c++17",
        # NVRTC never emits host code, so an unannotated helper function can only be meant for the device;
        # -default-device saves candidates a __device__ on every helper (and constexpr helpers just work)
        "-default-device",
    ]
    header_dir = _toolchain().header_dir
    if header_dir:
        opts.append(f"--include-path={header_dir}")   # ours, after the candidate's flags were checked
    return opts + candidate


def candidate_flags(flags: str) -> list[str]:
    """The candidate's flags as NVRTC takes them: checked against the cuda whitelist (raises FlagRefused);
    two-word forms joined into one word (`-Xptxas -v` -> `-Xptxas=-v`, `-maxrregcount 64` -> `-maxrregcount=64`,
    `-D BLOCK=16` -> `-DBLOCK=16`: NVRTC and nvJitLink take one option per word); nvcc's comma lists split
    (`-Xptxas -v,-O3` -> `-Xptxas=-v`, `-Xptxas=-O3`: nvJitLink hands `v,-O3` to ptxas whole, which refuses it);
    -O0..-O3 dropped, since under nvcc they set the host compiler's level (device code is optimised by default,
    and NVRTC rejects them as unrecognised), yet coders write `-O3` out of habit."""
    out = []
    for word in join_pairs("cuda", check_flags("cuda", flags)):
        if re.fullmatch(r"-O[0-3]", word):
            continue
        if word.startswith(("-Xptxas=", "--ptxas-options=")):
            name, values = word.split("=", 1)
            out += [f"{name}={value}" for value in values.split(",")]
        else:
            out.append(word)
    return out


def link_options(arch: str, flags: str) -> list[str]:
    """The nvJitLink options: the real architecture, the verbose resource lines, and the candidate's
    register cap and ptxas options, which NVRTC cannot apply when it stops at PTX."""
    passed = []
    for flag in candidate_flags(flags):
        if re.fullmatch(r"--?maxrregcount=\d+", flag):
            passed.append("-" + flag.lstrip("-"))          # nvJitLink spells it with one dash
        elif flag.startswith(("-Xptxas=", "--ptxas-options=")):
            passed.append("-Xptxas=" + flag.split("=", 1)[1])
    # -verbose gives nvJitLink's own per-function summary, -Xptxas=-v ptxas's lines (whose smem is the driver's
    # static size). -no-cache: nvJitLink 13.0 keeps a cache of its own across processes, and a hit there prints no
    # ptxas lines at all, so the report would depend on what ran before; kfactory caches results itself.
    return [f"-arch={arch}", "-verbose", "-Xptxas=-v", "-no-cache", *passed]


def _nvrtc_ptx(source: str, options: list[str]) -> tuple[bool, str, bytes]:
    """(ok, log, ptx) from NVRTC; NVRTC_ERROR_COMPILATION and NVRTC_ERROR_INVALID_OPTION come back as ok=False."""
    nvrtc = _toolchain().nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return False, f"nvrtcCreateProgram: {err!r}", b""
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        log = _nvrtc_read(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog).decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            name = _enum_name(err)
            return False, log if log.strip() else name, b""
        return True, log, _nvrtc_read(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_read(nvrtc, prog, size_fn, read_fn) -> bytes:
    err, size = size_fn(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size == 0:
        return b""
    buf = bytearray(size)   # a fresh mutable buffer: never hand the C side an interned bytes object
    read_fn(prog, buf)
    return bytes(buf).rstrip(b"\0")


@dataclass
class _Link:
    ok: bool
    cubin: bytes
    error_log: str
    info_log: str
    status: str          # nvJitLink's result name, "SUCCESS" when ok


def _nvjitlink(ptx: bytes, options: list[str]) -> _Link:
    """Link one PTX input to a cubin; a link error is data (status, logs), never an exception."""
    jl = _toolchain().nvjitlink
    try:
        handle = _jl_create(jl, options)
    except jl.nvJitLinkError as exc:
        return _Link(False, b"", f"nvJitLinkCreate({' '.join(options)}): {exc}", "", _status_name(jl, exc))
    try:
        status = "SUCCESS"
        try:
            jl.add_data(handle, jl.InputType.PTX, ptx, len(ptx), "kernel.ptx")
            jl.complete(handle)
        except jl.nvJitLinkError as exc:
            status = _status_name(jl, exc)
        error_log = _jl_read(jl.get_error_log_size, jl.get_error_log, handle).decode(errors="replace")
        info_log = _jl_read(jl.get_info_log_size, jl.get_info_log, handle).decode(errors="replace")
        cubin = b""
        if status == "SUCCESS":
            cubin = _jl_read(jl.get_linked_cubin_size, jl.get_linked_cubin, handle, strip=False)
        return _Link(status == "SUCCESS", cubin, error_log, info_log, status)
    finally:
        jl.destroy(handle)


def _jl_create(jl, options: list[str]) -> int:
    """nvJitLinkCreate; an nvJitLink too old to know -no-cache is asked again without it."""
    try:
        return jl.create(len(options), options)
    except jl.nvJitLinkError as exc:
        if "-no-cache" not in options or _status_name(jl, exc) != "ERROR_UNRECOGNIZED_OPTION":
            raise
        rest = [o for o in options if o != "-no-cache"]
        return jl.create(len(rest), rest)


def _jl_read(size_fn, read_fn, handle, strip: bool = True) -> bytes:
    size = size_fn(handle)
    if not size:
        return b""
    buf = bytearray(size)
    read_fn(handle, buf)
    return bytes(buf).rstrip(b"\0") if strip else bytes(buf)


def _status_name(jl, exc) -> str:
    """'ERROR_PTX_COMPILE' from an nvJitLinkError (its .status is the nvJitLinkResult code)."""
    code = getattr(exc, "status", None)
    try:
        return jl.Result(code).name
    except (ValueError, TypeError):
        return str(exc).split(" ")[0] or "ERROR_UNKNOWN"


def _enum_name(value) -> str:
    return getattr(value, "name", str(value))


# ---------------------------------------------------------------------------------------------------------------
# failure classification

#: nvJitLink result codes that say the architecture itself is the problem
_ARCH_STATUSES = {"ERROR_UNRECOGNIZED_ARCH", "ERROR_UNSUPPORTED_ARCH", "ERROR_MISSING_ARCH"}

#: The codes cannot separate "too big" from "wrong": nvJitLink 13.5 answers a shared-memory overflow with
#: ERROR_INTERNAL and a constant-memory overflow with ERROR_PTX_COMPILE, the same code as a PTX syntax error; NVRTC
#: answers a parameter-space overflow with NVRTC_ERROR_COMPILATION like any C++ error. Only the error lines tell,
#: so these are matched against the `error`/`fatal` lines of the log, first match wins; anything else is
#: COMPILE_ERROR.
_LOG_TABLE: tuple[tuple[re.Pattern, int], ...] = (
    # "Entry function 'k' uses too much shared data (0x61a80 bytes, 0xc000 max)", "... too much local data",
    # "File uses too much global constant data (0x27100 bytes, 0x10000 max)"
    (re.compile(r"uses too much \w+( \w+)? data"), pb.RESOURCE_LIMIT),
    (re.compile(r"too many (registers|resources|barriers)", re.I), pb.RESOURCE_LIMIT),
    # NVRTC: "Formal parameter space overflowed (40012 bytes required, max 32764 bytes allowed)"
    (re.compile(r"parameter space overflowed", re.I), pb.RESOURCE_LIMIT),
    (re.compile(r"exceeds? (the )?(maximum|limit)|out of (registers|shared memory)", re.I), pb.RESOURCE_LIMIT),
    # PTX written for another architecture: "Program with .target 'sm_90a' cannot be compiled to future
    # architecture", "PTX .version 8.0 does not support .target sm_100a"
    (re.compile(r"cannot be compiled to future architecture|does not support \.target|"
                r"Unknown arch|unsupported (gpu )?architecture", re.I), pb.UNSUPPORTED_ARCH),
)
_ERROR_LINE = re.compile(r"(^|\s)(error|fatal)\s*:|Error:", re.M)


def classify_log(log: str) -> int:
    """The reject reason the error lines of a failed compile or link name (see _LOG_TABLE)."""
    lines = [ln for ln in log.splitlines() if _ERROR_LINE.search(ln)]
    for pattern, reason in _LOG_TABLE:
        if any(pattern.search(ln) for ln in lines):
            return reason
    return pb.COMPILE_ERROR


def first_error(log: str) -> str:
    """The first error line of a log (the compiler's own words), or its first non-empty line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    errors = [ln for ln in lines if _ERROR_LINE.search(ln)]
    return (errors or lines or ["(no log)"])[0][:500]


# ---------------------------------------------------------------------------------------------------------------
# the resource report

_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPS = re.compile(r"ptxas\s+info\s*:\s*Function properties for (\S+)")
_LINK_PROPS = re.compile(r"^info\s*:\s*Function properties for '([^']+)':")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"\b[Uu]sed (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_LMEM = re.compile(r"(\d+) bytes lmem")
_LINK_STACK = re.compile(r"(\d+) stack\b")


def _names_entry(name: str, entry: str) -> bool:
    """True for the entry's own name, or a C++-mangled name of a function called `entry` (_Z6kernelPfi,
    _ZN2ns6kernelEPf)."""
    if name == entry:
        return True
    # the length prefix must be whole: "1k" inside "_Z11kernel_abcd" is not a function called k
    return name.startswith("_Z") and re.search(rf"(?<!\d){len(entry)}{re.escape(entry)}", name) is not None


def parse_resource_report(log: str, entry: str) -> dict:
    """Registers, memory and spills of kernel `entry`, from a ptxas/nvJitLink verbose log.

    Two formats appear in one nvJitLink -verbose log: ptxas's lines (`Compiling entry function 'k'`,
    `Function properties for k` + the stack/spill line, `Used 32 registers, ... 16 bytes smem, 380 bytes cmem[0]`),
    then nvJitLink's own summary (`Function properties for 'k':` + `used 32 registers, ..., 0 stack, 2048 bytes
    smem, 548 bytes cmem[0], 0 bytes lmem`). ptxas's numbers win: nvJitLink's smem on sm_90a includes the 1 KiB
    the driver reserves per block (1152 for a 128-byte array, where CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES says 128).
    nvJitLink's line fills what ptxas left out (cmem for sm_90a/sm_100a, lmem). Keys: registers, shared_bytes,
    stack_bytes, spill_store_bytes, spill_load_bytes, local_bytes, const_bytes (all cmem banks added up); a key
    is absent when the log does not say."""
    ptxas = _ptxas_fields(log.splitlines(), entry)
    link = _link_fields(log.splitlines(), entry)
    return {**link, **ptxas}


def _ptxas_fields(lines: list[str], entry: str) -> dict:
    out: dict = {}
    current_entry = props_for = None
    for line in lines:
        if m := _PTXAS_ENTRY.search(line):
            current_entry, props_for = m.group(1), None
            continue
        if m := _PTXAS_PROPS.search(line):
            props_for = m.group(1)
            continue
        if (m := _STACK.search(line)) and props_for and _names_entry(props_for, entry):
            out.update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)), spill_load_bytes=int(m.group(3)))
        is_usage = _USED.search(line) and line.lstrip().startswith("ptxas")
        if is_usage and current_entry and _names_entry(current_entry, entry):
            out.update(_usage(line))
    return out


def _link_fields(lines: list[str], entry: str) -> dict:
    out: dict = {}
    props_for = None
    for line in lines:
        if m := _LINK_PROPS.search(line):
            props_for = m.group(1)
            continue
        if line.startswith("info") and _USED.search(line) and props_for and _names_entry(props_for, entry):
            out.update(_usage(line))
            if m := _LINK_STACK.search(line):
                out["stack_bytes"] = int(m.group(1))
            props_for = None
    return out


def _usage(line: str) -> dict:
    """registers, smem, cmem and lmem of one `Used N registers, ...` line."""
    out = {"registers": int(_USED.search(line).group(1))}
    if m := _SMEM.search(line):
        out["shared_bytes"] = int(m.group(1))
    if banks := _CMEM.findall(line):
        out["const_bytes"] = sum(int(size) for size, _ in banks)
    if m := _LMEM.search(line):
        out["local_bytes"] = int(m.group(1))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the cubin's symbols


def cubin_functions(cubin: bytes) -> set[str]:
    """Names of the FUNC symbols in a cubin's ELF .symtab (64-bit little-endian ELF, as every cubin is)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        return set()
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _name, sh_type, _f, _a, offset, size, link, _i, _al, entsize in sections:
        if sh_type != 2 or not entsize:   # SHT_SYMTAB
            continue
        str_off = sections[link][4]
        for pos in range(offset, offset + size, entsize):
            st_name, st_info = struct.unpack_from("<IB", cubin, pos)
            if st_info & 0xF == 2:        # STT_FUNC
                end = cubin.index(b"\0", str_off + st_name)
                names.add(cubin[str_off + st_name:end].decode(errors="replace"))
    return names


def _missing_entry(cubin: bytes, entry: str) -> str:
    """Why the cubin lacks `entry`, or "" when it has it."""
    functions = cubin_functions(cubin)
    if entry in functions:
        return ""
    mangled = sorted(f for f in functions if _names_entry(f, entry))
    if mangled:
        return (f"the cubin has no function {entry!r}, only the C++-mangled {mangled[0]!r}: "
                f"declare the kernel extern \"C\"")
    return f"the cubin has no function {entry!r} (it has: {', '.join(repr(f) for f in sorted(functions)) or 'none'})"


# ---------------------------------------------------------------------------------------------------------------
# compile_cuda


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
    if cache_dir is not None and (hit := _cache_load(Path(cache_dir), key)) is not None:
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


# ---------------------------------------------------------------------------------------------------------------
# the content-addressed cache


def cache_key(source: str, language: str, flags: str, entry: str, arch: str) -> str:
    """sha256 over everything that decides the result, toolchain versions and header directory included."""
    tc = _toolchain()
    parts = [language, source, flags, entry, arch, tc.nvrtc_version, tc.nvjitlink_version, tc.header_dir]
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little") + data)   # length-prefixed: no two part lists collide
    return h.hexdigest()


def _cache_load(cache_dir: Path, key: str) -> CompileResult | None:
    meta_path, cubin_path = cache_dir / f"{key}.json", cache_dir / f"{key}.cubin"
    try:
        meta = json.loads(meta_path.read_text())
        report = json_format.Parse(json.dumps(meta["report"]), pb.CompileReport())
        cubin = cubin_path.read_bytes() if meta["ok"] else b""
    except (OSError, ValueError, KeyError, json_format.ParseError):
        return None   # absent or torn: compile again
    if meta["ok"] and len(cubin) != report.artifact_bytes:
        return None
    return CompileResult(meta["ok"], report, artifact=cubin, log=meta["log"], reason=meta["reason"],
                         message=meta["message"])


def _cache_store(cache_dir: Path, key: str, result: CompileResult) -> None:
    """The cubin first, then the JSON: an entry counts only once its JSON is there, so a reader never sees a
    JSON without its cubin. Typed failures are cached too (json only): the same bad candidate fails the same way."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    if result.ok:
        atomic_write(cache_dir / f"{key}.cubin", result.artifact)
    meta = {"ok": result.ok, "reason": int(result.reason), "message": result.message, "log": result.log,
            "report": json_format.MessageToDict(result.report, preserving_proto_field_name=True)}
    atomic_write(cache_dir / f"{key}.json", json.dumps(meta).encode())



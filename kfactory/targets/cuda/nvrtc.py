"""NVRTC: CUDA C++ to PTX for the virtual architecture, with the candidate's flags checked against the cuda
whitelist (kfactory.targets.flags) and joined into the one-word forms NVRTC and nvJitLink take."""
from __future__ import annotations

import re

from kfactory.targets.cuda.toolchain import _enum_name, _toolchain
from kfactory.targets.flags import check_flags, join_pairs


def _virtual_arch(arch: str) -> str:
    """sm_90a -> compute_90a: NVRTC emits PTX for the virtual architecture, suffix kept."""
    return "compute_" + arch[len("sm_"):]


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

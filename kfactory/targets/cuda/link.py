"""nvJitLink: one PTX input linked to a cubin for the real architecture, with the verbose logs the resource report
is read from; a link error is data (its status and logs), never an exception."""
from __future__ import annotations

import re
from dataclasses import dataclass

from kfactory.targets.cuda.nvrtc import candidate_flags
from kfactory.targets.cuda.toolchain import _toolchain


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


#: nvJitLink result codes that say the architecture itself is the problem
_ARCH_STATUSES = {"ERROR_UNRECOGNIZED_ARCH", "ERROR_UNSUPPORTED_ARCH", "ERROR_MISSING_ARCH"}

"""Template of an exported cuda kernel's build script (kfactory export fills in _CONFIG; this copy is never run).

Builds the cubin with NVRTC (CUDA C++ to PTX) and nvJitLink (PTX to cubin) from the cuda-bindings wheels, with
the options the kernel was measured with. Needs: pip install cuda-bindings nvidia-cuda-nvrtc nvidia-nvjitlink
(and nvidia-cuda-runtime for cuda_bf16.h / cuda_fp16.h). No GPU is needed to build.
Exit status: 0 built, 1 the compiler refused the source, 3 the toolchain is missing.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

_CONFIG: dict = {}  # kfactory-export: config

TOOLCHAIN_MISSING = 3
INSTALL_HINT = "pip install cuda-bindings nvidia-cuda-nvrtc nvidia-nvjitlink nvidia-cuda-runtime"


def header_dir() -> str:
    """The include directory with cuda_bf16.h/cuda_fp16.h (the nvidia-cuda-runtime wheel, else CUDA_HOME)."""
    roots: list[Path] = []
    try:
        import nvidia
        roots = [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    found = [r / sub / "include" for r in roots for sub in ("cu13", "cu12", "cuda_runtime")]
    found += [Path(os.environ[env]) / "include" for env in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(env)]
    return next((str(c) for c in found if (c / "cuda_bf16.h").is_file()), "")


def nvrtc_ptx(nvrtc, source: str, options: list[str]) -> bytes:
    """PTX of CUDA C++; exits 1 with NVRTC's log when it refuses the source."""
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), _CONFIG["source"].encode(), 0, [], [])
    if err != ok:
        sys.exit(f"nvrtcCreateProgram: {err!r}")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        if err != ok:
            sys.exit(f"NVRTC refused {_CONFIG['source']} ({err!r}):\n{log.decode(errors='replace')}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(prog, ptx)
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def link(nvjitlink, ptx: bytes, options: list[str]) -> bytes:
    """The cubin of one PTX input; exits 1 with nvJitLink's log when it refuses it."""
    try:
        handle = nvjitlink.create(len(options), options)
    except nvjitlink.nvJitLinkError:
        # an nvJitLink older than -no-cache refuses it; the option only keeps its own cache out of the way
        rest = [o for o in options if o != "-no-cache"]
        handle = nvjitlink.create(len(rest), rest)
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), "kernel.ptx")
            nvjitlink.complete(handle)
        except nvjitlink.nvJitLinkError as exc:
            size = nvjitlink.get_error_log_size(handle)
            log = bytearray(size)
            if size:
                nvjitlink.get_error_log(handle, log)
            sys.exit(f"nvJitLink refused the PTX ({exc}):\n{bytes(log).decode(errors='replace')}")
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        return bytes(cubin)
    finally:
        nvjitlink.destroy(handle)


def main() -> None:
    try:
        from cuda.bindings import nvjitlink, nvrtc
    except ImportError as exc:
        print(f"cannot build {_CONFIG['cubin']}: the CUDA toolchain wheels are missing ({exc}): {INSTALL_HINT}",
              file=sys.stderr)
        sys.exit(TOOLCHAIN_MISSING)
    here = Path(__file__).resolve().parent
    source = (here / _CONFIG["source"]).read_text()
    if _CONFIG["language"] == "ptx":
        ptx = source.encode()
    else:
        options = list(_CONFIG["nvrtc_options"])
        if include := header_dir():
            options.append(f"--include-path={include}")
        ptx = nvrtc_ptx(nvrtc, source, options + list(_CONFIG["candidate_flags"]))
    if not re.search(rb"\.entry\s+" + re.escape(_CONFIG["entry"].encode()) + rb"\s*\(", ptx):
        sys.exit(f"the PTX has no entry {_CONFIG['entry']!r}")
    cubin = link(nvjitlink, ptx, list(_CONFIG["link_options"]))
    out = here / _CONFIG["cubin"]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_bytes(cubin)
    os.replace(tmp, out)   # atomic: a reader never sees half a cubin
    print(out)


if __name__ == "__main__":
    main()

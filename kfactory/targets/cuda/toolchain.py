"""The cuda toolchain from PyPI wheels: NVRTC and nvJitLink through cuda-bindings, and the headers NVRTC needs
(cuda_bf16.h, cuda_fp16.h) from the nvidia-cuda-runtime wheel. Loaded once per process; CudaToolchainMissing when
they cannot be imported or loaded here."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any


INSTALL_HINT = "pip install cuda-bindings nvidia-cuda-nvrtc nvidia-nvjitlink"


class CudaToolchainMissing(RuntimeError):
    """cuda-bindings, NVRTC or nvJitLink cannot be imported or loaded here."""

    def __init__(self, detail: str = ""):
        extra = f" ({detail})" if detail else ""
        super().__init__(f"the cuda target needs NVRTC and nvJitLink: {INSTALL_HINT}{extra}")


@dataclass(frozen=True)
class _Toolchain:
    nvrtc: Any       # the cuda.bindings modules
    nvjitlink: Any
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


def _enum_name(value) -> str:
    return getattr(value, "name", str(value))

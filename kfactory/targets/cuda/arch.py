"""Architectures: the names the cuda target accepts (sm_NN, sm_NNa, sm_NNf), GPU 0's when none is named, and
whether this toolchain can compile for one (asked before nvJitLink ever sees the name)."""
from __future__ import annotations

from functools import lru_cache

from kfactory.targets import CUDA_ARCH_RE
from kfactory.targets.cuda.nvrtc import _nvrtc_ptx, _virtual_arch
from kfactory.targets.cuda.toolchain import _toolchain, toolchain_description


ARCHES = ("sm_80", "sm_90a", "sm_100a")
ARCH_RE = CUDA_ARCH_RE


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


@lru_cache(maxsize=None)
def _probe_virtual_arch(virtual: str) -> str:
    """Compile an empty kernel for `virtual`: NVRTC's own answer on a suffix (compute_80a does not exist)."""
    ok, log, _ = _nvrtc_ptx('extern "C" __global__ void kf_probe() {}', [f"-arch={virtual}"])
    return "" if ok else f"NVRTC does not know {virtual}: {log.strip()[:300]}"

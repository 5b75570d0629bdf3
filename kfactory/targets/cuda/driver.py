"""The CUDA driver API as the cuda runner child uses it (cuda-bindings): the module handle `cu`, every call's result
checked (check raises CudaError), and an error classified by its CUresult value, never by its message: a fault of the
kernel (the context is poisoned), a refused launch, or another error.

Every other module of the child reads `driver.cu` at call time, so a test can put a fake driver here once.
"""
from __future__ import annotations

from kfactory.sandbox.child import KernelFault
from kfactory.sandbox.protocol import FaultKind

try:
    from cuda.bindings import driver as cu
except ImportError:  # pragma: no cover - the module imports without cuda-bindings; ops then refuse
    cu = None


#: CUresult names, mapped by value: a fault of the kernel (the context is unusable afterwards)
FAULT_NAMES = ("CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_ILLEGAL_INSTRUCTION",
               "CUDA_ERROR_MISALIGNED_ADDRESS", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT",
               "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_LAUNCH_TIMEOUT",
               "CUDA_ERROR_ECC_UNCORRECTABLE", "CUDA_ERROR_CONTEXT_IS_DESTROYED", "CUDA_ERROR_TENSOR_MEMORY_LEAK")
#: ... a launch the driver refused wherever the error shows (too many resources for the configuration)
LAUNCH_NAMES = ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
                "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", "CUDA_ERROR_INVALID_CLUSTER_SIZE")
#: the driver calls that launch work: any error from them that is not a fault is a refused launch
#: (CUDA_ERROR_INVALID_VALUE for a bad grid, block or shared-memory size, INVALID_HANDLE, NO_BINARY_FOR_GPU...)
LAUNCH_CALLS = ("cuLaunchKernel", "cuFuncSetAttribute", "cuGraphInstantiate", "cuGraphLaunch",
                "cuStreamBeginCapture", "cuStreamEndCapture")


def _codes(names) -> frozenset[int]:
    if cu is None:
        return frozenset()
    return frozenset(int(getattr(cu.CUresult, n)) for n in names if hasattr(cu.CUresult, n))


FAULT_CODES = _codes(FAULT_NAMES)
LAUNCH_CODES = _codes(LAUNCH_NAMES)


def classify(call: str, code: int) -> str:
    """"device_fault", "launch_failed" or "cuda_error" for CUresult `code` returned by driver call `call`
    (by value, never by message): any other error is the runner's, not the kernel's."""
    if code in FAULT_CODES:
        return "device_fault"
    if call in LAUNCH_CALLS or code in LAUNCH_CODES:
        return "launch_failed"
    return "cuda_error"


class CudaError(Exception):
    """A driver call returned an error."""

    def __init__(self, call: str, code: int):
        self.call, self.code, self.kind = call, int(code), classify(call, int(code))
        name = str(code)
        if cu is not None:
            try:
                name = cu.CUresult(self.code).name
            except ValueError:
                pass
        super().__init__(f"{call} failed: {name} ({self.code})")

    def fatal(self) -> KernelFault:
        """The fault this error is while the kernel's work is in flight: the context may be poisoned, so the child
        replies and exits (kfactory.sandbox.child.main)."""
        return KernelFault(FaultKind(self.kind), str(self), code=self.code, exiting=True)


class CudaUnavailable(OSError):
    """CUDA cannot start here (no driver, no GPU, no cuda-bindings): the runner's environment, not the kernel."""


def check(call: str, res):
    """The value(s) of a cuda-bindings call returning (CUresult, values...); raises CudaError on failure."""
    if not isinstance(res, tuple):
        res = (res,)
    err, rest = res[0], res[1:]
    if int(err) != 0:
        raise CudaError(call, int(err))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def dptr(addr: int):
    """A device pointer for the driver's calls."""
    return cu.CUdeviceptr(int(addr))

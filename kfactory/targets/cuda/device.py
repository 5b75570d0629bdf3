"""The device of the cuda runner child: the one visible GPU in its primary context (which torch in the same process
shares), started once; its attributes and description, two blocking-sync events for timing, the legacy default stream
(torch's default stream too) and a non-blocking side stream for graph capture; and the child's CPU-time account."""
from __future__ import annotations

import os
import resource

from kfactory.targets.cuda import driver
from kfactory.targets.cuda.driver import CudaError, CudaUnavailable, check


def arch_of(major: int, minor: int) -> str:
    """The compile architecture of a compute capability: sm_90a for 9.0, sm_100a for 10.0, else sm_XY."""
    if (major, minor) == (9, 0):
        return "sm_90a"
    if (major, minor) == (10, 0):
        return "sm_100a"
    return f"sm_{major}{minor}"


def _uuid_text(raw: bytes) -> str:
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def cpu_usage() -> dict:
    """The child's CPU seconds so far and its CPU-time limit (-1: none), for the parent to replace it in time."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    soft = resource.getrlimit(resource.RLIMIT_CPU)[0]
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "cpu_limit_s": -1 if soft == resource.RLIM_INFINITY else soft}


class CudaDevice:
    """GPU 0 of CUDA_VISIBLE_DEVICES in its primary context; start() before anything else (idempotent)."""

    def __init__(self):
        self.dev = None
        self.ctx = None
        self.side_stream = None
        self.ev0 = self.ev1 = self.stream0 = None
        self.l2 = self.smem_optin = 0

    def start(self) -> None:
        """Start CUDA on the one visible device; CudaUnavailable when it cannot (no driver, no GPU, no bindings)."""
        if self.ctx is not None:
            return
        if driver.cu is None:
            raise CudaUnavailable("cuda-bindings is not installed (from cuda.bindings import driver failed)")
        where = os.environ.get("CUDA_VISIBLE_DEVICES", "(all)")
        try:
            check("cuInit", driver.cu.cuInit(0))
            if check("cuDeviceGetCount", driver.cu.cuDeviceGetCount()) < 1:
                raise CudaUnavailable(f"no CUDA device visible (CUDA_VISIBLE_DEVICES={where})")
            dev = check("cuDeviceGet", driver.cu.cuDeviceGet(0))
            try:  # block in synchronize instead of spinning: a runner has a CPU-time limit
                driver.cu.cuDevicePrimaryCtxSetFlags(dev, int(driver.cu.CUctx_flags.CU_CTX_SCHED_BLOCKING_SYNC))
            except Exception:  # noqa: BLE001 - an optimisation only
                pass
            ctx = check("cuDevicePrimaryCtxRetain", driver.cu.cuDevicePrimaryCtxRetain(dev))
            check("cuCtxSetCurrent", driver.cu.cuCtxSetCurrent(ctx))
            flags = int(driver.cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC)
            self.ev0 = check("cuEventCreate", driver.cu.cuEventCreate(flags))
            self.ev1 = check("cuEventCreate", driver.cu.cuEventCreate(flags))
            self.l2 = self.attr(dev, "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE")
            self.smem_optin = self.attr(dev, "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        except CudaUnavailable:
            raise
        except CudaError as e:
            raise CudaUnavailable(f"CUDA cannot start on CUDA_VISIBLE_DEVICES={where}: {e}") from e
        except Exception as e:  # noqa: BLE001 - e.g. the driver library is missing (no GPU here)
            raise CudaUnavailable(f"CUDA cannot start on CUDA_VISIBLE_DEVICES={where}: "
                                  f"{type(e).__name__}: {e}") from e
        self.dev, self.ctx = dev, ctx
        self.stream0 = driver.cu.CUstream(0)  # the legacy default stream: torch's default stream too

    @staticmethod
    def attr(dev, name: str) -> int:
        """Device attribute `name` (a CUdevice_attribute member name) of `dev`."""
        which = getattr(driver.cu.CUdevice_attribute, name)
        return int(check("cuDeviceGetAttribute", driver.cu.cuDeviceGetAttribute(which, dev)))

    def info(self) -> dict:
        """{"name", "uuid", "arch", "sm_count", "l2_bytes", "mem_bytes", "smem_optin", "cc"}."""
        self.start()
        dev = self.dev
        name = check("cuDeviceGetName", driver.cu.cuDeviceGetName(256, dev))
        name = (name.split(b"\0")[0].decode(errors="replace") if isinstance(name, (bytes, bytearray))
                else str(name).split("\0")[0])
        uuid = _uuid_text(check("cuDeviceGetUuid", driver.cu.cuDeviceGetUuid(dev)).bytes)
        major = self.attr(dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR")
        minor = self.attr(dev, "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")
        return {"name": name.strip(), "uuid": uuid, "arch": arch_of(major, minor), "cc": f"{major}.{minor}",
                "sm_count": self.attr(dev, "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
                "l2_bytes": self.l2, "smem_optin": self.smem_optin,
                "mem_bytes": int(check("cuDeviceTotalMem", driver.cu.cuDeviceTotalMem(dev)))}

    def time(self, stream, enqueue) -> float:
        """Seconds between two events recorded on `stream` around `enqueue()`."""
        check("cuEventRecord", driver.cu.cuEventRecord(self.ev0, stream))
        enqueue()
        check("cuEventRecord", driver.cu.cuEventRecord(self.ev1, stream))
        check("cuEventSynchronize", driver.cu.cuEventSynchronize(self.ev1))
        return float(check("cuEventElapsedTime", driver.cu.cuEventElapsedTime(self.ev0, self.ev1))) * 1e-3

    def stream(self):
        """The non-blocking side stream (created on first use): CUDA graphs are captured and replayed on it."""
        if self.side_stream is None:
            flags = int(driver.cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
            self.side_stream = check("cuStreamCreate", driver.cu.cuStreamCreate(flags))
        return self.side_stream

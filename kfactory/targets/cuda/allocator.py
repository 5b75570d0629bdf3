"""Device memory of the cuda runner child: fresh buffers per tensor (guard bands of a known byte around every tensor
of a checked call), inputs uploaded from and outputs copied back to the tensors' shared-memory bytes (the host side
stages nothing else: the parent's /dev/shm files are the staging buffers), outputs poisoned, and the scratch buffer
written between timed samples to flush the L2."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kfactory.targets.cuda import driver
from kfactory.targets.cuda.driver import CudaError, check, dptr


ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint8": 1}
GUARD = 4096          # bytes of known pattern before and after every tensor of a checked call
GUARD_BYTE = 0xA5


def _nbytes(a: dict) -> int:
    return int(math.prod(a["shape"])) * ITEMSIZE[a["dtype"]]


@dataclass
class DevTensor:
    """One tensor on the device: `ptr` is what the kernel sees, `base` what was allocated (guards around)."""
    name: str
    role: str
    dtype: str
    shape: tuple
    nbytes: int
    base: int
    ptr: int
    guard: int
    host: np.ndarray  # the shared-memory bytes of the tensor (uint8)

    @property
    def elements(self) -> int:
        """Elements of its dtype the tensor holds."""
        return self.nbytes // ITEMSIZE[self.dtype]


class Allocator:
    """Allocates, fills, checks and frees device buffers; `host_bytes(descriptor)` is the uint8 view of a tensor's
    shared-memory bytes (the child maps each file once per request)."""

    def __init__(self, host_bytes):
        self.host_bytes = host_bytes
        self.scratch: tuple[int, int] | None = None   # (base, bytes) of the L2 flush buffer, made on first use
        self.flush_value = 0
        self.live: dict[int, int] = {}   # every buffer allocated and not yet freed: base -> bytes

    def alloc(self, nbytes: int) -> int:
        """A fresh device buffer of `nbytes` (at least 1); its address."""
        base = int(check("cuMemAlloc", driver.cu.cuMemAlloc(max(1, nbytes))))
        self.live[base] = max(1, nbytes)
        return base

    def free(self, bases: list[int]) -> None:
        for b in bases:
            check("cuMemFree", driver.cu.cuMemFree(dptr(b)))
            self.live.pop(b, None)

    def live_bytes(self) -> int:
        """Bytes of device buffers held now besides the L2 flush scratch (which lives as long as the child)."""
        keep = self.scratch[0] if self.scratch else None
        return sum(n for b, n in self.live.items() if b != keep)

    def free_or_fatal(self, bases: list[int]) -> None:
        """free() on the way out of a failed request: a CUDA error here means the context is gone (fatal)."""
        try:
            self.free(bases)
        except CudaError as e:
            raise e.fatal() from e

    def poison(self, t: DevTensor) -> None:
        """NaN in every element of a float output (a quiet NaN pattern per dtype), 0xFF bytes otherwise."""
        p = dptr(t.ptr)
        if t.dtype == "float32":
            check("cuMemsetD32", driver.cu.cuMemsetD32(p, 0x7FC00000, t.nbytes // 4))
        elif t.dtype == "float64":  # 0x7FF800007FF80000 is a NaN
            check("cuMemsetD32", driver.cu.cuMemsetD32(p, 0x7FF80000, t.nbytes // 4))
        elif t.dtype == "bfloat16":
            check("cuMemsetD16", driver.cu.cuMemsetD16(p, 0x7FC0, t.nbytes // 2))
        elif t.dtype == "float16":
            check("cuMemsetD16", driver.cu.cuMemsetD16(p, 0x7E00, t.nbytes // 2))
        else:
            check("cuMemsetD8", driver.cu.cuMemsetD8(p, 0xFF, t.nbytes))

    def h2d(self, t: DevTensor, host: np.ndarray) -> None:
        check("cuMemcpyHtoD", driver.cu.cuMemcpyHtoD(dptr(t.ptr), host.ctypes.data, t.nbytes))

    def d2h(self, t: DevTensor, host: np.ndarray) -> None:
        check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(host.ctypes.data, dptr(t.ptr), t.nbytes))

    def upload(self, argset: list[dict], into: dict[str, DevTensor], guard: bool) -> dict[str, DevTensor]:
        """Fresh device buffers for every tensor of `argset` (filled into `into` as they are made, so a
        failure half way can free them): inputs copied from shared memory, outputs poisoned."""
        g = GUARD if guard else 0
        for a in argset:
            if "path" not in a:
                continue
            host = self.host_bytes(a)
            nbytes = host.size
            base = self.alloc(nbytes + 2 * g)
            t = DevTensor(a["name"], a.get("role", "in"), a["dtype"], tuple(a["shape"]), nbytes, base, base + g, g,
                          host)
            into[a["name"]] = t
            if g:
                check("cuMemsetD8", driver.cu.cuMemsetD8(dptr(base), GUARD_BYTE, nbytes + 2 * g))
            if t.role == "out":
                self.poison(t)
            else:
                self.h2d(t, host)
        return into

    def fresh(self, a: dict, guard: bool) -> DevTensor:
        """A fresh device buffer for tensor descriptor `a` with no shared-memory bytes behind it (a tensor the
        device itself fills: an input drawn in place, an output compared in place), guard bands around it."""
        g = GUARD if guard else 0
        nbytes = _nbytes(a)
        base = self.alloc(nbytes + 2 * g)
        if g:
            check("cuMemsetD8", driver.cu.cuMemsetD8(dptr(base), GUARD_BYTE, nbytes + 2 * g))
        return DevTensor(a["name"], a.get("role", "in"), a["dtype"], tuple(a["shape"]), nbytes, base, base + g, g,
                         np.empty(0, dtype=np.uint8))

    def guards_intact(self, t: DevTensor) -> bool:
        if not t.guard:
            return True
        band = np.empty(t.guard, dtype=np.uint8)
        for start in (t.base, t.ptr + t.nbytes):
            check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(band.ctypes.data, dptr(start), t.guard))
            if not bool((band == GUARD_BYTE).all()):
                return False
        return True

    def flush(self, stream, nbytes: int) -> None:
        """Write a scratch buffer of 2 x L2 (outside the timed region) so the next sample starts cold."""
        if not nbytes:
            return
        if self.scratch is None:
            self.scratch = (self.alloc(nbytes), nbytes)
        self.flush_value = (self.flush_value + 1) & 0xFF
        base, size = self.scratch
        check("cuMemsetD8Async", driver.cu.cuMemsetD8Async(dptr(base), self.flush_value, size, stream))

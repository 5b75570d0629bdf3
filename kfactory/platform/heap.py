"""Keeping freed memory in the process, so that the judge's next large input set reuses it.

The judge draws large input sets again and again (softmax 4096x4096: 64 MiB of input and a 128 MiB float64
reference each). glibc's malloc serves each from a fresh mmap and unmaps it when freed, so every draw writes to
pages the kernel must fault in anew. On a virtual machine that hands free guest memory back to its host (the
virtio balloon's free page reporting, as on the Firecracker VMs kfactory is developed on) that is about 1 s per
128 MiB touched, measured: a 128 MiB array filled at once after another was freed took 0.02 s, filled 2 s after,
1.3 s. Where malloc keeps what it frees (no mmap, no trimming), the draws after the first reuse the heap's pages:
the second and third honest softmax checks of one process (`kfactory check`'s work) took 19 s each instead of
31 s and 27 s on that host. A process's first draws still grow its heap from fresh pages.

One arena for every thread: the services judge in worker threads (asyncio.to_thread), and a thread's own arena
maps any block larger than its 64 MiB heaps whatever M_MMAP_MAX says, and would keep its own high-water mark
besides the others' (helper-84 measured both).

The cost: the heap never shrinks. It holds the most the process ever had in use at once, plus what fragmentation
adds (a synthetic run of 400 draws of 4-128 MiB among long-lived mid-sized arrays: 682 MiB of heap for 418 MiB
live at most). Size a long-running verifier's or benchmarker's memory limit for that, or set
KFACTORY_KEEP_HEAP=false to keep glibc malloc's defaults. The services that judge no kernel (planner, coder,
compiler, memory) keep the defaults whatever the setting: their peaks (a large bundle imported, say) are not worth
holding for their life.
"""
from __future__ import annotations

import ctypes
import functools

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8

#: mallopt(3): "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"
NEVER_TRIM = -1

#: (parameter, value): no block from mmap, no trimming, one arena
KEEP = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM), (M_ARENA_MAX, 1))


@functools.cache
def _mallopt():
    """glibc's mallopt, or None where the C library has none (musl, macOS)."""
    fn = getattr(ctypes.CDLL(None), "mallopt", None)   # the symbols this process has loaded: its C library's
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


def keep_freed_memory() -> bool:
    """Make malloc keep in this process what it frees, in one arena for every thread (allocations already made
    are unaffected); True where the C library took every setting (glibc), False where it has no mallopt or refused
    one (each is still tried)."""
    fn = _mallopt()
    if fn is None:
        return False
    return all([bool(fn(param, value)) for param, value in KEEP])


def keep_freed_memory_if_set(settings) -> bool:
    """keep_freed_memory() where settings.keep_heap (KFACTORY_KEEP_HEAP, default true) asks for it, else nothing;
    whether it was kept. Every kfactory command that may judge kernels calls it at its start
    (kfactory.cli.main.judges_in_process: all but the services that judge none), and so does each process that
    judges as one does (the test process, the benches that stand for a verifier and for `kfactory run`)."""
    return bool(settings.keep_heap) and keep_freed_memory()

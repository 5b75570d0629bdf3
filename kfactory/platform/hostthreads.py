"""Threads that the judge's own bulk work on the host shares: comparing a large output with its reference, writing
a request's input sets and poisoned outputs into shared memory. On the cpu target that work runs while its
candidate holds the device, when no timing uses the host's cores: spread over them, the device is held less long
(issue 23). The work is numpy copies and ctypes calls, which let go of the GIL."""
from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: the most threads the work uses (a larger host gains little more: the work is bound by memory bandwidth)
MAX_THREADS = 4


_inside = threading.local()


def threads() -> int:
    """How many threads the work is spread over: one per core, at most MAX_THREADS."""
    return max(1, min(MAX_THREADS, os.cpu_count() or 1))


@functools.lru_cache(maxsize=1)
def pool() -> ThreadPoolExecutor:
    """The shared threads."""
    return ThreadPoolExecutor(threads(), thread_name_prefix="kf-host", initializer=setattr,
                              initargs=(_inside, "pool", True))


def each(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """fn over every item, the items spread over the shared threads in as many runs of consecutive items as there
    are threads (not one task each: a small shape's timing pool is hundreds of sets); results in the items' order.
    One item, one thread, or a call from one of the shared threads (which would wait for its own pool) runs here."""
    items = list(items)
    n = min(len(items), threads())
    if n <= 1 or getattr(_inside, "pool", False):
        return [fn(x) for x in items]
    size = -(-len(items) // n)

    def run(lo: int) -> list[R]:
        return [fn(x) for x in items[lo:lo + size]]
    runs = [pool().submit(run, lo) for lo in range(0, len(items), size)]
    wait(runs)   # every run ends before an error is raised: none may go on writing into buffers handed back
    return [r for run in runs for r in run.result()]

"""The judge's shared host threads (kfactory/platform/hostthreads.py) and the buffer writes that use them
(kfactory/sandbox/shm_args.write_all): results in order, work spread over the threads, no deadlock when the work
itself asks for the threads, and writes that land where a one-thread write would."""
from __future__ import annotations

import threading

import numpy as np

from kfactory.platform import hostthreads
from kfactory.sandbox import shm_args


def test_each_keeps_the_items_order_and_spreads_them_over_the_threads(monkeypatch):
    monkeypatch.setattr(hostthreads, "threads", lambda: 3)
    hostthreads.pool.cache_clear()
    try:
        seen: list[str] = []
        together = threading.Barrier(3, timeout=10)   # runs of 4, 4 and 2 items, whose first items meet here

        def square(x: int) -> int:
            if x in (0, 4, 8):
                together.wait()
            seen.append(threading.current_thread().name)
            return x * x
        assert hostthreads.each(square, range(10)) == [x * x for x in range(10)]
        assert len(set(seen)) == 3 and all(name.startswith("kf-host") for name in seen)
        # work on the shared threads that asks for them again runs in its own thread instead of waiting for itself
        nested = hostthreads.each(lambda x: hostthreads.each(lambda y: x + y, range(3)), range(6))
        assert nested == [[x + y for y in range(3)] for x in range(6)]
    finally:
        hostthreads.pool.cache_clear()


def test_one_item_or_one_thread_runs_in_the_caller(monkeypatch):
    here = threading.current_thread().name
    assert hostthreads.each(lambda _: threading.current_thread().name, [0]) == [here]
    monkeypatch.setattr(hostthreads, "threads", lambda: 1)
    assert set(hostthreads.each(lambda _: threading.current_thread().name, range(5))) == {here}


def test_large_writes_land_as_one_thread_would_write_them():
    rng = np.random.default_rng(3)
    sources = [rng.standard_normal(1 << 20).astype(np.float32) for _ in range(5)]   # 20 MiB: over the threshold
    views = [np.zeros(1 << 20, np.float32) for _ in range(10)]
    writes = [(views[2 * i], s) for i, s in enumerate(sources)] + [(views[2 * i + 1], float("nan")) for i in range(5)]
    assert sum(v.nbytes for v, _ in writes) >= shm_args.WRITE_AT_ONCE_BYTES
    shm_args.write_all(writes)
    for i, s in enumerate(sources):
        assert np.array_equal(views[2 * i], s) and np.isnan(views[2 * i + 1]).all()

"""Where the judge's time goes: exclusive seconds per named part of its work, accumulated for this process.

The services wrap a candidate's work in `span("verify")`, `span("measure")`, ...; the judge and the sessions wrap
their parts (`span("drawing")`, `span("references")`, `span("comparison")`, `span("buffers")`, `span("runner")`)
inside. A part's path is its spans' names joined by "/" ("verify/runner"), and the seconds recorded for a path
are its own (exclusive): time spent in a nested span is counted there, not in its parent, so the paths of a
snapshot partition the wall time of the outermost spans. `credit()` records a part measured elsewhere: the
runner child reports how long the kernel itself ran, which is carved out of the round trip that carried it
("verify/runner/kernel").

This is plain arithmetic on perf_counter, cheap enough to stay on in production (a few microseconds a span);
bench/throughput.py reads it. Spans nest per thread: each candidate's work runs in one worker thread.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

_local = threading.local()
_lock = threading.Lock()
_seconds: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)


@dataclass
class _Frame:
    """An open span: its path, and the seconds its nested spans and credits took (not its own)."""
    path: str
    nested: float = 0.0


def _stack() -> list[_Frame]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _path(name: str) -> str:
    stack = _stack()
    return f"{stack[-1].path}/{name}" if stack else name


def add(path: str, seconds: float, count: int = 1) -> None:
    """Record `seconds` under `path` directly (a wait measured by its owner, such as a device lease's)."""
    with _lock:
        _seconds[path] += seconds
        _counts[path] += count


@contextlib.contextmanager
def span(name: str):
    """Time the block as part `name` of the enclosing span (a top-level part when there is none)."""
    stack = _stack()
    frame = _Frame(_path(name))
    stack.append(frame)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        took = time.perf_counter() - t0
        stack.pop()
        add(frame.path, max(0.0, took - frame.nested))
        if stack:
            stack[-1].nested += took


def credit(name: str, seconds: float) -> None:
    """Record `seconds` of the enclosing span as its part `name`, measured elsewhere (the runner child's kernel
    time inside a round trip): they leave the enclosing span's own seconds."""
    seconds = max(0.0, float(seconds))
    stack = _stack()
    add(_path(name), seconds)
    if stack:
        stack[-1].nested += seconds


def wrapped(name: str, fn):
    """`fn` run inside span(name): for work handed to a thread, whose stack starts empty."""
    def run(*args, **kwargs):
        with span(name):
            return fn(*args, **kwargs)
    run.__name__ = getattr(fn, "__name__", name)
    return run


def snapshot() -> dict[str, tuple[float, int]]:
    """{path: (seconds, times recorded)} so far; two snapshots' difference is what happened between them."""
    with _lock:
        return {p: (s, _counts[p]) for p, s in _seconds.items()}


def since(before: dict[str, tuple[float, int]]) -> dict[str, tuple[float, int]]:
    """What was recorded after the snapshot `before`."""
    out = {}
    for path, (s, n) in snapshot().items():
        s0, n0 = before.get(path, (0.0, 0))
        if n > n0:
            out[path] = (s - s0, n - n0)
    return out

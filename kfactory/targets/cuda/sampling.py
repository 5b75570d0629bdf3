"""Samplers of the cuda runner child's timing: one launch between two events, or a CUDA graph of N launches replayed
(its time divided by N) for kernels of a few microseconds, with the L2 flushed before every sample; and the warm-up
that runs every argument set before the first timed sample."""
from __future__ import annotations

import math
import statistics

from kfactory.sandbox.child import warm_up
from kfactory.targets.cuda import driver
from kfactory.targets.cuda.allocator import Allocator
from kfactory.targets.cuda.device import CudaDevice
from kfactory.targets.cuda.driver import check
from kfactory.targets.cuda.program import capture


GRAPH_TARGET_S = 200e-6  # a graph replay (or a run of back-to-back baseline calls) lasts at least this
MAX_GRAPH_LAUNCHES = 4096


def sampler(device: CudaDevice, mem: Allocator, enq: list, stream, cubin: bool, mode: str, flush_bytes: int,
            graphs: list) -> tuple:
    """(sample(i) -> seconds of one launch, launches per sample) over `enq`, one enqueue per argument set on
    `stream`. events: one launch between two events. graph (cubins): a graph of N launches rotating over the sets,
    replayed on the non-default `stream`, its time divided by N. graph (torch baselines, which are not captured):
    N back-to-back calls between two events, divided by N. Captured graphs are kept in `graphs` for destruction."""
    def one(i: int) -> float:
        mem.flush(stream, flush_bytes)
        return device.time(stream, enq[i % len(enq)])

    if mode != "graph":
        return one, 1
    first = statistics.median(one(i) for i in range(3))
    n = max(1, min(MAX_GRAPH_LAUNCHES, math.ceil(GRAPH_TARGET_S / max(first, 1e-7))))
    if not cubin:
        def many(i: int, n=n) -> float:
            mem.flush(stream, flush_bytes)
            return device.time(stream, lambda: [enq[(i * n + j) % len(enq)]() for j in range(n)]) / n
        return many, n
    exe, n_exe = None, n
    for attempt in range(2):  # the first guess comes from an events time, which overstates a tiny kernel
        exe, n_exe = capture(stream, [enq[j % len(enq)] for j in range(n)], graphs), n
        mem.flush(stream, flush_bytes)
        replay = device.time(stream, lambda exe=exe: check("cuGraphLaunch", driver.cu.cuGraphLaunch(exe, stream)))
        if attempt == 1 or replay >= 0.75 * GRAPH_TARGET_S or n >= MAX_GRAPH_LAUNCHES:
            break
        n = max(1, min(MAX_GRAPH_LAUNCHES, math.ceil(n * 1.25 * GRAPH_TARGET_S / max(replay, 1e-7))))

    def replayed(i: int, exe=exe, n=n_exe) -> float:
        mem.flush(stream, flush_bytes)
        return device.time(stream, lambda: check("cuGraphLaunch", driver.cu.cuGraphLaunch(exe, stream))) / n
    return replayed, n_exe


def warm_up_device(samplers: dict, warmup_s: float, sets: int) -> int:
    """Sample every kernel until a round's device time has settled (runner_child.warm_up), and at least
    once on each of its `sets` argument sets (an events sample i runs set i mod sets; a graph replays the same
    launches, on min(N, sets) sets, every time), so no timed sample is a set's first run: a kernel that
    computes only on a freshly poisoned output is then timed by its repeat runs alone, as the cpu runner's
    warm-up ensures; the samples are dropped, the rounds it took returned."""
    return warm_up(lambda n: sum(s(n) for s in samplers.values()), warmup_s, min_rounds=sets)

"""What verification (kfactory.judge.verify) and measurement (kfactory.judge.measure) share: the input pool with
its float64 references, the check of one call's outputs against them, tampering (writes out of bounds or into an
input), the typed Rejection that ends a check early, and the reason of a candidate's fault."""
from __future__ import annotations

import contextlib
import copy
import math
import threading
from dataclasses import dataclass

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.judge import quiet
from kfactory.judge.numerics import check_from_figures, compare
from kfactory.observability.stagetime import span
from kfactory.problems import Problem
from kfactory.problems.check import run_reference
from kfactory.sandbox.parent import RunnerFault
from kfactory.sandbox.shm_args import set_bytes
from kfactory.v1 import events_pb2 as pb


LARGE_ELEMENTS = 1 << 20


def fault_reason(e: RunnerFault) -> int:
    """The typed reason for a candidate's fault (its kind's, kfactory.sandbox.protocol.REJECT_REASONS)."""
    return e.reason


@dataclass(frozen=True)
class RegressionInput:
    """An input that once exposed a wrong kernel: re-drawn exactly from (shape, distribution, seed)."""
    shape: str
    distribution: str
    seed: int

    @classmethod
    def of(cls, msg: pb.RegressionInput) -> "RegressionInput":
        return cls(msg.shape, msg.distribution, msg.seed)


class InputPool:
    """Fresh inputs and their float64 references per (shape, distribution), and timing pools per shape.

    Small sets are drawn anew for every use; a large set (over LARGE_ELEMENTS; a timing pool counts its sets'
    elements together) is shared by at most `reuse` uses before it is drawn again with a fresh seed, because
    drawing and computing the float64 reference of 16M elements costs more than the kernel under test. The pool
    holds a set only while another use of it may come: one used up goes with its last user. Every
    draw's seed is recorded in the checks. `regressions` are inputs memory holds for the problem; every
    verification runs them too.

    Sets can be drawn ahead (the `ahead_*` methods, then `serving`): before a candidate's work takes the device,
    so that the device never waits for numpy. A small set drawn ahead is the candidate's own, used once like any
    small set; a large one drawn ahead replaces a shared draw that is used up, and is shared from then on.
    Methods may be called from several threads (a service's workers draw ahead while one of them holds the device).
    """

    def __init__(self, problem: Problem, reuse: int, regressions: list[RegressionInput] | None = None):
        self.problem, self.reuse = problem, reuse
        self.regressions = list(regressions or [])
        self._sets: dict[tuple, list] = {}
        self._lock = threading.Lock()
        #: held while the screening sets are drawn (ahead_screen, screen_sets): one draw, which others wait for
        self._screen_lock = threading.Lock()
        #: a view's sets drawn ahead, per key, each for one use (see serving)
        self._ahead: dict[tuple, list] = {}

    def _limit(self, numel: int) -> int:
        return self.reuse if numel > LARGE_ELEMENTS else 1

    def _get(self, key: tuple, numel: int, make):
        if self._ahead.get(key):
            return self._ahead[key].pop()
        limit = self._limit(numel)
        with self._lock:
            entry = self._sets.get(key)
            if entry is not None and entry[1] < limit:
                entry[1] += 1
                if entry[1] == limit:   # used up: the pool lets it go with its last user (kfactory check held 1 GB)
                    del self._sets[key]
                return entry[0]
        value = make()  # outside the lock: another thread's use of the pool need not wait for this draw
        if limit > 1:
            with self._lock:
                self._sets[key] = [value, 1]
        return value

    def _draw_ahead(self, ahead: dict, key: tuple, numel: int, make) -> None:
        """Draw a set ahead with make(), which marks its parts as host work (kfactory.judge.quiet: never beside a
        timing on this host's cores, which it would slow, and in parts short enough for a timing to wait for)."""
        if numel <= LARGE_ELEMENTS:
            value = make()
            ahead.setdefault(key, []).append(value)
            return
        with self._lock:  # a shared draw: drawn again ahead only once it is used up
            entry = self._sets.get(key)
            if entry is not None and entry[1] < self.reuse:
                return
        value = make()
        with self._lock:
            entry = self._sets.get(key)
            if entry is None or entry[1] >= self.reuse:
                self._sets[key] = [value, 0]

    def serving(self, ahead: dict) -> "InputPool":
        """A view of this pool (the same shared draws, regressions and lock) that hands out `ahead`'s sets (filled
        by the ahead_* methods) before drawing any; the view is the candidate's, and sets it did not use go with
        it."""
        view = copy.copy(self)
        view._ahead = ahead
        return view

    def _check(self, shape: dict[str, int], dist: str, paced: bool = False):
        return ((self.problem.shape_str(shape), dist), math.prod(shape.values()),
                lambda: self.drawn(shape, dist, inp.fresh_seed(), paced))

    def get(self, shape: dict[str, int], dist: str):
        """(inputs, float64 reference outputs, seed) for one verification check."""
        return self._get(*self._check(shape, dist))

    def ahead_check(self, ahead: dict, shape: dict[str, int], dist: str) -> None:
        """Draw get(shape, dist)'s set into `ahead` (see serving)."""
        self._draw_ahead(ahead, *self._check(shape, dist, paced=True))

    def own(self, key: tuple, make):
        """make()'s value for this use alone (sets no other use may see, such as the memoisation probe's), or the
        one drawn ahead under `key` (ahead_own)."""
        return self._ahead[key].pop() if self._ahead.get(key) else make()

    def ahead_own(self, ahead: dict, key: tuple, make) -> None:
        """Make own(key, make)'s value now, into `ahead`, as host work (see _draw_ahead)."""
        value = quiet.as_host_work(make)
        ahead.setdefault(key, []).append(value)

    def _regression(self, reg: RegressionInput, paced: bool = False):
        shape = self.problem.parse_shape(reg.shape)
        return ((reg.shape, "regression", reg.distribution, reg.seed),
                lambda: self.drawn(shape, reg.distribution, reg.seed, paced))

    def regression_set(self, reg: RegressionInput):
        """(inputs, float64 reference outputs, seed) of a regression input, drawn again from its seed for this use
        (never kept in the pool: memory's regression inputs change, and each is a different set)."""
        return self.own(*self._regression(reg))

    def ahead_regression(self, ahead: dict, reg: RegressionInput) -> None:
        """Draw regression_set(reg) into `ahead`."""
        key, make = self._regression(reg, paced=True)
        value = make()
        ahead.setdefault(key, []).append(value)

    def drawn(self, shape: dict[str, int], dist: str, seed: int, paced: bool = False):
        """(inputs, float64 reference outputs, seed) drawn with a given seed; `paced`: the draw and the reference
        each as host work of its own (kfactory.judge.quiet), so that a timing waits for one half at most."""
        with quiet.host_work() if paced else contextlib.nullcontext(), span("drawing"):
            x = inp.draw(self.problem, shape, dist, seed)
        with quiet.host_work() if paced else contextlib.nullcontext(), span("references"):
            return x, run_reference(self.problem, x, shape, dist), seed

    def _probe(self, shape: dict[str, int], paced: bool = False):
        return ((self.problem.shape_str(shape), "probe"), math.prod(shape.values()),
                lambda: self.drawn(shape, timing_dist(self.problem), inp.fresh_seed(), paced))

    def probe_set(self, shape: dict[str, int]):
        """(inputs, float64 reference outputs, seed) for the check after a timing (see measure): drawn from the
        timing distribution but never one of the timing sets, shared like get()'s large sets."""
        return self._get(*self._probe(shape))

    def ahead_probe(self, ahead: dict, shape: dict[str, int]) -> None:
        """Draw probe_set(shape)'s set into `ahead`."""
        self._draw_ahead(ahead, *self._probe(shape, paced=True))

    def _timing(self, shape: dict[str, int], cache_bytes: int, paced: bool = False):
        """(key, elements, make) of the timing sets; `paced`: each set's draw and reference as host work of its own,
        as a set drawn ahead is (kfactory.judge.quiet; a small shape's pool is hundreds of sets, which a timing
        should not wait for all of). The pool counts as one set of all its sets' elements: a small shape's pool
        (167 sets of softmax 1x50257 where the cache is 32 MiB) costs as much to draw and reference as a large set,
        and is shared like one."""
        count = n_sets(self.problem, shape, cache_bytes)

        def make():
            seeds = [inp.fresh_seed() for _ in range(count)]
            dist = timing_dist(self.problem)
            sets, refs = [], []
            for s in seeds:
                with quiet.host_work() if paced else contextlib.nullcontext(), span("drawing"):
                    sets.append(inp.draw(self.problem, shape, dist, s))
                with quiet.host_work() if paced else contextlib.nullcontext(), span("references"):
                    refs.append(run_reference(self.problem, sets[-1], shape, dist))
            return sets, refs, seeds
        return (self.problem.shape_str(shape), "timing"), count * math.prod(shape.values()), make

    def timing_sets(self, shape: dict[str, int], cache_bytes: int):
        """(rotating input sets larger than the cache, float64 reference outputs of every set, seeds)."""
        return self._get(*self._timing(shape, cache_bytes))

    def pinned_timing(self, shape: dict[str, int], cache_bytes: int, uses: int) -> "InputPool":
        """A view (see serving) whose next `uses` timing_sets(shape) all give one draw: this pool's next (drawn
        ahead, shared, or new), counted as one use of a shared draw. For the timings of one rotated measurement
        (kfactory.judge.rotated): they time their kernels on the same sets, and none of them draws under the
        device once the first has its sets (a shared draw used up between two rotations was drawn again there,
        whole: a softmax 4096x4096 pool's references took seconds of a final comparison's lease). The view's
        other sets drawn ahead are this pool's, used as from it. ReferenceFailed as timing_sets."""
        value = self.timing_sets(shape, cache_bytes)
        ahead = dict(self._ahead)
        ahead[self._timing(shape, cache_bytes)[0]] = [value] * uses
        return self.serving(ahead)

    def ahead_timing(self, ahead: dict, shape: dict[str, int], cache_bytes: int) -> None:
        """Draw timing_sets(shape)'s sets into `ahead`."""
        key, numel, make = self._timing(shape, cache_bytes, paced=True)
        self._draw_ahead(ahead, key, numel, make)

    def screen_sets(self, shape: dict[str, int], cache_bytes: int) -> list[dict]:
        """Rotating input sets for screening timings (kfactory.judge.screening.screen): drawn once and shared by every
        screen, with no reference, since a screen checks nothing and decides nothing but whether a candidate
        is judged at all (one that passes is verified on fresh inputs like any other). Drawn here where no
        ahead_screen drew them; where one is drawing them, its draw is waited for."""
        key = (self.problem.shape_str(shape), "screen")
        with self._screen_lock, self._lock:  # once for every screen of the pool's life: screens at once share one
            if key not in self._sets:
                self._sets[key] = [self._screen_draw(shape, cache_bytes, paced=False), 0]
            return self._sets[key][0]

    def ahead_screen(self, shape: dict[str, int], cache_bytes: int) -> None:
        """Draw screen_sets(shape)'s sets now where they are not drawn yet: before the device is held, each set
        as host work of its own (kfactory.judge.quiet) and outside the pool's lock, so the first screen of the
        pool's life does not draw them under the device (softmax 4096x4096: eight sets, about 2.7 s on the
        2-core host). One draw at a time (_screen_lock): a second caller, or a screen, waits for it."""
        key = (self.problem.shape_str(shape), "screen")
        with self._screen_lock:
            with self._lock:
                if key in self._sets:
                    return
            sets = self._screen_draw(shape, cache_bytes, paced=True)
            with self._lock:
                self._sets[key] = [sets, 0]

    def _screen_draw(self, shape: dict[str, int], cache_bytes: int, paced: bool) -> list[dict]:
        """The screening sets, each drawn from a fresh seed (`paced`: as host work of its own, kfactory.judge.quiet)."""
        dist, sets = timing_dist(self.problem), []
        for _ in range(n_sets(self.problem, shape, cache_bytes)):
            with quiet.host_work() if paced else contextlib.nullcontext(), span("drawing"):
                sets.append(inp.draw(self.problem, shape, dist, inp.fresh_seed()))
        return sets

    def screen_seeds(self, shape: dict[str, int], cache_bytes: int) -> list[int]:
        """The seeds of the screening sets a device draws itself (Session.bench_drawn), chosen once and shared by
        every screen as screen_sets' sets are."""
        key = (self.problem.shape_str(shape), "screen-seeds")
        with self._lock:
            if key not in self._sets:
                self._sets[key] = [[inp.fresh_seed() for _ in range(n_sets(self.problem, shape, cache_bytes))], 0]
            return self._sets[key][0]


def check_outputs(problem: Problem, outputs: dict, ref: dict, shape: str, dist: str, seed: int,
                  seconds: float) -> pb.Check:
    """The worst output's Check against the float64 reference (every element compared, dtype enforced)."""
    with span("comparison"):
        return _compared(problem, outputs, ref, shape, dist, seed, seconds)


def _compared(problem: Problem, outputs: dict, ref: dict, shape: str, dist: str, seed: int,
              seconds: float) -> pb.Check:
    checks = []
    for t in problem.spec.outputs:
        tol = problem.spec.tolerance[t.dtype]
        if outputs[t.name].dtype != np.dtype(t.dtype):
            return pb.Check(shape=shape, distribution=dist, seed=seed, note=f"{t.name} has the wrong dtype")
        checks.append(compare(outputs[t.name], ref[t.name], tol.atol, tol.rtol, tol.norm_rel))
    return worst_check(checks, shape, dist, seed, seconds)


def worst_check(checks: list[pb.Check], shape: str, dist: str, seed: int, seconds: float) -> pb.Check:
    """The check that stands for a call: the first failing output's, else the largest norm-relative error's,
    labelled with the call's shape, distribution, seed and time."""
    worst = min(checks, key=lambda c: (c.passed, -c.norm_rel_err))
    worst.shape, worst.distribution, worst.seed, worst.seconds = shape, dist, seed, seconds
    return worst


def judged_on_device(session, shape: dict[str, int], dist: str) -> bool:
    """Whether a check (or timing set) of `shape` drawn from `dist` is judged where the kernel runs: a large set
    (where drawing it and computing its float64 reference on the host cost most) that the session's device can
    draw, reference and compare itself (Session.device_check_unavailable)."""
    return math.prod(shape.values()) > LARGE_ELEMENTS and session.device_check_unavailable(shape, dist) is None


def timed_on_device(session, problem: Problem, shape: dict[str, int]) -> bool:
    """Whether a timing's sets at `shape` (drawn from timing_dist) are drawn and checked by the session's device
    (judged_on_device): then nothing of them is drawn on the host, ahead or not."""
    return judged_on_device(session, shape, timing_dist(problem))


def device_checks(problem: Problem, figures: dict[str, dict], shape: str, dist: str, seed: int,
                  seconds: float) -> pb.Check:
    """The check of one run a device judged (Session.device_check's figures per output)."""
    checks = []
    for t in problem.spec.outputs:
        tol = problem.spec.tolerance[t.dtype]
        checks.append(check_from_figures(figures[t.name], tol.atol, tol.rtol, tol.norm_rel))
    return worst_check(checks, shape, dist, seed, seconds)


class Rejection(Exception):
    """Ends a verification (or a measurement's check) early with a typed reason."""

    def __init__(self, reason: int, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


def reject_tampering(res, sname: str, dist: str) -> None:
    """Raise Rejection when a call wrote outside its outputs (a guard band changed) or wrote an input."""
    if res.out_of_bounds:
        raise Rejection(pb.OUT_OF_BOUNDS, f"{sname}/{dist}: the kernel wrote outside {res.out_of_bounds} "
                                          "(a guard band next to the tensor changed)")
    if res.mutated:
        raise Rejection(pb.INPUT_MUTATED, f"{sname}/{dist}: the kernel wrote input(s) {res.mutated}")


def n_sets(problem: Problem, shape: dict[str, int], cache_bytes: int, max_sets: int = 256, kernels: int = 1) -> int:
    """How many input sets a rotating timing pool needs to be larger than the cache; with `kernels` timed
    interleaved, how many each needs. Each kernel has buffers of its own, so between two calls of one kernel on
    one set the others' calls pass their own sets through the cache too: together they need to exceed it, not
    each (on a host with a 480 MiB cache, five softmax 4096x4096 kernels each on eight sets of 128 MiB mapped
    5 GiB into a runner allowed 4 GiB of address space; two sets each exceed the cache as surely)."""
    per_kernel = max(set_bytes(problem, shape), 1) * max(kernels, 1)
    return min(max_sets, max(2, math.ceil(cache_bytes / per_kernel)))


def timing_dist(problem: Problem) -> str:
    """The distribution timings draw from: normal where the problem declares it."""
    return "normal" if "normal" in problem.spec.distributions else next(iter(problem.spec.distributions))

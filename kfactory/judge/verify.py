"""Verification and measurement of one compiled kernel, over a target Session (runner-backed).

Both return typed verdicts; a candidate's crash, hang or wrong answer is a result, never an exception. Only the
candidate's own faults (RunnerFault) become verdicts: a failure of the harness (kfactory.sandbox.parent.HarnessError)
or any other exception propagates to the service, which records it as its own error, never as the candidate's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.judge.numerics import compare, same_bytes
from kfactory.observability.stagetime import span
from kfactory.problems import Problem
from kfactory.problems.check import ReferenceFailed, run_reference
from kfactory.sandbox.parent import RunnerFault
from kfactory.targets import Session
from kfactory.sandbox.shm_args import set_bytes
from kfactory.v1 import events_pb2 as pb

LARGE_ELEMENTS = 1 << 20


@dataclass
class Verdict:
    """passed, or the typed reason with a message; every check's figures either way."""
    passed: bool
    reason: int = pb.REJECT_REASON_UNSPECIFIED
    message: str = ""
    checks: list[pb.Check] = field(default_factory=list)


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

    Small sets are drawn anew for every use; a large set (over LARGE_ELEMENTS) is shared by at most `reuse`
    uses before it is drawn again with a fresh seed, because drawing and computing the float64 reference of
    16M elements costs more than the kernel under test. Every draw's seed is recorded in the checks.
    `regressions` are inputs memory holds for the problem; every verification runs them too.
    """

    def __init__(self, problem: Problem, reuse: int, regressions: list[RegressionInput] | None = None):
        self.problem, self.reuse = problem, reuse
        self.regressions = list(regressions or [])
        self._sets: dict[tuple[str, str], list] = {}

    def _get(self, key: tuple[str, str], numel: int, make):
        entry = self._sets.get(key)
        if entry is None or entry[1] >= (self.reuse if numel > LARGE_ELEMENTS else 1):
            entry = [make(), 0]
            self._sets[key] = entry
        entry[1] += 1
        return entry[0]

    def get(self, shape: dict[str, int], dist: str):
        """(inputs, float64 reference outputs, seed) for one verification check."""
        def make():
            return self.drawn(shape, dist, inp.fresh_seed())
        return self._get((self.problem.shape_str(shape), dist), math.prod(shape.values()), make)

    def drawn(self, shape: dict[str, int], dist: str, seed: int):
        """(inputs, float64 reference outputs, seed) drawn with a given seed."""
        with span("drawing"):
            x = inp.draw(self.problem, shape, dist, seed)
        with span("references"):
            return x, run_reference(self.problem, x, shape, dist), seed

    def probe_set(self, shape: dict[str, int]):
        """(inputs, float64 reference outputs, seed) for the check after a timing (see measure): drawn from the
        timing distribution but never one of the timing sets, shared like get()'s large sets."""
        def make():
            return self.drawn(shape, timing_dist(self.problem), inp.fresh_seed())
        return self._get((self.problem.shape_str(shape), "probe"), math.prod(shape.values()), make)

    def timing_sets(self, shape: dict[str, int], cache_bytes: int):
        """(rotating input sets larger than the cache, float64 reference outputs of every set, seeds)."""
        def make():
            seeds = [inp.fresh_seed() for _ in range(n_sets(self.problem, shape, cache_bytes))]
            dist = timing_dist(self.problem)
            with span("drawing"):
                sets = [inp.draw(self.problem, shape, dist, s) for s in seeds]
            with span("references"):
                return sets, [run_reference(self.problem, x, shape, dist) for x in sets], seeds
        return self._get((self.problem.shape_str(shape), "timing"), math.prod(shape.values()), make)

    def screen_sets(self, shape: dict[str, int], cache_bytes: int) -> list[dict]:
        """Rotating input sets for screening timings (kfactory.judge.screening.screen): drawn once and shared by every
        screen, with no reference, since a screen checks nothing and decides nothing but whether a candidate
        is judged at all (one that passes is verified on fresh inputs like any other)."""
        key = (self.problem.shape_str(shape), "screen")
        if key not in self._sets:
            with span("drawing"):
                dist = timing_dist(self.problem)
                self._sets[key] = [[inp.draw(self.problem, shape, dist, inp.fresh_seed())
                                    for _ in range(n_sets(self.problem, shape, cache_bytes))], 0]
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
    worst = min(checks, key=lambda c: (c.passed, -c.norm_rel_err))
    worst.shape, worst.distribution, worst.seed, worst.seconds = shape, dist, seed, seconds
    return worst


class Rejection(Exception):
    """Ends a verification (or a measurement's check) early with a typed reason."""

    def __init__(self, reason: int, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


def verify(session: Session, key: str, problem: Problem, pool: InputPool) -> Verdict:
    """Every shape x every distribution plus memory's regression inputs, outputs poisoned and compared in
    full, guard bands around every tensor, inputs checked for writes, a second run on the same inputs that
    must agree bit for bit, and a memoisation probe (same buffers, new values; near-duplicate values)."""
    verdict = Verdict(True)
    try:
        for shape in problem.shapes("all"):
            first = None
            for dist in problem.spec.distributions:
                x, ref, seed = pool.get(shape, dist)
                outs = _checked_call(session, key, problem, shape, x, ref, dist, seed, verdict.checks)
                # a copy: the outputs may be the session's shared buffers, written over by the calls between
                first = first or (x, {name: np.array(v) for name, v in outs.items()})
            _same_twice(session, key, problem, shape, *first)
        for reg in pool.regressions:
            shape = problem.parse_shape(reg.shape)
            x, ref, _ = pool.drawn(shape, reg.distribution, reg.seed)
            _checked_call(session, key, problem, shape, x, ref, f"regression:{reg.distribution}", reg.seed,
                          verdict.checks)
        _memo_probe(session, key, problem, pool, verdict.checks)
    except Rejection as r:
        return Verdict(False, r.reason, r.message, verdict.checks)
    except ReferenceFailed as e:
        return Verdict(False, pb.PROBLEM_ERROR, str(e), verdict.checks)
    return verdict


def _checked_call(session, key, problem, shape, x, ref, dist, seed, checks: list) -> dict:
    sname = problem.shape_str(shape)
    try:
        res = session.call(key, shape, x)
    except RunnerFault as e:
        checks.append(pb.Check(shape=sname, distribution=dist, seed=seed, note=str(e)))
        raise Rejection(fault_reason(e), f"{sname}/{dist}: {e}") from e
    reject_tampering(res, sname, dist)
    check = check_outputs(problem, res.outputs, ref, sname, dist, seed, res.seconds)
    checks.append(check)
    if not check.passed:
        raise Rejection(pb.WRONG_RESULT, f"{sname}/{dist}: {check.note}")
    return res.outputs


def reject_tampering(res, sname: str, dist: str) -> None:
    """Raise Rejection when a call wrote outside its outputs (a guard band changed) or wrote an input."""
    if res.out_of_bounds:
        raise Rejection(pb.OUT_OF_BOUNDS, f"{sname}/{dist}: the kernel wrote outside {res.out_of_bounds} "
                                          "(a guard band next to the tensor changed)")
    if res.mutated:
        raise Rejection(pb.INPUT_MUTATED, f"{sname}/{dist}: the kernel wrote input(s) {res.mutated}")


def _same_twice(session, key, problem, shape, x, outs) -> None:
    sname = problem.shape_str(shape)
    try:
        again = session.call(key, shape, x)
    except RunnerFault as e:
        raise Rejection(fault_reason(e), f"{sname} second run: {e}") from e
    reject_tampering(again, sname, "second run")
    with span("comparison"):
        _agree(sname, outs, again.outputs)


def _agree(sname: str, outs: dict, again: dict) -> None:
    for name, out in outs.items():
        if same_bytes(out, again[name]):  # bit for bit (a memcmp); else numpy decides, NaN payloads aside
            continue
        if not np.array_equal(out, again[name], equal_nan=True):
            diff = int(np.count_nonzero(out != again[name]))
            raise Rejection(pb.NOT_DETERMINISTIC,
                            f"{sname}: two runs on the same inputs differ in {diff} elements of {name}")


def _near_duplicate(problem: Problem, x: dict, shape: dict, dist: str) -> dict:
    """x with about 1/64 of each input's elements (all in its second half) redrawn: a cache keyed by a
    sample of the values, or by the first ones, sees the same key."""
    with span("drawing"):
        return _redrawn(problem, x, shape, dist)


def _redrawn(problem: Problem, x: dict, shape: dict, dist: str) -> dict:
    other = inp.draw(problem, shape, dist, inp.fresh_seed())
    rng = np.random.default_rng(inp.fresh_seed())
    out = {}
    for name, a in x.items():
        flat = a.copy().reshape(-1)
        half = flat.size // 2
        idx = rng.choice(np.arange(half, flat.size), size=max(1, flat.size // 64), replace=False)
        flat[idx] = other[name].reshape(-1)[idx]
        out[name] = flat.reshape(a.shape)
    return out


def _memo_probe(session, key, problem: Problem, pool: InputPool, checks: list) -> None:
    """Three calls on the same buffers: inputs A, then unrelated B, then A with a few values changed. A
    kernel that was right on fresh buffers and is wrong here answers from memory of an earlier call."""
    shape = max((s for s in problem.shapes("all") if math.prod(s.values()) <= LARGE_ELEMENTS and
                 math.prod(s.values()) >= 64), key=lambda s: math.prod(s.values()), default=None)
    if shape is None:
        return
    dist = next(iter(problem.spec.distributions))
    a, ref_a, seed_a = pool.drawn(shape, dist, inp.fresh_seed())
    b, ref_b, seed_b = pool.drawn(shape, dist, inp.fresh_seed())
    a2 = _near_duplicate(problem, a, shape, dist)
    with span("references"):
        ref_a2 = run_reference(problem, a2, shape, "memo:near-duplicate")
    steps = [(a, ref_a, seed_a, "memo:first"), (b, ref_b, seed_b, "memo:same-buffers"),
             (a2, ref_a2, seed_a, "memo:near-duplicate")]
    sname = problem.shape_str(shape)
    try:
        results = session.call_sequence(key, shape, [s[0] for s in steps])
    except RunnerFault as e:
        raise Rejection(fault_reason(e), f"{sname}/memo probe: {e}") from e
    for (x, ref, seed, label), res in zip(steps, results):
        reject_tampering(res, sname, label)
        check = check_outputs(problem, res.outputs, ref, sname, label, seed, res.seconds)
        checks.append(check)
        if not check.passed and label == "memo:first":
            raise Rejection(pb.WRONG_RESULT, f"{sname}/{label}: {check.note}")
        if not check.passed:
            raise Rejection(pb.MEMOISED, f"{sname}/{label}: right on fresh buffers, wrong on reused ones "
                                         f"({check.note})")


def n_sets(problem: Problem, shape: dict[str, int], cache_bytes: int, max_sets: int = 256) -> int:
    """How many input sets a rotating timing pool needs to be larger than the cache."""
    return min(max_sets, max(2, math.ceil(cache_bytes / max(set_bytes(problem, shape), 1))))


def timing_dist(problem: Problem) -> str:
    """The distribution timings draw from: normal where the problem declares it."""
    return "normal" if "normal" in problem.spec.distributions else next(iter(problem.spec.distributions))


#: measuring lives in kfactory/judge/measure.py; these of its names stay importable from here, where callers have always
#: found them (resolved on first use: measure.py imports this module)
_MEASURE_NAMES = frozenset({"NO_NOISE_BOUND", "PROBE_MIN_CALLS", "REPEAT_BENCHES", "SOL_SLACK", "Timing",
                            "available_baselines", "measure", "probe_after_timing", "probe_calls", "sol_floor_s"})


def __getattr__(name: str):
    if name in _MEASURE_NAMES:
        from kfactory.judge import measure as _measure
        return getattr(_measure, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

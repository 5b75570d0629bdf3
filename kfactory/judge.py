"""Verification and measurement of one compiled kernel, over a target Session (runner-backed).

Both return typed verdicts; a candidate's crash, hang or wrong answer is a result, never an exception.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kfactory import inputs as inp
from kfactory.compare import compare
from kfactory.problems import Problem
from kfactory.runner import LoadFailed, RunnerCrashed, RunnerFault, RunnerTimeout
from kfactory.stats import summarize
from kfactory.targets import Session
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
    """The typed reason for a runner fault."""
    if isinstance(e, RunnerTimeout):
        return pb.TIMEOUT
    if isinstance(e, (RunnerCrashed, LoadFailed)):
        return pb.CRASHED
    return pb.RUNNER_ERROR


class InputPool:
    """Fresh inputs and their float64 references per (shape, distribution), and timing pools per shape.

    Small sets are drawn anew for every use; a large set (over LARGE_ELEMENTS) is shared by at most `reuse`
    uses before it is drawn again with a fresh seed, because drawing and computing the float64 reference of
    16M elements costs more than the kernel under test. Every draw's seed is recorded in the checks.
    """

    def __init__(self, problem: Problem, reuse: int):
        self.problem, self.reuse = problem, reuse
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
            seed = inp.fresh_seed()
            x = inp.draw(self.problem, shape, dist, seed)
            return x, self.problem.reference.reference(x), seed
        return self._get((self.problem.shape_str(shape), dist), math.prod(shape.values()), make)

    def timing_sets(self, shape: dict[str, int], cache_bytes: int):
        """(rotating input sets larger than the cache, reference outputs of the first set) for timing."""
        def make():
            sets = input_sets(self.problem, shape, cache_bytes)
            return sets, self.problem.reference.reference(sets[0])
        return self._get((self.problem.shape_str(shape), "timing"), math.prod(shape.values()), make)


def _check_outputs(problem: Problem, outputs: dict, ref: dict, shape: str, dist: str, seed: int,
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


def verify(session: Session, key: str, problem: Problem, pool: InputPool) -> Verdict:
    """Every shape x every distribution, outputs poisoned and compared in full, inputs checked for
    writes, and a second run on the first distribution's inputs that must agree bit for bit."""
    verdict = Verdict(True)
    dists = list(problem.spec.distributions)
    for shape in problem.shapes("all"):
        sname = problem.shape_str(shape)
        first = None
        for dist in dists:
            x, ref, seed = pool.get(shape, dist)
            try:
                res = session.call(key, shape, x)
            except RunnerFault as e:
                verdict.checks.append(pb.Check(shape=sname, distribution=dist, seed=seed, note=str(e)))
                return Verdict(False, fault_reason(e), f"{sname}/{dist}: {e}", verdict.checks)
            if res.mutated:
                return Verdict(False, pb.INPUT_MUTATED, f"{sname}/{dist}: the kernel wrote input(s) {res.mutated}",
                               verdict.checks)
            check = _check_outputs(problem, res.outputs, ref, sname, dist, seed, res.seconds)
            verdict.checks.append(check)
            if not check.passed:
                return Verdict(False, pb.WRONG_RESULT, f"{sname}/{dist}: {check.note}", verdict.checks)
            first = first or (x, res.outputs)
        again = _rerun(session, key, shape, first[0])
        if isinstance(again, Verdict):
            again.checks = verdict.checks
            return again
        for name, out in first[1].items():
            if not np.array_equal(out, again[name], equal_nan=True):
                diff = int(np.count_nonzero(out != again[name]))
                return Verdict(False, pb.NOT_DETERMINISTIC,
                               f"{sname}: two runs on the same inputs differ in {diff} elements of {name}",
                               verdict.checks)
    return verdict


def _rerun(session: Session, key: str, shape: dict, x: dict):
    try:
        return session.call(key, shape, x).outputs
    except RunnerFault as e:
        return Verdict(False, fault_reason(e), str(e))


def input_sets(problem: Problem, shape: dict[str, int], cache_bytes: int, dist: str = "normal",
               max_sets: int = 256) -> list[dict]:
    """A rotating pool of fresh input sets larger than the cache, so no timed call runs from a warm cache."""
    per_set = sum(math.prod(problem.tensor_shape(t, shape)) * np.dtype(t.dtype).itemsize
                  for t in problem.spec.inputs + problem.spec.outputs)
    n = min(max_sets, max(2, math.ceil(cache_bytes / max(per_set, 1))))
    dist = dist if dist in problem.spec.distributions else next(iter(problem.spec.distributions))
    return [inp.draw(problem, shape, dist, inp.fresh_seed()) for _ in range(n)]


@dataclass
class Timing:
    """Per key, the summary at one shape, or a typed failure."""
    timings: dict[str, pb.ShapeTiming] = field(default_factory=dict)
    reason: int = pb.REJECT_REASON_UNSPECIFIED
    message: str = ""


def measure(session: Session, keys: list[str], problem: Problem, shape: dict[str, int], pool: InputPool,
            cache_bytes: int, settings, max_s: float | None = None, ceiling_gbps: float = 0.0) -> Timing:
    """Time `keys` interleaved at one shape; the outputs the timed calls left are checked too."""
    sets, ref = pool.timing_sets(shape, cache_bytes)
    sname = problem.shape_str(shape)
    try:
        res = session.bench(keys, shape, sets, min_samples=settings.measure_min_samples,
                            min_s=settings.measure_min_s, max_s=max_s or settings.measure_max_s,
                            noise=settings.measure_noise, warmup_s=0.05)
    except RunnerFault as e:
        return Timing(reason=fault_reason(e), message=f"{sname} timing: {e}")
    nbytes, _ = problem.cost(shape)
    out = Timing()
    for k in keys:
        check = _check_outputs(problem, res.outputs[k][0], ref, sname, "timed", 0, 0.0)
        if not check.passed:
            return Timing(reason=pb.WRONG_RESULT, message=f"{sname}: output of the timed calls is wrong: {check.note}")
        t = summarize(res.samples[k], sname, nbytes, ceiling_gbps)
        t.output_checked = True
        out.timings[k] = t
    return out


def available_baselines(problem: Problem) -> list[str]:
    """The problem's declared baselines that can run here (torch only where it is importable)."""
    have = problem.reference.baselines() if hasattr(problem.reference, "baselines") else {}
    return [b for b in problem.spec.baselines if b in have]

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
from kfactory.targets.shm_args import set_bytes
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
    named = getattr(e, "reason", None)  # a target's fault class may name its reason (cuda: DEVICE_FAULT)
    if isinstance(named, int) and named:
        return named
    if isinstance(e, (RunnerCrashed, LoadFailed)):
        return pb.CRASHED
    return pb.RUNNER_ERROR


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
        x = inp.draw(self.problem, shape, dist, seed)
        return x, self.problem.reference.reference(x), seed

    def timing_sets(self, shape: dict[str, int], cache_bytes: int):
        """(rotating input sets larger than the cache, float64 reference outputs of every set, seeds)."""
        def make():
            seeds = [inp.fresh_seed() for _ in range(n_sets(self.problem, shape, cache_bytes))]
            sets = [inp.draw(self.problem, shape, _timing_dist(self.problem), s) for s in seeds]
            return sets, [self.problem.reference.reference(x) for x in sets], seeds
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


class _Rejected(Exception):
    """Ends a verification early with a verdict (internal to this module)."""

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
                first = first or (x, outs)
            _same_twice(session, key, problem, shape, *first)
        for reg in pool.regressions:
            shape = problem.parse_shape(reg.shape)
            x, ref, _ = pool.drawn(shape, reg.distribution, reg.seed)
            _checked_call(session, key, problem, shape, x, ref, f"regression:{reg.distribution}", reg.seed,
                          verdict.checks)
        _memo_probe(session, key, problem, pool, verdict.checks)
    except _Rejected as r:
        return Verdict(False, r.reason, r.message, verdict.checks)
    return verdict


def _checked_call(session, key, problem, shape, x, ref, dist, seed, checks: list) -> dict:
    sname = problem.shape_str(shape)
    try:
        res = session.call(key, shape, x)
    except RunnerFault as e:
        checks.append(pb.Check(shape=sname, distribution=dist, seed=seed, note=str(e)))
        raise _Rejected(fault_reason(e), f"{sname}/{dist}: {e}") from e
    _screen(res, sname, dist)
    check = _check_outputs(problem, res.outputs, ref, sname, dist, seed, res.seconds)
    checks.append(check)
    if not check.passed:
        raise _Rejected(pb.WRONG_RESULT, f"{sname}/{dist}: {check.note}")
    return res.outputs


def _screen(res, sname: str, dist: str) -> None:
    if res.out_of_bounds:
        raise _Rejected(pb.OUT_OF_BOUNDS, f"{sname}/{dist}: the kernel wrote outside {res.out_of_bounds} "
                                          "(a guard band next to the tensor changed)")
    if res.mutated:
        raise _Rejected(pb.INPUT_MUTATED, f"{sname}/{dist}: the kernel wrote input(s) {res.mutated}")


def _same_twice(session, key, problem, shape, x, outs) -> None:
    sname = problem.shape_str(shape)
    try:
        again = session.call(key, shape, x)
    except RunnerFault as e:
        raise _Rejected(fault_reason(e), f"{sname} second run: {e}") from e
    _screen(again, sname, "second run")
    for name, out in outs.items():
        if not np.array_equal(out, again.outputs[name], equal_nan=True):
            diff = int(np.count_nonzero(out != again.outputs[name]))
            raise _Rejected(pb.NOT_DETERMINISTIC,
                            f"{sname}: two runs on the same inputs differ in {diff} elements of {name}")


def _near_duplicate(problem: Problem, x: dict, shape: dict, dist: str) -> dict:
    """x with about 1/64 of each input's elements (all in its second half) redrawn: a cache keyed by a
    sample of the values, or by the first ones, sees the same key."""
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
    steps = [(a, ref_a, seed_a, "memo:first"), (b, ref_b, seed_b, "memo:same-buffers"),
             (a2, problem.reference.reference(a2), seed_a, "memo:near-duplicate")]
    sname = problem.shape_str(shape)
    try:
        results = session.call_sequence(key, shape, [s[0] for s in steps])
    except RunnerFault as e:
        raise _Rejected(fault_reason(e), f"{sname}/memo probe: {e}") from e
    for (x, ref, seed, label), res in zip(steps, results):
        _screen(res, sname, label)
        check = _check_outputs(problem, res.outputs, ref, sname, label, seed, res.seconds)
        checks.append(check)
        if not check.passed and label == "memo:first":
            raise _Rejected(pb.WRONG_RESULT, f"{sname}/{label}: {check.note}")
        if not check.passed:
            raise _Rejected(pb.MEMOISED, f"{sname}/{label}: right on fresh buffers, wrong on reused ones "
                                         f"({check.note})")


def n_sets(problem: Problem, shape: dict[str, int], cache_bytes: int, max_sets: int = 256) -> int:
    """How many input sets a rotating timing pool needs to be larger than the cache."""
    return min(max_sets, max(2, math.ceil(cache_bytes / max(set_bytes(problem, shape), 1))))


def _timing_dist(problem: Problem) -> str:
    return "normal" if "normal" in problem.spec.distributions else next(iter(problem.spec.distributions))


#: a time under (bytes / bandwidth or flops / peak, whichever is larger) / SOL_SLACK is not believed: the
#: ceilings are measured with simple probes a good kernel can beat a little, never by this much
SOL_SLACK = 2.0


def sol_floor_s(problem: Problem, shape: dict[str, int], device: pb.DeviceInfo | None) -> float:
    """The speed-of-light floor in seconds at a shape on a device (0 when no ceiling is known)."""
    if device is None:
        return 0.0
    nbytes, flops = problem.cost(shape)
    times = [nbytes / (device.mem_bandwidth_gbps * 1e9) if device.mem_bandwidth_gbps else 0.0,
             flops / (device.peak_gflops * 1e9) if device.peak_gflops else 0.0]
    return max(times) / SOL_SLACK


@dataclass
class Timing:
    """Per key, the summary at one shape, or a typed failure."""
    timings: dict[str, pb.ShapeTiming] = field(default_factory=dict)
    reason: int = pb.REJECT_REASON_UNSPECIFIED
    message: str = ""
    failed_key: str = ""
    #: the timing set whose output was wrong (a regression input for memory)
    failed_input: RegressionInput | None = None


def measure(session: Session, keys: list[str], problem: Problem, shape: dict[str, int], pool: InputPool,
            cache_bytes: int, settings, max_s: float | None = None, device: pb.DeviceInfo | None = None) -> Timing:
    """Time `keys` interleaved at one shape. A median under the speed-of-light floor is a failure, and the
    outputs that the timed calls left in every input set of the pool are checked."""
    sets, refs, seeds = pool.timing_sets(shape, cache_bytes)
    sname = problem.shape_str(shape)
    try:
        res = session.bench(keys, shape, sets, min_samples=settings.measure_min_samples,
                            min_s=settings.measure_min_s, max_s=max_s or settings.measure_max_s,
                            noise=settings.measure_noise, warmup_s=0.05)
    except RunnerFault as e:
        return Timing(reason=fault_reason(e), message=f"{sname} timing: {e}")
    nbytes, _ = problem.cost(shape)
    floor = sol_floor_s(problem, shape, device)
    overhead = session.call_overhead_s() if floor else 0.0
    ceiling = device.mem_bandwidth_gbps if device is not None else 0.0
    out = Timing()
    for k in keys:
        t = summarize(res.samples[k], sname, nbytes, ceiling)
        if t.median_s - overhead < floor:
            return Timing(reason=pb.TOO_FAST_TO_BE_TRUE, failed_key=k,
                          message=f"{sname}: median {t.median_s * 1e6:.1f} us less {overhead * 1e6:.1f} us for an "
                                  f"empty call is under the speed-of-light floor {floor * 1e6:.1f} us "
                                  f"(bytes/bandwidth, flops/peak over {SOL_SLACK:g})")
        for i, outs in enumerate(res.outputs[k]):
            check = _check_outputs(problem, outs, refs[i], sname, "timed", seeds[i], 0.0)
            if not check.passed:
                return Timing(reason=pb.WRONG_RESULT, failed_key=k,
                              failed_input=RegressionInput(sname, _timing_dist(problem), seeds[i]),
                              message=f"{sname}: output of the timed calls (set {i}) is wrong: {check.note}")
        t.output_checked = True
        t.mode = res.mode
        if k in res.telemetry:
            t.telemetry.CopyFrom(res.telemetry[k])
        out.timings[k] = t
    return out


def available_baselines(problem: Problem, target: str = "cpu") -> list[str]:
    """The problem's declared baselines that can run here on a target (reference.py's `baselines()` for the
    cpu, `cuda_baselines()` for cuda; torch only where it is importable)."""
    fn = getattr(problem.reference, "cuda_baselines" if target == "cuda" else "baselines", None)
    have = fn() if fn else {}
    return [b for b in problem.spec.baselines if b in have]

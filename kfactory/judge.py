"""Verification and measurement of one compiled kernel, over a target Session (runner-backed).

Both return typed verdicts; a candidate's crash, hang or wrong answer is a result, never an exception.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from kfactory import inputs as inp
from kfactory.compare import compare
from kfactory.problems import Problem
from kfactory.problems.check import ReferenceFailed, run_reference
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
        return x, run_reference(self.problem, x, shape, dist), seed

    def probe_set(self, shape: dict[str, int]):
        """(inputs, float64 reference outputs, seed) for the check after a timing (see measure): drawn from the
        timing distribution but never one of the timing sets, shared like get()'s large sets."""
        def make():
            return self.drawn(shape, _timing_dist(self.problem), inp.fresh_seed())
        return self._get((self.problem.shape_str(shape), "probe"), math.prod(shape.values()), make)

    def timing_sets(self, shape: dict[str, int], cache_bytes: int):
        """(rotating input sets larger than the cache, float64 reference outputs of every set, seeds)."""
        def make():
            seeds = [inp.fresh_seed() for _ in range(n_sets(self.problem, shape, cache_bytes))]
            sets = [inp.draw(self.problem, shape, _timing_dist(self.problem), s) for s in seeds]
            dist = _timing_dist(self.problem)
            return sets, [run_reference(self.problem, x, shape, dist) for x in sets], seeds
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
    except ReferenceFailed as e:
        return Verdict(False, pb.PROBLEM_ERROR, str(e), verdict.checks)
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
             (a2, run_reference(problem, a2, shape, "memo:near-duplicate"), seed_a, "memo:near-duplicate")]
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
            cache_bytes: int, settings, max_s: float | None = None, device: pb.DeviceInfo | None = None,
            probe: list[str] | None = None) -> Timing:
    """Time `keys` interleaved at one shape. A median under the speed-of-light floor is a failure, and the
    outputs that the timed calls left in every input set of the pool are checked. Then every key of `probe`
    (default: every key; a caller may leave out kernels it trusts, such as the problem's baselines) is checked
    once more, on fresh inputs, after more calls than the timing made (probe_after_timing): that check does
    not depend on how many calls a loaded host let the timing make. A session that runs nothing (replay) has
    no kernel to probe."""
    try:
        sets, refs, seeds = pool.timing_sets(shape, cache_bytes)
    except ReferenceFailed as e:
        return Timing(reason=pb.PROBLEM_ERROR, message=str(e))
    sname = problem.shape_str(shape)
    probed = list(keys if probe is None else probe) if _runs_kernels(session) else []
    # the timing, the speed-of-light overhead (a load and a bench), the loads after a replacement, and per
    # probed key its repeat benches and its checked call: all in one runner child, whose kernels' state (a
    # call counter) is what the probe is about
    _hold_runner(session, 3 + len(keys) + len(probed) * (REPEAT_BENCHES + 1))
    try:
        res = session.bench(keys, shape, sets, min_samples=settings.measure_min_samples,
                            min_s=settings.measure_min_s, max_s=max_s or settings.measure_max_s,
                            noise=settings.measure_noise, warmup_s=0.05)
    except RunnerFault as e:
        return Timing(reason=fault_reason(e), message=f"{sname} timing: {e}")
    nbytes, _ = problem.cost(shape)
    floor = sol_floor_s(problem, shape, device)
    # NOTE the floor check still leans on the host's load: the empty call's cost is measured once, alone, but
    # on a loaded host an empty call timed beside an OpenMP kernel takes tens of microseconds (8-66 us against
    # 1.7 us alone on two busy cores), which hides a skipped call wherever the floor is that small (softmax
    # 1x50257: 14 us). Measuring the empty call inside the same interleaved timing would fix it (a session's
    # work); the probe below cannot, as its checked call is poisoned and so looks checked
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
    for k in probed:
        failed = probe_after_timing(session, k, problem, shape, pool, len(res.samples[k]), out.timings[k].median_s)
        if failed is not None:
            return failed
    return out


#: repeat benches a probe may need before its calls are made (each one twice as long as the one before)
REPEAT_BENCHES = 4

#: the fewest calls between a timing's last timed call and its probe's checked call, whatever the host's load
PROBE_MIN_CALLS = 128


def probe_calls(timed_calls: int) -> int:
    """How many calls the probe makes between the timing and its checked call: the timing's own count (but at
    least PROBE_MIN_CALLS), plus a random extra of up to half of that, drawn from fresh entropy for every
    probe. Neither part is known to the kernel in advance: the timing's count depends on the host's load, the
    extra on nothing it can see."""
    base = max(timed_calls, PROBE_MIN_CALLS)
    return base + secrets.randbelow(base // 2 + 1)


def probe_after_timing(session: Session, key: str, problem: Problem, shape: dict[str, int], pool: InputPool,
                       timed_calls: int, median_s: float) -> Timing | None:
    """The check after a timing of `timed_calls` calls of kernel `key` at `shape`: probe_calls(timed_calls)
    unchecked calls at the problem's smallest shape, then one call at `shape` on fresh inputs (pool.probe_set,
    never a timing set) into fresh buffers with the outputs poisoned, checked in full against the float64
    reference as verify checks. None when it passed.

    Why: the timed calls' own outputs cannot show a kernel that stops writing, since the buffers of a timing
    set still hold the right answer of an earlier honest call on the same inputs; and how many calls the
    timing made depends on the host's load. The checked call comes after every timed call and is the first
    call at `shape` since the timing (unless `shape` is the problem's smallest), so a kernel whose cheating,
    once begun, goes on (a call counter past its threshold, counting all its calls or only those at this
    shape) is wrong at the check whenever any timed call cheated, however few calls the timing made. The
    calls in between, at least as many as the timing made and never fewer than PROBE_MIN_CALLS, reach
    further: a kernel counting its calls that would set off within that many calls after the timing is
    caught too, whatever the load. They are made at the smallest shape because they cost microseconds there,
    where at the largest shape as many calls again would double the measurement; a kernel counting only its
    calls at the largest shape and setting off after the timing escapes, as it escapes any judge that makes
    fewer calls than its threshold, but then every timed call was honest.

    What it cannot see: a kernel that tells this call from a timed one (fresh buffers, a poisoned output) and
    computes only then; the speed-of-light floor is the check for that (see measure)."""
    sname = problem.shape_str(shape)
    calls = probe_calls(timed_calls)
    smallest = min(problem.shapes("all"), key=lambda s: math.prod(s.values()))
    try:
        made = _repeat_calls(session, key, smallest, _unchecked_sets(problem, smallest), calls, median_s)
        if made < calls:
            return Timing(reason=pb.TIMEOUT, failed_key=key,
                          message=f"{sname}: after the timing the kernel made only {made} of {calls} calls at "
                                  f"{problem.shape_str(smallest)} in the time given (its timing's median was "
                                  f"{median_s * 1e6:.1f} us a call)")
        x, ref, seed = pool.probe_set(shape)
        res = session.call(key, shape, x)
    except RunnerFault as e:
        return Timing(reason=fault_reason(e), failed_key=key, message=f"{sname} after the timing: {e}")
    label = f"after {timed_calls} timed and {made} further calls"
    try:
        _screen(res, sname, label)
    except _Rejected as r:
        return Timing(reason=r.reason, failed_key=key, message=r.message)
    check = _check_outputs(problem, res.outputs, ref, sname, "after-timing", seed, res.seconds)
    if not check.passed:
        return Timing(reason=pb.WRONG_RESULT, failed_key=key,
                      message=f"{sname}: the output {label} (fresh inputs, outputs poisoned) is wrong: "
                              f"{check.note}")
    return None


def _unchecked_sets(problem: Problem, shape: dict[str, int]) -> list[dict]:
    """Two input sets for calls whose outputs nobody reads (no reference computed)."""
    return [inp.draw(problem, shape, _timing_dist(problem), inp.fresh_seed()) for _ in range(2)]


def _repeat_calls(session: Session, key: str, shape: dict[str, int], sets: list, calls: int,
                  median_s: float) -> int:
    """Make at least `calls` calls of `key` at `shape`: the timed samples of benches with no warm-up time, no
    time floor and no noise bound, so each stops at its sample count. Each bench is given time for its calls
    at 8x `median_s` (a call's time at the timed shape, which a call at `shape` does not exceed), at least
    1 s and at most 30 s (so a kernel that hangs here is killed in bounded time), and twice that on a repeat:
    a loaded host slows the calls, it does not cut their count. The calls made (a bench's warm-up rounds are
    not counted, so it is a floor)."""
    made = 0
    budget_s = min(30.0, max(1.0, 8.0 * calls * median_s))
    for _ in range(REPEAT_BENCHES):
        if made >= calls:
            break
        res = session.bench([key], shape, sets, min_samples=calls - made, min_s=0.0, max_s=budget_s,
                            noise=NO_NOISE_BOUND, warmup_s=0.0)
        made += len(res.samples[key])
        budget_s *= 2
    return made


#: a noise bound every sample set meets (a repeat bench stops at its sample count, not at a spread)
NO_NOISE_BOUND = 1e9


def _runs_kernels(session: Session) -> bool:
    """False for a session with no runner (replay answers from a recording): no kernel runs, none is probed."""
    return getattr(session, "runner", None) is not None


def _hold_runner(session: Session, requests: int) -> None:
    """Have the next `requests` requests answered by one runner child (kfactory.runner.Runner.reserve), so a
    routine replacement after runner_max_runs cannot fall between a timing and its probe and start the
    kernel afresh."""
    reserve = getattr(getattr(session, "runner", None), "reserve", None)
    if reserve is not None:
        reserve(requests)


def available_baselines(problem: Problem, target: str = "cpu") -> list[str]:
    """The problem's declared baselines that can run here on a target (reference.py's `baselines()` for the
    cpu, `cuda_baselines()` for cuda, each given the problem's params; torch only where it is importable)."""
    fn = getattr(problem.reference, "cuda_baselines" if target == "cuda" else "baselines", None)
    have = fn(**problem.params) if fn else {}
    return [b for b in problem.spec.baselines if b in have]

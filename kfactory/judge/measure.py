"""Measurement of compiled kernels over a target Session: interleaved timing at a shape, the speed-of-light floor,
the check of every timed call's outputs and the check after a timing (probe_after_timing).

Split from kfactory/judge/verify.py (verification); the pools, checks and typed reasons both use are in
kfactory/judge/checks.py.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from kfactory.judge import counter_rng
from kfactory.judge import inputs as inp
from kfactory.judge.checks import (InputPool, RegressionInput, Rejection, check_outputs, device_checks, fault_reason,
                                   n_sets, reject_tampering, timed_on_device, timing_dist)
from kfactory.observability.stagetime import span
from kfactory.problems import Problem
from kfactory.problems.check import ReferenceFailed
from kfactory.sandbox.parent import RunnerFault
from kfactory.judge.stats import summarize
from kfactory.targets import Session
from kfactory.targets.base import CallResult
from kfactory.v1 import events_pb2 as pb

#: a time under (bytes / bandwidth or flops / peak, whichever is larger) / SOL_SLACK is not believed: the
#: ceilings are measured with simple probes a good kernel can beat a little, never by this much
SOL_SLACK = 2.0


def sol_floor_s(problem: Problem, shape: dict[str, int], device: pb.DeviceInfo | None) -> float:
    """The speed-of-light floor in seconds at a shape on a device (0 when no ceiling is known); its bandwidth is
    floor_bandwidth_gbps's."""
    if device is None:
        return 0.0
    nbytes, flops = problem.cost(shape)
    bandwidth = floor_bandwidth_gbps(problem, shape, device)
    times = [nbytes / (bandwidth * 1e9) if bandwidth else 0.0,
             flops / (device.peak_gflops * 1e9) if device.peak_gflops else 0.0]
    return max(times) / SOL_SLACK


def floor_bandwidth_gbps(problem: Problem, shape: dict[str, int], device: pb.DeviceInfo) -> float:
    """The bandwidth a problem's bytes are set against at a shape, weighted by the share w of its tensors' bytes
    that are outputs. The copy probe reads and writes equal bytes, so with the read-only figure it prices a
    written byte at 2/copy - 1/read seconds: a kernel takes at least (1 - w)/read + w (2/copy - 1/read) seconds a
    byte. That is the copy figure at w = 1/2 (softmax, a norm: their floors are as before) and the read figure
    at w = 0 (a decode step's attention reads its KV cache and writes one vector a head: on the copy figure alone
    an honest one could be called too fast where a read stream outruns a copy by more than SOL_SLACK). Never
    below the copy figure, so no floor rises; the copy figure alone where no read figure is known (0)."""
    copy, read = device.mem_bandwidth_gbps, device.read_bandwidth_gbps
    if not copy or not read:
        return copy
    size = {t.name: int(math.prod(problem.tensor_shape(t, shape))) * np.dtype(t.dtype).itemsize
            for t in problem.spec.inputs + problem.spec.outputs}
    total = sum(size.values())
    w = sum(size[t.name] for t in problem.spec.outputs) / total if total else 0.5
    per_byte = (1 - w) / read + w * (2 / copy - 1 / read)
    return max(copy, 1 / per_byte) if per_byte > 0 else max(copy, read)


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
            probe: list[str] | None = None, timed_before: dict[str, int] | None = None) -> Timing:
    """Time `keys` interleaved at one shape. A median under the speed-of-light floor is a failure, and the
    outputs that the timed calls left in every input set of the pool are checked. Then every key of `probe`
    (default: every key; a caller may leave out kernels it trusts, such as the problem's baselines) is checked
    once more, on fresh inputs, after more calls than the timing made (probe_after_timing): that check does
    not depend on how many calls a loaded host let the timing make. A session that runs nothing (replay) has
    no kernel to probe. `timed_before`: per key, the calls earlier timings made since the probe before them (the
    probe then makes more calls than all of them did; see kfactory.judge.rotated)."""
    drawn = _drawn_timing(session, problem, shape, cache_bytes, len(keys))
    sets: list = []
    refs: list = []
    if drawn is None:
        try:
            sets, refs, seeds = pool.timing_sets(shape, cache_bytes)
        except ReferenceFailed as e:
            return Timing(reason=pb.PROBLEM_ERROR, message=str(e))
        # the pool holds enough sets for one kernel alone; interleaved, each needs a share (n_sets)
        used = n_sets(problem, shape, cache_bytes, kernels=len(keys))
        sets, refs, seeds = sets[:used], refs[:used], seeds[:used]
    else:
        seeds = drawn[1]
    sname = problem.shape_str(shape)
    probed = list(keys if probe is None else probe) if runs_kernels(session) else []
    # the timing, the speed-of-light overhead (a load and a bench), the loads after a replacement, and per
    # probed key its repeat benches and its checked call: all in one runner child, whose kernels' state (a
    # call counter) is what the probe is about
    hold_runner(session, 3 + len(keys) + len(probed) * (REPEAT_BENCHES + 1))
    timing = dict(min_samples=settings.measure_min_samples, min_s=settings.measure_min_s,
                  max_s=max_s or settings.measure_max_s, noise=settings.measure_noise, warmup_s=0.05,
                  precision=settings.measure_precision)
    try:
        res = (session.bench(keys, shape, sets, **timing) if drawn is None else
               session.bench_drawn(keys, shape, drawn[0], seeds, **timing))
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
    # the fraction of the bandwidth this problem's kernels can reach: the floor's (the copy figure for softmax,
    # the read figure for a kernel that only reads)
    ceiling = floor_bandwidth_gbps(problem, shape, device) if device is not None else 0.0
    out = Timing()
    for k in keys:
        t = summarize(res.samples[k], sname, nbytes, ceiling)
        if t.median_s - overhead < floor:
            return Timing(reason=pb.TOO_FAST_TO_BE_TRUE, failed_key=k,
                          message=f"{sname}: median {t.median_s * 1e6:.1f} us less {overhead * 1e6:.1f} us for an "
                                  f"empty call is under the speed-of-light floor {floor * 1e6:.1f} us "
                                  f"(bytes/bandwidth, flops/peak over {SOL_SLACK:g})")
        wrong = _timed_outputs(problem, res, k, sname, refs, seeds, None if drawn is None else drawn[0])
        if wrong is not None:
            return wrong
        t.output_checked = True
        t.mode = res.mode
        if k in res.telemetry:
            t.telemetry.CopyFrom(res.telemetry[k])
        out.timings[k] = t
    for k in probed:
        timed = len(res.samples[k]) + (timed_before or {}).get(k, 0)
        failed = probe_after_timing(session, k, problem, shape, pool, timed, out.timings[k].median_s)
        if failed is not None:
            return failed
    return out


def drawn_ahead(session: Session, problem: Problem, shapes: list[dict[str, int]], pool: InputPool,
                cache_bytes: int, kernels: int = 1) -> InputPool:
    """The pool a measurement of `kernels` kernels at `shapes` on `session` takes its sets from, with the timing
    sets and the checked call's set after the timing that it would draw on the host drawn now
    (InputPool.serving), and the session's buffers for those timings made (Session.ready_buffers): called
    before the device is held, so that neither drawing the sets and computing their float64 references nor
    allocating their buffers holds the device. Fresh seeds as measure draws itself, recorded as before."""
    ahead: dict = {}
    benches = [(shape, kernels, n_sets(problem, shape, cache_bytes, kernels=kernels)) for shape in shapes
               if not timed_on_device(session, problem, shape)]
    try:
        for shape, _, _ in benches:
            pool.ahead_timing(ahead, shape, cache_bytes)
            if runs_kernels(session):
                pool.ahead_probe(ahead, shape)
    except ReferenceFailed:
        pass  # the problem's reference failed: measure meets it again at that set and gives its typed failure
    else:  # (no arena grown for timings that will not run: a ring's arenas never shrink)
        session.ready_buffers(benches)   # one growth, to the largest: a shape at a time regrew for each larger one
    return pool.serving(ahead)


def _drawn_timing(session: Session, problem: Problem, shape: dict[str, int],
                  cache_bytes: int, kernels: int) -> tuple[str, list[int]] | None:
    """(distribution, a fresh seed per timing set of each of `kernels` kernels timed interleaved) when the
    session's device draws and checks the timing sets itself (checks.timed_on_device: judged_on_device,
    verification's rule too), else None: the pool's sets, drawn and referenced on the host."""
    if not timed_on_device(session, problem, shape):
        return None
    return timing_dist(problem), [inp.fresh_seed() for _ in range(n_sets(problem, shape, cache_bytes, kernels=kernels))]


def _timed_outputs(problem: Problem, res, key: str, sname: str, refs: list, seeds: list[int],
                   drawn: str | None) -> Timing | None:
    """A WRONG_RESULT Timing when an output the timed calls of `key` left in some set is wrong (against its host
    reference, or by the figures its device compared when the sets were drawn there from distribution
    `drawn`), naming the set's seed as a regression input; INPUT_MUTATED when they wrote into a set the device
    drew; None when all are right."""
    per_set = res.outputs[key] if drawn is None else res.figures[key]
    label = timing_dist(problem) if drawn is None else counter_rng.PREFIX + drawn
    for i, written in enumerate(res.mutated.get(key, []) if drawn is not None else []):
        if any(written.values()):   # (on the host, a written input shows as a wrong output against its reference)
            names = sorted(n for n, count in written.items() if count)
            return Timing(reason=pb.INPUT_MUTATED, failed_key=key,
                          message=f"{sname}: the timed calls wrote into input {', '.join(names)} (set {i})")
    for i, outs in enumerate(per_set):
        check = (check_outputs(problem, outs, refs[i], sname, "timed", seeds[i], 0.0) if drawn is None
                 else device_checks(problem, outs, sname, label, seeds[i], 0.0))
        if not check.passed:
            return Timing(reason=pb.WRONG_RESULT, failed_key=key, failed_input=RegressionInput(sname, label, seeds[i]),
                          message=f"{sname}: output of the timed calls (set {i}) is wrong: {check.note}")
    return None


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
    never a timing set; drawn on the device from a fresh seed where it judges the shape, _probe_call) into
    fresh buffers with the outputs poisoned, checked in full against the float64 reference as verify checks.
    None when it passed.

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
        res, check = _probe_call(session, key, problem, shape, pool)
    except RunnerFault as e:
        return Timing(reason=fault_reason(e), failed_key=key, message=f"{sname} after the timing: {e}")
    label = f"after {timed_calls} timed and {made} further calls"
    try:
        reject_tampering(res, sname, label)
    except Rejection as r:
        return Timing(reason=r.reason, failed_key=key, message=r.message)
    if not check.passed:
        # no regression input: the kernel's call count exposed it, not an input another kernel would get wrong
        return Timing(reason=pb.WRONG_RESULT, failed_key=key,
                      message=f"{sname}: the output {label} (fresh inputs, outputs poisoned) is wrong: "
                              f"{check.note}")
    return None


def _probe_call(session: Session, key: str, problem: Problem, shape: dict[str, int],
                pool: InputPool) -> tuple[CallResult, pb.Check]:
    """The probe's checked call: (its result for the tampering checks, its check). Where the session's device
    judges the shape (checks.timed_on_device: drawn_ahead's rule for the probe set), the inputs are drawn there
    from a fresh seed into fresh buffers and compared there (labelled "device:DIST"); else the pool's probe set,
    checked on the host."""
    sname, dist = problem.shape_str(shape), timing_dist(problem)
    if timed_on_device(session, problem, shape):
        seed = inp.fresh_seed()
        got = session.device_check(key, shape, dist, seed, runs=1)
        label = counter_rng.PREFIX + dist
        written = sorted(name for name, count in got.mutated.items() if count)
        check = device_checks(problem, got.figures[0], sname, label, seed, got.seconds[0])
        return CallResult({}, got.seconds[0], written, got.out_of_bounds), check
    x, ref, seed = pool.probe_set(shape)
    res = session.call(key, shape, x)
    return res, check_outputs(problem, res.outputs, ref, sname, "after-timing", seed, res.seconds)


def _unchecked_sets(problem: Problem, shape: dict[str, int]) -> list[dict]:
    """Two input sets for calls whose outputs nobody reads (no reference computed)."""
    with span("drawing"):
        return [inp.draw(problem, shape, timing_dist(problem), inp.fresh_seed()) for _ in range(2)]


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


def runs_kernels(session: Session) -> bool:
    """False for a session with no runner (replay answers from a recording): no kernel runs, none is probed."""
    return getattr(session, "runner", None) is not None


def hold_runner(session: Session, requests: int) -> None:
    """Have the next `requests` requests answered by one runner child (kfactory.sandbox.parent.Runner.reserve), so a
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

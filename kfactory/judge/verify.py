"""Verification and measurement of one compiled kernel, over a target Session (runner-backed).

Both return typed verdicts; a candidate's crash, hang or wrong answer is a result, never an exception. Only the
candidate's own faults (RunnerFault) become verdicts: a failure of the harness (kfactory.sandbox.parent.HarnessError)
or any other exception propagates to the service, which records it as its own error, never as the candidate's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.judge import counter_rng
from kfactory.judge.checks import (InputPool, Rejection, check_outputs, device_checks, fault_reason,
                                   judged_on_device, reject_tampering)
from kfactory.judge.memo import memo_key, memo_probe, memo_sets, memo_shape
from kfactory.judge.numerics import differing_elements, same_bytes
from kfactory.observability.stagetime import span
from kfactory.problems import Problem
from kfactory.problems.check import ReferenceFailed
from kfactory.sandbox.parent import RunnerFault
from kfactory.targets import Session
from kfactory.targets.base import CallResult
from kfactory.v1 import events_pb2 as pb


@dataclass
class Verdict:
    """passed, or the typed reason with a message; every check's figures either way."""
    passed: bool
    reason: int = pb.REJECT_REASON_UNSPECIFIED
    message: str = ""
    checks: list[pb.Check] = field(default_factory=list)


def verify(session: Session, key: str, problem: Problem, pool: InputPool) -> Verdict:
    """Every shape x every distribution plus memory's regression inputs, outputs poisoned and compared in
    full, guard bands around every tensor, inputs checked for writes, a second run on the same inputs that
    must give the same values (a NaN for a NaN, -0 for 0), and a memoisation probe (same buffers, new values;
    near-duplicate values)."""
    verdict = Verdict(True)
    try:
        for shape in problem.shapes("all"):
            first = None
            for dist in problem.spec.distributions:
                if judged_on_device(session, shape, dist):
                    _device_checked(session, key, problem, shape, dist, verdict.checks)
                    continue
                x, ref, seed = pool.get(shape, dist)
                outs = _checked_call(session, key, problem, shape, x, ref, dist, seed, verdict.checks)
                # a copy: the outputs may be the session's shared buffers, written over by the calls between
                first = first or (x, {name: np.array(v) for name, v in outs.items()})
            if first is not None:   # else every check of the shape ran twice on its device (_device_checked)
                _same_twice(session, key, problem, shape, *first)
        for reg in pool.regressions:
            shape = problem.parse_shape(reg.shape)
            if _regression_on_device(session, shape, reg):
                drawn_on = reg.distribution.removeprefix(counter_rng.PREFIX)
                # drawn on a device: drawn there again, bit for bit, instead of by the host twin (and a large
                # shape's float64 reference on the host)
                _device_checked(session, key, problem, shape, drawn_on, verdict.checks, reg.seed,
                                f"regression:{reg.distribution}")
                continue
            x, ref, _ = pool.regression_set(reg)
            _checked_call(session, key, problem, shape, x, ref, f"regression:{reg.distribution}", reg.seed,
                          verdict.checks)
        memo_probe(session, key, problem, pool, verdict.checks)
    except Rejection as r:
        return Verdict(False, r.reason, r.message, verdict.checks)
    except ReferenceFailed as e:
        return Verdict(False, pb.PROBLEM_ERROR, str(e), verdict.checks)
    return verdict


def drawn_ahead(session: Session, problem: Problem, pool: InputPool) -> InputPool:
    """The pool a verification on `session` takes its sets from, with every set it would draw on the host drawn
    now (InputPool.serving): called before the device is held, so that drawing inputs and computing their float64
    references never holds the device. The sets are the same kind verify draws itself, with fresh seeds it
    records in its checks as before."""
    ahead: dict = {}
    try:
        for shape in problem.shapes("all"):
            for dist in problem.spec.distributions:
                if not judged_on_device(session, shape, dist):
                    pool.ahead_check(ahead, shape, dist)
        for reg in pool.regressions:
            if not _regression_on_device(session, problem.parse_shape(reg.shape), reg):
                pool.ahead_regression(ahead, reg)
        if (memo_at := memo_shape(problem)) is not None:
            pool.ahead_own(ahead, memo_key(problem, memo_at), lambda: memo_sets(problem, pool, memo_at))
    except ReferenceFailed:
        pass  # the problem's reference failed: verify meets it again at that set and gives its typed verdict
    return pool.serving(ahead)


def _regression_on_device(session, shape: dict[str, int], reg) -> bool:
    """Whether a regression input is drawn again where the kernel runs: one a device drew (labelled device:DIST),
    where this session's device judges its shape."""
    drawn_on = reg.distribution.removeprefix(counter_rng.PREFIX)
    return drawn_on != reg.distribution and judged_on_device(session, shape, drawn_on)


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


def _device_checked(session, key, problem: Problem, shape: dict[str, int], dist: str, checks: list,
                    seed: int | None = None, label: str | None = None) -> None:
    """One check judged on the device from `seed` (default: a fresh one): two runs on the same inputs, each
    compared with the float64 reference there, then compared with each other by value; the inputs drawn
    again and compared with what the kernel left; guard bands checked. The check is labelled "device:DIST"
    (default) so that a failing input is drawn again on any host by the generator's twin
    (kfactory.judge.counter_rng)."""
    sname = problem.shape_str(shape)
    label = label or counter_rng.PREFIX + dist
    seed = inp.fresh_seed() if seed is None else seed
    try:
        res = session.device_check(key, shape, dist, seed, runs=2)
    except RunnerFault as e:
        checks.append(pb.Check(shape=sname, distribution=label, seed=seed, note=str(e)))
        raise Rejection(fault_reason(e), f"{sname}/{label}: {e}") from e
    written = sorted(name for name, count in res.mutated.items() if count)
    reject_tampering(CallResult({}, 0.0, written, res.out_of_bounds), sname, label)
    for run, figures in enumerate(res.figures):
        check = device_checks(problem, figures, sname, label, seed, res.seconds[run])
        checks.append(check)
        if not check.passed:
            raise Rejection(pb.WRONG_RESULT, f"{sname}/{label}{' second run' if run else ''}: {check.note}")
    for later in res.differ:
        for name, count in later.items():
            if count:
                raise Rejection(pb.NOT_DETERMINISTIC,
                                f"{sname}: two runs on the same inputs differ in {count} elements of {name}")


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
        diff = differing_elements(out, again[name])
        if diff:
            raise Rejection(pb.NOT_DETERMINISTIC,
                            f"{sname}: two runs on the same inputs differ in {diff} elements of {name}")

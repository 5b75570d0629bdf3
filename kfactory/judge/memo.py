"""The memoisation probe: one kernel called on the SAME buffers with inputs A, then unrelated B, then A with a
few values changed. A kernel right on fresh buffers and wrong here answers, where it is wrong, with an earlier
call's answer (MEMOISED); or gives a different answer when the same calls run again (NOT_DETERMINISTIC: a race
that first showed here); or is wrong on the same inputs on fresh buffers too (WRONG_RESULT); or else depends on
the calls before it (MEMOISED). The probe tells these apart before it names one."""
from __future__ import annotations

import math

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.judge.checks import LARGE_ELEMENTS, InputPool, Rejection, check_outputs, fault_reason, reject_tampering
from kfactory.judge.numerics import differing_elements, outside_tolerance
from kfactory.observability.stagetime import span
from kfactory.problems import Problem
from kfactory.problems.check import run_reference
from kfactory.sandbox.parent import RunnerFault
from kfactory.sandbox.shm_args import same_bits
from kfactory.v1 import events_pb2 as pb


def memo_shape(problem: Problem) -> dict[str, int] | None:
    """The shape the probe runs at: the largest of the problem's shapes that is not large (checks.LARGE_ELEMENTS)
    and has at least 64 elements; None when there is none."""
    return max((s for s in problem.shapes("all") if math.prod(s.values()) <= LARGE_ELEMENTS and
                math.prod(s.values()) >= 64), key=lambda s: math.prod(s.values()), default=None)


def memo_key(problem: Problem, shape: dict[str, int]) -> tuple:
    """The key of the probe's sets in an input pool (InputPool.own, ahead_own)."""
    return problem.shape_str(shape), "memo"


def memo_sets(problem: Problem, pool: InputPool, shape: dict[str, int]) -> list[tuple]:
    """The probe's three steps (inputs, float64 reference, seed, label): A, an unrelated B, then A with a few
    values changed (labelled with A's seed), drawn from the problem's first distribution."""
    dist = next(iter(problem.spec.distributions))
    a, ref_a, seed_a = pool.drawn(shape, dist, inp.fresh_seed())
    b, ref_b, seed_b = pool.drawn(shape, dist, inp.fresh_seed())
    a2 = _near_duplicate(problem, a, shape, dist)
    with span("references"):
        ref_a2 = run_reference(problem, a2, shape, "memo:near-duplicate")
    return [(a, ref_a, seed_a, "memo:first"), (b, ref_b, seed_b, "memo:same-buffers"),
            (a2, ref_a2, seed_a, "memo:near-duplicate")]


def memo_probe(session, key, problem: Problem, pool: InputPool, checks: list) -> None:
    """Run the probe's three calls and judge each against its own float64 reference; raise a Rejection with
    the reason the failing step's evidence supports (the module docstring)."""
    shape = memo_shape(problem)
    if shape is None:
        return
    steps = pool.own(memo_key(problem, shape), lambda: memo_sets(problem, pool, shape))
    sname = problem.shape_str(shape)
    results = _sequence(session, key, shape, steps, sname)
    for i, ((_, ref, seed, label), res) in enumerate(zip(steps, results)):
        reject_tampering(res, sname, label)
        check = check_outputs(problem, res.outputs, ref, sname, label, seed, res.seconds)
        checks.append(check)
        if check.passed:
            continue
        if i == 0:
            raise Rejection(pb.WRONG_RESULT, f"{sname}/{label}: {check.note}")
        wrong = {name: np.array(v) for name, v in res.outputs.items()}  # a copy: the rerun may reuse the buffers
        earlier = [(s[1], r.outputs) for s, r in zip(steps[:i], results[:i])]
        if _answers_earlier_call(problem, wrong, ref, earlier):
            raise Rejection(pb.MEMOISED, f"{sname}/{label}: right on fresh buffers; on reused ones it gave an "
                                         f"earlier call's answer where it was wrong ({check.note})")
        raise _wrong_on_reuse(session, key, problem, shape, steps[:i + 1], wrong, check, checks)


def _wrong_on_reuse(session, key, problem: Problem, shape, steps: list, wrong: dict, check: pb.Check,
                    checks: list) -> Rejection:
    """The reason for the last of `steps` wrong on reused buffers with an answer of its own. The same calls run
    again: a different answer is NOT_DETERMINISTIC (a race that first showed here). Then the step's inputs
    alone on fresh buffers: wrong there too is WRONG_RESULT; right there, its answer depends on the calls
    before it, which is MEMOISED (a cache or state kept between calls, though it repeats no earlier answer)."""
    x, ref, seed, label = steps[-1]
    sname, note = problem.shape_str(shape), check.note
    try:
        again = _sequence(session, key, shape, steps, sname)[-1]
        reject_tampering(again, sname, label + ":again")
        checks.append(check_outputs(problem, again.outputs, ref, sname, label + ":again", seed, again.seconds))
        with span("comparison"):
            differ = {name: differing_elements(out, again.outputs[name]) for name, out in wrong.items()}
        if any(differ.values()):
            name = max(differ, key=lambda n: differ[n])
            return Rejection(pb.NOT_DETERMINISTIC, f"{sname}/{label}: wrong ({note}), and the same calls run "
                                                   f"again differ in {differ[name]} elements of {name}")
        fresh = session.call(key, shape, x)
    except RunnerFault as e:
        checks.append(pb.Check(shape=sname, distribution=label + ":again", seed=seed, note=str(e)))
        return Rejection(fault_reason(e), f"{sname}/{label}: wrong ({note}); run again: {e}")
    reject_tampering(fresh, sname, label + ":fresh")
    alone = check_outputs(problem, fresh.outputs, ref, sname, label + ":fresh", seed, fresh.seconds)
    checks.append(alone)
    if not alone.passed:
        return Rejection(pb.WRONG_RESULT, f"{sname}/{label}: {note}; wrong on fresh buffers too ({alone.note})")
    return Rejection(pb.MEMOISED, f"{sname}/{label}: right on fresh buffers, wrong after the calls before it, "
                                  f"with the same answer when they are run again ({note})")


def _answers_earlier_call(problem: Problem, outputs: dict, ref: dict, earlier: list) -> bool:
    """Whether, where the outputs are wrong (outside tolerance of their own reference `ref`; everywhere when
    only the norm failed), they are an earlier call's answer bit for bit or right for that call's inputs: the
    mark of a cache keyed by the buffers or by a sample of the values, whole or in part (a row's cache)."""
    with span("comparison"):
        tols = {t.name: problem.spec.tolerance[t.dtype] for t in problem.spec.outputs}
        where = {n: outside_tolerance(outputs[n], ref[n], tol.atol, tol.rtol) for n, tol in tols.items()}
        if not any(m.any() for m in where.values()):
            where = {name: np.ones(m.shape, bool) for name, m in where.items()}
        return any(all(_same_or_right(outputs[n], given[n], ref_j[n], where[n], tol) for n, tol in tols.items())
                   for ref_j, given in earlier)


def _same_or_right(out: np.ndarray, given: np.ndarray, ref: np.ndarray, where: np.ndarray, tol) -> bool:
    """Whether `out`, at the elements `where`, equals `given` bit for bit or is within tolerance of `ref`."""
    def at(a):
        return np.asarray(a).reshape(-1)[where]
    return same_bits(at(out), at(given)) or not outside_tolerance(at(out), at(ref), tol.atol, tol.rtol).any()


def _sequence(session, key, shape, steps: list, sname: str) -> list:
    try:
        return session.call_sequence(key, shape, [s[0] for s in steps])
    except RunnerFault as e:
        raise Rejection(fault_reason(e), f"{sname}/memo probe: {e}") from e


def _near_duplicate(problem: Problem, x: dict, shape: dict, dist: str) -> dict:
    """x with about 1/64 of each input's elements (all in its second half) redrawn: a cache keyed by a
    sample of the values, or by the first ones, sees the same key."""
    with span("drawing"):
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

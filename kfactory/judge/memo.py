"""The memoisation probe: one kernel called on the SAME buffers with inputs A, then unrelated B, then A with a
few values changed. A kernel right on fresh buffers and wrong here either answers from memory of an earlier
call (MEMOISED), gives a different answer each time (NOT_DETERMINISTIC: a race that first showed here), or is
wrong in a repeatable way of its own (WRONG_RESULT); the probe tells the three apart before it names one."""
from __future__ import annotations

import math

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.judge.checks import LARGE_ELEMENTS, InputPool, Rejection, check_outputs, fault_reason, reject_tampering
from kfactory.observability.stagetime import span
from kfactory.problems import Problem
from kfactory.problems.check import run_reference
from kfactory.sandbox.parent import RunnerFault
from kfactory.sandbox.shm_args import same_bits
from kfactory.v1 import events_pb2 as pb


def memo_probe(session, key, problem: Problem, pool: InputPool, checks: list) -> None:
    """Run the probe's three calls and judge each against its own float64 reference; raise a Rejection with
    the reason the failing step's evidence supports (see wrong_on_reuse)."""
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
        if _answers_earlier_call(problem, wrong, earlier, sname):
            raise Rejection(pb.MEMOISED, f"{sname}/{label}: right on fresh buffers; on reused ones it gave an "
                                         f"earlier call's answer ({check.note})")
        again = _sequence(session, key, shape, steps[:i + 1], sname)[i]
        reject_tampering(again, sname, label + ":again")
        checks.append(check_outputs(problem, again.outputs, ref, sname, label + ":again", seed, again.seconds))
        raise wrong_on_reuse(sname, label, check.note, wrong, again.outputs)


def wrong_on_reuse(sname: str, label: str, note: str, wrong: dict, again: dict) -> Rejection:
    """The reason for a step wrong on reused buffers with an answer of its own, from the same sequence run
    again: a different answer means the kernel is not deterministic (a race shows so), the same wrong answer
    means it is wrong on such inputs whatever the buffers held."""
    with span("comparison"):
        differ = {name: _differing(out, again[name]) for name, out in wrong.items()}
    if any(differ.values()):
        name = max(differ, key=lambda n: differ[n])
        return Rejection(pb.NOT_DETERMINISTIC, f"{sname}/{label}: wrong ({note}), and the same calls run again "
                                               f"differ in {differ[name]} elements of {name}")
    return Rejection(pb.WRONG_RESULT, f"{sname}/{label}: {note} (the same answer when run again)")


def _answers_earlier_call(problem: Problem, outputs: dict, earlier: list, sname: str) -> bool:
    """Whether the outputs are the right answer to one of the earlier calls' inputs, or that call's own
    answer bit for bit: the mark of a cache keyed by the buffers or by a sample of the values."""
    with span("comparison"):
        for ref, given in earlier:
            if all(same_bits(out, given[name]) for name, out in outputs.items()):
                return True
            if check_outputs(problem, outputs, ref, sname, "memo:earlier", 0, 0.0).passed:
                return True
    return False


def _differing(a: np.ndarray, b: np.ndarray) -> int:
    """How many elements differ bit for bit (any dtype: compared as unsigned words of the element's size)."""
    size = a.dtype.itemsize
    a8, b8 = (np.ascontiguousarray(v).reshape(-1).view(np.uint8).reshape(-1, size) for v in (a, b))
    return int(np.count_nonzero((a8 != b8).any(axis=1)))


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

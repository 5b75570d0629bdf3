"""`kfactory problems check`: what would break a campaign of a problem package, found before any service runs.

The reference runs on the two smallest verification shapes with every declared input distribution (its inputs
read-only, as in every verification), and its outputs are checked against the ABI (names, numeric arrays,
shapes) and against a second run (the same answer twice); every family is rendered at
one valid point, with its flags through the compile-flag whitelist. Each problem is one line that names the file
(and the line, for a template). `kfactory run` and the planner's submit run the same checks first.
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.platform.config import REFERENCE_CHECK_S
from kfactory.problems.loader import Problem, ProblemError
from kfactory.problems.refcheck import finding_apart
from kfactory.targets.flags import FLAG_TARGETS, FlagRefused, check_flags


class ReferenceFailed(ProblemError):
    """The problem's reference.py raised, or returned what its ABI does not declare."""


def problems_of(problem: Problem, time_limit_s: float = REFERENCE_CHECK_S) -> list[str]:
    """Every problem found, one line each (empty when the package is fit to run); each step of the reference's
    check may take `time_limit_s`."""
    own = problem.checks_itself()
    if own is not None:
        return own
    found = []
    try:
        check_reference(problem, time_limit_s)
    except ProblemError as e:
        found.append(str(e))
    for family in problem.families.values():
        if err := family_problem(family):
            found.append(err)
    # the kernels problem.yaml names, read here: a missing one ended a campaign with a traceback
    reads: list[tuple[Callable[[str], object], str]] = [
        (problem.reference_source, t) for t in problem.spec.reference_kernel]
    reads += [(problem.reference_f64, t) for t in problem.spec.reference_f64]
    for read, target in reads:
        try:
            read(target)
        except ProblemError as e:
            found.append(str(e))
    return found


#: verification shapes (the smallest first) the reference runs on before a campaign: one shape alone is often
#: 1x1, where a transposed or broadcast answer still has the right shape
CHECK_SHAPES = 2


def check_reference(problem: Problem, time_limit_s: float = REFERENCE_CHECK_S) -> None:
    """Run the reference on the CHECK_SHAPES smallest verification shapes, every distribution, twice on the
    smallest: its outputs as the ABI declares them, the same answer for the same inputs (as the judge compares
    two runs: NaN equals NaN, -0 equals 0), its inputs untouched; raise ReferenceFailed with the file and what
    went wrong. A user's package's reference.py (its author's code: Problem.reference_in_package) is checked in a
    child process, where each step (loading it, one call) may take `time_limit_s` (kfactory/problems/refcheck.py):
    one that never returns is then a finding, not a hang; kfactory's own in this process."""
    if not problem.reference_in_package:
        check_reference_here(problem)
    elif finding := finding_apart(problem, time_limit_s):
        raise ReferenceFailed(finding)


def check_reference_here(problem: Problem, step: Callable[[str], object] = lambda step: None) -> None:
    """check_reference's checks, in this process; `step` is told each step before it is taken."""
    from kfactory.judge.numerics import differing_elements

    shapes = sorted(problem.shapes("verify") or problem.shapes("optimize"), key=lambda s: math.prod(s.values()))
    path = problem.directory / "reference.py"
    step("importing reference.py")
    try:
        problem.reference
    except ProblemError:
        raise
    except Exception as e:  # noqa: BLE001 (the user's code: any error importing it is this problem's, with its type)
        raise ReferenceFailed(f"{path}: importing it raised {type(e).__name__}: {e}") from e
    for shape in shapes[:CHECK_SHAPES]:
        for dist in problem.spec.distributions:
            x = inp.draw(problem, shape, dist, seed=1)
            step(f"the call of reference() at shape {problem.shape_str(shape)} (distribution {dist})")
            out = run_reference(problem, x, shape, dist)
            if empty := no_finite_output(x, out):
                raise ReferenceFailed(f"{path}: reference() returned no finite value in {empty} for finite inputs "
                                      f"(shape {problem.shape_str(shape)}, distribution {dist}): every kernel would "
                                      "be judged wrong against it")
            if shape is not shapes[0]:
                continue
            step(f"the second call of reference() at shape {problem.shape_str(shape)} (distribution {dist})")
            again = run_reference(problem, x, shape, dist)
            if any(differing_elements(out[t.name], again[t.name]) for t in problem.spec.outputs):
                raise ReferenceFailed(f"{path}: reference() gave two answers for the same inputs (shape "
                                      f"{problem.shape_str(shape)}, distribution {dist}); the truth a kernel is "
                                      "judged against must not change (a random draw or global state inside it?)")


def no_finite_output(x: dict, out: dict) -> str:
    """The name of an output with no finite element although every input element is finite (a reference gone
    NaN), or ""."""
    def floating(a) -> bool:
        return isinstance(a, np.ndarray) and a.size > 0 and np.issubdtype(a.dtype, np.floating)

    if not all(np.isfinite(a).all() for a in x.values() if floating(a)):
        return ""
    return next((name for name, a in out.items() if floating(a) and not np.isfinite(a).any()), "")


def run_reference(problem: Problem, x: dict, shape: dict[str, int], dist: str) -> dict:
    """The problem's float64 reference outputs for inputs `x`; ReferenceFailed (the problem's fault, never a
    candidate's) when the user's reference.py raises, ends the program, writes into its inputs or returns what
    the ABI does not declare. The judge hands these same input arrays to the kernels, so they are read-only
    while the reference runs (free, where a copy to compare cost up to 3.6x a cheap reference's own time)."""
    path = problem.directory / "reference.py"
    where = f"(shape {problem.shape_str(shape)}, distribution {dist})"
    given = dict(x)
    try:
        with _read_only(x):
            # the problem's scalar parameters as keyword arguments (kfactory.problems.params); none when it has none
            out = problem.reference.reference(x, **problem.params)
    except ProblemError:
        raise
    except SystemExit as e:   # not an Exception: it would end the verifier (or the command) without a word
        raise ReferenceFailed(f"{path}: reference() called sys.exit({e.code!r}) {where}; it must return its "
                              "outputs") from e
    except Exception as e:  # noqa: BLE001 (the user's code: any error is this problem's, reported with its type)
        hint = ""
        if isinstance(e, TypeError) and problem.params and "argument" in str(e):
            hint = f"; it is called as reference(inputs, {', '.join(f'{k}=...' for k in problem.params)})"
        elif isinstance(e, ValueError):   # numpy's answer to a write into a read-only array
            hint = ("; its inputs are read-only while it runs (the kernels are judged on the same arrays): copy "
                    "an input before changing it (x = x.copy(), no in-place operations on the inputs)")
        raise ReferenceFailed(f"{path}: reference() raised {type(e).__name__}: {e} {where}{hint}") from e
    if any(x.get(k) is not v for k, v in given.items()) or set(x) != set(given):
        # an input replaced in the dict: the judge's dict, which the kernels are handed, too
        raise ReferenceFailed(f"{path}: reference() wrote into its inputs {where}; the kernels would be judged on "
                              "other inputs than its answer was computed from: copy an input before changing it "
                              "(x = x.copy(), no in-place operations on the inputs)")
    _check_outputs(problem, path, out, shape, dist)
    return out


@contextlib.contextmanager
def _read_only(x: dict):
    """The input arrays read-only while inside (a write raises in the reference), writable again after."""
    locked = [a for a in x.values() if isinstance(a, np.ndarray) and a.flags.writeable]
    for a in locked:
        a.flags.writeable = False
    try:
        yield
    finally:
        for a in locked:
            a.flags.writeable = True


def _check_outputs(problem: Problem, path: Path, out, shape: dict[str, int], dist: str) -> None:
    where = f"(shape {problem.shape_str(shape)}, distribution {dist})"
    if not isinstance(out, dict):
        raise ReferenceFailed(f"{path}: reference() returned {type(out).__name__}, not a dict of output arrays "
                              f"{where}")
    for t in problem.spec.outputs:
        if t.name not in out:
            raise ReferenceFailed(f"{path}: reference() returned no {t.name!r} (it returned {sorted(out)}) {where}")
        value = out[t.name]
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiub":
            raise ReferenceFailed(f"{path}: reference() output {t.name!r} is {_kind(value)}, not a numpy array of "
                                  f"numbers {where}")
        if t.dtype in FLOAT_DTYPES and value.dtype.kind != "f":
            raise ReferenceFailed(f"{path}: reference() output {t.name!r} is {value.dtype}, for a {t.dtype} output "
                                  f"the reference computes in floating point (float64) {where}")
        want = problem.tensor_shape(t, shape)
        got = np.shape(value)
        if tuple(got) != want:
            raise ReferenceFailed(f"{path}: reference() output {t.name!r} has shape {tuple(got)}, the ABI says "
                                  f"{want} {where}")


#: the spec's floating dtypes: their reference outputs must be floating too
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})


def _kind(value) -> str:
    return f"a numpy array of {value.dtype}" if isinstance(value, np.ndarray) else f"a {type(value).__name__}"


def family_problem(family) -> str:
    """Why the family cannot render a candidate ("" when it can): no valid point, a template error (file:line),
    flags off the whitelist."""
    try:
        point = family.first_point()
        if point is None:
            return f"{family.directory / 'family.yaml'}: no valid point (check the constraints)"
        _, flags, _ = family.render(point)
    except ProblemError as e:
        return str(e)
    if family.spec.target in FLAG_TARGETS:
        try:
            check_flags(family.spec.target, flags)
        except FlagRefused as e:
            return f"{family.directory / 'family.yaml'}: compile_flags at {point}: {e}"
    return ""

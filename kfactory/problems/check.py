"""`kfactory problems check`: what would break a campaign of a problem package, found before any service runs.

The reference runs on the smallest verification shape with every declared input distribution, and its
outputs are checked against the ABI (names, shapes, finite where the inputs are); every family is rendered at
one valid point, with its flags through the compile-flag whitelist. Each problem is one line that names the file
(and the line, for a template). `kfactory run` and the planner's submit run the same checks first.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kfactory.judge import inputs as inp
from kfactory.problems.loader import Problem, ProblemError
from kfactory.targets.flags import FLAG_TARGETS, FlagRefused, check_flags


class ReferenceFailed(ProblemError):
    """The problem's reference.py raised, or returned what its ABI does not declare."""


def problems_of(problem: Problem) -> list[str]:
    """Every problem found, one line each (empty when the package is fit to run)."""
    own = problem.checks_itself()
    if own is not None:
        return own
    found = []
    try:
        check_reference(problem)
    except ProblemError as e:
        found.append(str(e))
    for family in problem.families.values():
        if err := family_problem(family):
            found.append(err)
    return found


def smallest_shape(problem: Problem) -> dict[str, int]:
    """The verification shape with the fewest elements (the optimisation shapes when none is declared)."""
    return min(problem.shapes("verify") or problem.shapes("optimize"), key=lambda s: math.prod(s.values()))


def check_reference(problem: Problem) -> None:
    """Run the reference on the smallest verification shape, every distribution; raise ReferenceFailed with
    the file and what went wrong."""
    shape = smallest_shape(problem)
    for dist in problem.spec.distributions:
        run_reference(problem, inp.draw(problem, shape, dist, seed=1), shape, dist)


def run_reference(problem: Problem, x: dict, shape: dict[str, int], dist: str) -> dict:
    """The problem's float64 reference outputs for inputs `x`; ReferenceFailed (the problem's fault, never a
    candidate's) when the user's reference.py raises or returns what the ABI does not declare."""
    path = problem.directory / "reference.py"
    try:
        # the problem's scalar parameters as keyword arguments (kfactory.problems.params); none when it has none
        out = problem.reference.reference(x, **problem.params)
    except ProblemError:
        raise
    except Exception as e:  # noqa: BLE001 (the user's code: any error is this problem's, reported with its type)
        hint = ""
        if isinstance(e, TypeError) and problem.params and "argument" in str(e):
            hint = f"; it is called as reference(inputs, {', '.join(f'{k}=...' for k in problem.params)})"
        raise ReferenceFailed(f"{path}: reference() raised {type(e).__name__}: {e} (shape "
                              f"{problem.shape_str(shape)}, distribution {dist}){hint}") from e
    _check_outputs(problem, path, out, shape, dist)
    return out


def _check_outputs(problem: Problem, path: Path, out, shape: dict[str, int], dist: str) -> None:
    where = f"(shape {problem.shape_str(shape)}, distribution {dist})"
    if not isinstance(out, dict):
        raise ReferenceFailed(f"{path}: reference() returned {type(out).__name__}, not a dict of output arrays "
                              f"{where}")
    for t in problem.spec.outputs:
        if t.name not in out:
            raise ReferenceFailed(f"{path}: reference() returned no {t.name!r} (it returned {sorted(out)}) {where}")
        want = problem.tensor_shape(t, shape)
        got = np.shape(out[t.name])
        if tuple(got) != want:
            raise ReferenceFailed(f"{path}: reference() output {t.name!r} has shape {tuple(got)}, the ABI says "
                                  f"{want} {where}")


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

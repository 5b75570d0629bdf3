"""Loading problem packages from disk: a built-in problem by name, a user's package by its directory, or (through
kfactory.targets.replay.problem) the problem of a recorded tuning space, "replay:<cache file>".

The loaded objects are kfactory.problems.package's; they are re-exported here, where most callers have imported
them from.
"""
from __future__ import annotations

import functools
from pathlib import Path

import yaml
from pydantic import ValidationError

from kfactory.problems.package import (LANGUAGES, Family, Problem, ProblemError, language_of, safe_eval,
                                       shape_str)
from kfactory.problems.spec import FamilySpec, ProblemSpec

__all__ = ["BUILTIN", "BUILTIN_DIR", "LANGUAGES", "Family", "Problem", "ProblemError", "language_of", "list_problems",
           "load_problem", "problem_name", "safe_eval", "shape_str"]

BUILTIN = Path(__file__).parent
BUILTIN_DIR = BUILTIN


def _load_yaml(path: Path, model):
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ProblemError(f"missing {path}") from e
    except yaml.YAMLError as e:
        raise ProblemError(f"{path}: not valid YAML: {e}") from e
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']}" for err in e.errors())
        raise ProblemError(f"{path}: {errs}") from e


def load_problem(name_or_path: str | Path) -> Problem:
    """Load a built-in problem by name or a package by directory path; "replay:<cache file>" synthesizes the
    problem of a recorded tuning space (kfactory.targets.replay.problem), "engine:<model>" the problem whose
    candidates are whole inference engines of a model (kfactory.engines.problem)."""
    if str(name_or_path).startswith("replay:"):
        from kfactory.targets.replay.problem import load_replay_problem
        return load_replay_problem(str(name_or_path))
    if str(name_or_path).startswith("engine:"):  # a model's inference engine (kfactory/engines/problem.py)
        from kfactory.engines.problem import load_engine_problem
        return load_engine_problem(str(name_or_path))
    path = Path(name_or_path)
    # a directory holding a problem.yaml, else a built-in name (a stray directory named like a built-in
    # problem, e.g. ./kda with no problem.yaml in it, must not hide the built-in one)
    directory = path if _is_file(path / "problem.yaml") else BUILTIN / str(name_or_path)
    if not _is_file(directory / "problem.yaml"):
        raise ProblemError(f"no problem {str(name_or_path)[:200]!r}: not a directory with problem.yaml and not one of "
                           f"{list_problems()}")
    spec = _load_yaml(directory / "problem.yaml", ProblemSpec)
    problem = Problem(spec, directory)
    for fname in spec.families:
        fdir = directory / "families" / fname
        fam = Family(_load_yaml(fdir / "family.yaml", FamilySpec), fdir, problem.params)
        if fam.name != fname:
            raise ProblemError(f"{fdir}/family.yaml: name {fam.name!r} differs from its directory {fname!r}")
        if clash := [k for k in fam.spec.params if k in spec.params]:
            raise ProblemError(f"{fdir}/family.yaml: params: {clash} are also params of the problem; rename one "
                               "(a template would see only one of the two values)")
        fam.check_names()
        problem.families[fname] = fam
    return problem


@functools.lru_cache(maxsize=64)
def problem_name(locator: str) -> str:
    """A problem's name from the locator a spec holds (a built-in name, a package directory, a replay cache);
    the locator itself when it does not load here (any more)."""
    try:
        return load_problem(locator).name
    except ProblemError:
        return locator


def _is_file(path: Path) -> bool:
    """Whether `path` is a file; False for a name the OS cannot look up (too long, a NUL byte): a user's name
    for a problem is then simply no problem, not an OSError out of the planner."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def list_problems() -> list[str]:
    """Names of the built-in problems."""
    return sorted(p.parent.name for p in BUILTIN.glob("*/problem.yaml"))

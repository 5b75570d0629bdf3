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

from kfactory.platform import yamlfile
from kfactory.problems.package import (BUILTIN_DIR, LANGUAGES, Family, NoSuchProblem, Problem, ProblemError,
                                       language_of, safe_eval, shape_str)
from kfactory.problems.spec import FamilySpec, ProblemSpec

__all__ = ["BUILTIN", "BUILTIN_DIR", "LANGUAGES", "Family", "NoSuchProblem", "Problem", "ProblemError", "language_of",
           "list_problems", "load_problem", "problem_name", "safe_eval", "shape_str"]

BUILTIN = BUILTIN_DIR


def _load_yaml(path: Path, model):
    try:
        data = yamlfile.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ProblemError(f"missing {path}") from e
    except yaml.YAMLError as e:
        raise ProblemError(f"{path}: not valid YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise ProblemError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8") from e
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
    # a built-in's name is the built-in, whatever directory of that name the working directory holds (./softmax
    # would have replaced it for every command run there); any other directory holding a problem.yaml is a
    # user's package
    builtin = str(name_or_path) in list_problems()
    directory = path if not builtin and _is_file(path / "problem.yaml") else BUILTIN / str(name_or_path)
    if not _is_file(directory / "problem.yaml"):
        if path.name == "problem.yaml" and _is_file(path):
            raise NoSuchProblem(f"{str(name_or_path)[:200]!r} is a package's problem.yaml: name its directory, "
                                f"{str(path.parent)[:200]!r}")
        raise NoSuchProblem(f"no problem {str(name_or_path)[:200]!r}: not a directory with problem.yaml and not one of "
                           f"{list_problems()}")
    spec = _load_yaml(directory / "problem.yaml", ProblemSpec)
    if not builtin:
        _check_name(spec, directory)
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


#: what a package may change and still be filed under a built-in's name: where it is timed and with which
#: kernels, never what is judged (the reference, the inputs drawn, the tolerances, the ABI); its shapes are
#: compared apart: it may time other shapes, and verify on more, never on fewer
SAME_NAME_MAY_DIFFER = frozenset({"shapes", "families", "description", "baselines", "reference_kernel"})


def _check_name(spec: ProblemSpec, directory: Path) -> None:
    """A user's package named like a built-in must judge as it does (records are filed by name: its kernels
    would be the built-in's best, export and priors): the same reference.py and the same spec but for
    SAME_NAME_MAY_DIFFER, and every verification shape of the built-in's; a package that differs there is
    refused with what to rename."""
    if spec.name not in list_problems() or directory.resolve() == (BUILTIN / spec.name).resolve():
        return
    own = BUILTIN / spec.name
    base = _load_yaml(own / "problem.yaml", ProblemSpec)
    differ = sorted(k for k in ProblemSpec.model_fields if k not in SAME_NAME_MAY_DIFFER
                    and getattr(spec, k) != getattr(base, k))
    sources = ["reference.py", *(r.source for r in base.reference_f64.values())]
    differ += [f for f in sources if _read(directory / f) != _read(own / f)]
    if missing := [s for s in base.shapes.verify if s not in spec.shapes.verify]:
        differ.append(f"shapes.verify leaves out {', '.join(shape_str(s, base.symbols) for s in missing)}")
    if differ:
        raise ProblemError(f"{directory / 'problem.yaml'}: name {spec.name!r} is the built-in problem's, and this "
                           f"package judges differently ({', '.join(differ)}); give it a name of its own (its "
                           "results would be filed as the built-in's)")


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


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

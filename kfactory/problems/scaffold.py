"""`kfactory problems new NAME [--like PROBLEM]`: a new problem package, copied from a built-in one.

The copy is a working package from the first minute (`kfactory problems check` passes on it), renamed; the
user then edits what makes it their operation, field by field, with docs/adding-a-problem.md beside them.
"""
from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from kfactory.problems.loader import BUILTIN_DIR, ProblemError, list_problems, load_problem

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def new_problem(name: str, like: str, out_dir: Path) -> Path:
    """Copy built-in problem `like` to out_dir/name, named `name`; returns the package directory. Raises
    ProblemError (what to fix) for a bad name, an unknown model problem or a directory that exists."""
    if not NAME.match(name):
        raise ProblemError(f"problem name {name[:80]!r}: use lower-case letters, digits and '_', starting with a "
                           "letter (it names the package and the archive's records)")
    if like not in list_problems():
        raise ProblemError(f"--like {like[:80]!r}: not a built-in problem; one of {list_problems()}")
    if name in list_problems():
        raise ProblemError(f"problem name {name!r} is a built-in problem's: choose another (a package's records "
                           "are filed by its name)")
    target = out_dir / name
    if target.exists():
        raise ProblemError(f"{target} exists already: choose another name or --out directory")
    shutil.copytree(BUILTIN_DIR / like, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = target / "problem.yaml"
    text, n = re.subn(r"^name: .*$", f"name: {name}", spec.read_text(), count=1, flags=re.MULTILINE)
    if n != 1:  # every built-in problem.yaml has a top-level name; a copy without one would load as `like`
        raise ProblemError(f"{spec}: no top-level 'name:' line to rename")
    spec.write_text(text)
    load_problem(target)  # the copy must load as it stands
    return target


def next_steps(package: Path) -> str:
    """What to edit, in order, printed after the copy; the commands quoted for a shell, one run per target the
    copied families are for (a copy of a cuda-only problem has nothing to search on the default cpu target)."""
    families = load_problem(package).families.values()
    targets = sorted({f.spec.target for f in families}) or ["cpu"]
    where = shlex.quote(str(package))
    runs = [f"kfactory run {where} --target {t} --budget 20" for t in targets]
    return "\n".join([
        f"created {package}",
        "next (docs/adding-a-problem.md walks through every field):",
        f"  1. {package / 'problem.yaml'}: description, symbols, inputs, outputs, params, shapes, distributions, "
        "tolerance, cost, abi",
        f"  2. {package / 'reference.py'}: reference(inputs, **params) in float64, and baselines() if you have some",
        f"  3. {package / 'families'}: the templates the search renders (or delete them and list none: agents "
        "and your own kernels then spend the budget)",
        f"  4. kfactory problems check {where}",
        f"  5. {runs[0]}",
        *(f"     {run}" for run in runs[1:]),
    ])

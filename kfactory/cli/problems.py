"""`kfactory problems list|describe|check|new`: the problem packages, one described, one checked before a campaign,
a new one scaffolded from a built-in."""
from __future__ import annotations

import sys
from pathlib import Path

from kfactory.platform.config import REFERENCE_CHECK_MAX_S, REFERENCE_CHECK_S

EXIT_USAGE = 2


def add_parser(sub) -> None:
    """The `problems` command group."""
    p = sub.add_parser("problems", help="list problems, describe one, or check a package before a campaign (its "
                       "reference on the two smallest verification shapes, every family rendered at one point)")
    p.add_argument("action", choices=("list", "describe", "check", "new"))
    p.add_argument("name", nargs="?")
    p.add_argument("--like", default="softmax", help="new: the built-in problem to copy (default softmax)")
    p.add_argument("--out", type=Path, default=Path("."), help="new: where the package directory goes (default .)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help="check: seconds importing reference.py, and each call of reference(), may take before the "
                        "check fails naming that step (default KFACTORY_REFERENCE_CHECK_S, else "
                        f"{REFERENCE_CHECK_S:g})")


def _seconds(text: str) -> float:
    """A positive number of seconds (argparse names the flag when it is not one)."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= REFERENCE_CHECK_MAX_S:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0, at most "
                                         f"{REFERENCE_CHECK_MAX_S:g}")
    return value


def run(args) -> int:
    """`kfactory problems ACTION [NAME]`: exit 1 when a problem is found or a package does not load, 2 on a usage
    error (a name that is no problem and no package directory)."""
    from kfactory.problems import NoSuchProblem, ProblemError, list_problems, load_problem

    if args.action == "list":
        for name in list_problems():
            p = load_problem(name)
            print(f"{name:12s} {' '.join(p.spec.description.split())[:100]}")
        return 0
    if not args.name:
        print(f"kfactory problems {args.action}: name a problem or a package directory (kfactory problems list)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.action == "new":
            return _problem_new(args)
        problem = load_problem(args.name)
        if args.action == "check":
            return _problem_check(problem, args.timeout)
        print(problem.describe())
    except NoSuchProblem as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ProblemError as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return 1
    return 0


def _problem_new(args) -> int:
    """Scaffold a package; a bad name, an unknown --like or an existing directory is a usage error."""
    from kfactory.problems import ProblemError
    from kfactory.problems.scaffold import new_problem, next_steps

    try:
        print(next_steps(new_problem(args.name, args.like, args.out)))
    except ProblemError as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _problem_check(problem, timeout_s: float | None) -> int:
    """Print every problem of a package, one line each; exit 1 when there is one. Each step of the reference's
    check may take `timeout_s` (None: the setting KFACTORY_REFERENCE_CHECK_S)."""
    from kfactory.platform.config import Settings
    from kfactory.problems.check import problems_of

    found = problems_of(problem, timeout_s if timeout_s is not None else Settings().reference_check_s)
    if not found and problem.kind != "engine" and (baselines := _baselines_problem(problem)):
        found = [baselines]
    for line in found:
        print(f"kfactory: {line}", file=sys.stderr)
    if not found and problem.kind == "engine":   # no kernel reference, no template: its model is what must load
        print(f"{problem.name}: the model package loads; its {len(problem.family().designs)} designs are generated, "
              "built and verified token for token against the model's float64 reference when a campaign runs "
              f"them (kfactory engine run {problem.model})")
    elif not found:
        print(f"{problem.name}: the reference runs on every distribution and every family renders")
    return 1 if found else 0


def _baselines_problem(problem) -> str:
    """A finding when reference.py's baselines() or cuda_baselines() raises (the package's code, run here: a
    campaign would fail on it), else "", with a note (not a finding: torch, say, may be installed elsewhere) for
    each baseline problem.yaml declares that they offer on no target here: a campaign compares with the reference
    kernel alone, and said nothing."""
    from kfactory.judge.measure import available_baselines

    try:
        offered = {b for target in ("cpu", "cuda") for b in available_baselines(problem, target)}
    except Exception as e:  # noqa: BLE001 (the user's code: any error in it is this package's, with its type)
        return f"{problem.directory / 'reference.py'}: its baselines raised {type(e).__name__}: {e}"
    if missing := [b for b in problem.spec.baselines if b not in offered]:
        print(f"kfactory: note: problem.yaml declares the baselines {', '.join(missing)}, which reference.py's "
              "baselines() (cpu) and cuda_baselines() do not offer here: campaigns here time none of them",
              file=sys.stderr)
    return ""

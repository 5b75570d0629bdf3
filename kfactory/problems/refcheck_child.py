"""The child of kfactory/problems/refcheck.py: `python -m kfactory.problems.refcheck_child DIRECTORY PARENT_PID`
checks the reference of the package at DIRECTORY (kfactory.problems.check.check_reference_here), telling its parent
each step before it takes it and then its answer, one JSON line each on the stdout it was given; everything else (the
reference's own prints) goes to stderr. The reference's faults are the check's findings ({"problem": ...}); a
failure of the check's own code is told apart ({"harness": its traceback})."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import traceback
from pathlib import Path


#: prctl's option that has the kernel signal this process when its parent ends (linux/prctl.h)
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """Be killed when the process that started the check ends (Linux: prctl PR_SET_PDEATHSIG), so that a check
    whose parent was killed does not run on, orphaned; a parent already gone ends this process now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):   # no prctl here (not Linux): the parent's own kill still ends the check
        return
    if os.getppid() != parent:   # the parent ended before the request took effect
        os._exit(1)


def main(directory: str, parent: int) -> None:
    end_with_parent(parent)
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)   # the reference's prints, at any level (print, os.write(1, ...)), go to stderr
    sys.stdout = sys.stderr

    def tell(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    from kfactory.problems.check import check_reference_here
    from kfactory.problems.loader import ProblemError, load_problem

    try:
        problem = load_problem(Path(directory))
        check_reference_here(problem, lambda step: tell({"step": step}))
    except ProblemError as e:   # what the check found (ReferenceFailed), or a package that does not load
        tell({"problem": str(e)})
        return
    except Exception:  # noqa: BLE001 (the check's own code failed, not the reference: told as such, not a finding)
        tell({"harness": traceback.format_exc()})
        return
    tell({"ok": True})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

"""The reference check (kfactory.problems.check.check_reference) run in a child process, under a time limit.

A package's reference.py is its author's code: one that never returns (a loop that does not end, a wait on
something that never comes) would hang `kfactory problems check`, `kfactory run` and the planner's submit with
it. `finding_apart` starts `python -m kfactory.problems.refcheck_child DIRECTORY PARENT_PID`, which loads the
package and runs the same check, telling this side each step before it takes it (importing reference.py, each
call of reference() with its shape and distribution) as one JSON line on its stdout; the reference's own prints go
to stderr; it ends with this process (prctl). Each step may take `time_limit_s` (the child's own start, which is
kfactory's, at least START_S): the child is killed once one takes longer, and the finding names that step. The
child ends with one line: {"ok": true}, or {"problem": the check's one-line finding}.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kfactory.sandbox.parent import child_env, kill_group

#: the child's module, run as `python -m CHILD DIRECTORY`
CHILD = "kfactory.problems.refcheck_child"
#: how much of the child's stderr a finding quotes (its last characters, on one line)
STDERR_TAIL = 500
#: the longest one wait for the child's next line lasts (a longer limit is waited out in such slices): a poll's
#: timeout is bounded, and a day-long limit must not overflow it
WAIT_SLICE_S = 60.0
#: the step the child is in before it names one: loading the package, before any of its author's code runs (a
#: child that ends there failed in kfactory's own code or its environment)
START = "the start of the check"
#: the least time the child's start may take, whatever the limit: it is kfactory's own (an interpreter importing
#: numpy and kfactory, 1-2 s on an idle host, many more on a loaded one), and a 2-second limit meant for the
#: author's steps named a loaded host's start as the package's fault
START_S = 60.0


class ReferenceTimedOut(Exception):
    """A step of the reference check took longer than its time limit (the message names the step)."""

    def __init__(self, step: str, limit_s: float):
        super().__init__(f"{step} took longer than {limit_s:g} s (stopped)")
        self.step = step


class CheckUnavailable(RuntimeError):
    """The check's child did not get through its own start (kfactory's imports, before the package's code) within
    START_S: the host is too busy to check now. Not the package's fault, so no finding: the caller says to try
    again (the planner answers UNAVAILABLE, the CLI exits EXIT_UNAVAILABLE)."""


class CheckBroken(RuntimeError):
    """The check's own code failed in the child (not the reference: a bug of kfactory's); the message holds the
    child's traceback."""


def finding_apart(problem, time_limit_s: float) -> str | None:
    """check_reference's checks of `problem` (a package whose reference.py is its author's code) run in a child
    process: None when they pass, else the finding in one line (the check's own; or the step that did not end
    within `time_limit_s`, and what to do about it; or how the child ended without an answer). CheckBroken when
    the check's own code failed there, CheckUnavailable when the child did not start within START_S."""
    directory = problem.directory.resolve()   # absolute: "./softmax" would load as the built-in softmax there
    path = directory / "reference.py"
    with tempfile.TemporaryFile() as err:
        # -P: the working directory stays off the child's path (a json.py there would shadow the stdlib), so
        # kfactory comes from where this process found it
        proc = subprocess.Popen([sys.executable, "-P", "-m", CHILD, str(directory), str(os.getpid())],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=_child_env(),
                                start_new_session=True)
        try:
            answer, step = _follow(proc, time_limit_s)
        except ReferenceTimedOut as e:
            if e.step == START:
                raise CheckUnavailable(f"checking {path}: {e}, before reference.py was loaded: the host is too "
                                       "busy to start the check; try again when it is quieter") from e
            return (f"{path}: {e}: make it end (a loop that never ends? a wait on input?), or, if it is only slow, "
                    "give it longer with --timeout S (kfactory problems check) or KFACTORY_REFERENCE_CHECK_S")
        finally:
            _kill(proc)
        if answer is None:   # ended without a word: os._exit in the reference, a crash of numpy or the interpreter
            tail = _tail(err)
            if step == START:
                raise CheckBroken(f"the check of {path} ended (exit status {proc.returncode}) before the package's "
                                  f"own code ran: {tail or 'no output'}")
            return (f"{path}: the process checking the reference ended (exit status {proc.returncode}) during "
                    f"{step}, without an answer" + (f": {tail}" if tail else ""))
    if "harness" in answer:
        raise CheckBroken(f"the check of {path} failed in its own code (not the reference's):\n{answer['harness']}")
    return str(answer["problem"]) if "problem" in answer else None


def _follow(proc: subprocess.Popen, time_limit_s: float) -> tuple[dict | None, str]:
    """(the child's last line, the step it was taking), following its steps: each may take `time_limit_s`;
    ReferenceTimedOut naming the step that took longer. The last line is None when the child ended without one."""
    assert proc.stdout is not None
    fd, buf, step, limit = proc.stdout.fileno(), b"", START, max(time_limit_s, START_S)
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as sel:   # not select(): a long-lived planner's descriptors pass 1024
        sel.register(fd, selectors.EVENT_READ)
        while True:
            while b"\n" not in buf:
                left = _left(deadline, step, limit)
                if not sel.select(min(left, WAIT_SLICE_S)):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:   # the pipe closed: the child ended, or closed it and goes on; the limit still holds
                    _wait(proc, deadline, step, limit)
                    return None, step
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            try:
                message = json.loads(line)
            except ValueError:   # not the child's: only its own lines go to this pipe
                continue
            if not isinstance(message, dict):
                continue
            if "step" not in message:
                return message, step
            step, limit = str(message["step"]), time_limit_s
            deadline = time.monotonic() + limit


def _left(deadline: float, step: str, limit_s: float) -> float:
    """Seconds left to the step's deadline; ReferenceTimedOut naming the step once there are none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise ReferenceTimedOut(step, limit_s)
    return left


def _wait(proc: subprocess.Popen, deadline: float, step: str, limit_s: float) -> None:
    """Wait for the child to end within the step's deadline (ReferenceTimedOut when it does not)."""
    while True:
        try:
            proc.wait(timeout=min(_left(deadline, step, limit_s), WAIT_SLICE_S))
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(err) -> str:
    """The last STDERR_TAIL characters of the child's stderr (a file), on one line."""
    size = err.seek(0, os.SEEK_END)
    err.seek(max(0, size - 4 * STDERR_TAIL))
    text = err.read().decode(errors="replace")[-STDERR_TAIL:]
    return " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _child_env() -> dict[str, str]:
    """The child's environment: this one less the factory's settings and secrets (child_env), with kfactory's own
    directory first on PYTHONPATH (the child imports kfactory from where this process did, whatever the working
    directory)."""
    env = child_env()
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def _kill(proc: subprocess.Popen) -> None:
    """End the child and anything it started (its own session), reap it and close its pipe."""
    kill_group(proc)
    if proc.stdout is not None:
        proc.stdout.close()

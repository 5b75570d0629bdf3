"""Timings on this host's cores kept apart from this process's other work there.

On the cpu target the device is this host's cores. A compile or numpy drawing an input set on one core beside a
two-thread kernel being timed on two slows that timing by up to 2x. Measured on the 2-core host (a 40-candidate
softmax campaign, each kernel timed again afterwards in quiet against the campaign's best): kernels screened out at
12-16 ms timed at 0.75-0.9x the best, a measured one told 16.0 ms timed at 0.73x, and the campaign settled on a
1-thread kernel at 7.4 ms where 2-thread ones at 4.1-4.2 ms exist. Lowering that work's priority (nice 19) was
not enough: the same campaign again settled on the same 1-thread kernel.

So a timing of a kernel that runs on this host (`timing(on_host=True)`: the cpu session's every bench, an engine's
timing in the benchmarker):
- waits for this process's host work in threads (`host_work()`: inputs drawn ahead, one set at a time) to end,
  and holds new such work off until it ends;
- stops the compilers running for this process (`run_compiler`, `process(pid)`: the compiler and the programs it
  started, by SIGSTOP) and lets them go on when it ends (SIGCONT), so the device never waits for a compile (the
  programs a compiler started are found through Linux's /proc/PID/task/TID/children; where that file is missing
  only the compiler's own process is stopped).
A timing of a kernel that runs elsewhere (a GPU) excludes nothing: drawing and compiling beside it is the point.

The scope is this process (a `kfactory run` has all six services in it; this cannot see another process's work).
Every wait is bounded (WAIT_MAX_S).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

from kfactory.observability.stagetime import span

_cond = threading.Condition()
_timings = 0                # host timings running
_waiting = 0                # host timings waiting for host work to end (they go first)
_host = 0                   # host work running in threads
_procs: set[int] = set()    # compilers running for this process
_stopped: list[int] = []    # the processes a running timing stopped

#: the longest a timing waits for a process it stopped to show stopped (it does within a scheduler tick)
STOP_WAIT_S = 0.1
#: the longest either side waits for the other (a timing lasts at most Settings.compare_max_s per shape, a set's
#: draw well under a second)
WAIT_MAX_S = 30.0


@contextlib.contextmanager
def timing(on_host: bool):
    """Mark the block as a timing. `on_host`: its kernel runs on this host's cores, so host work is kept off them
    until it ends (the module's docstring); else nothing is waited for or stopped."""
    global _timings, _waiting
    if not on_host:
        yield
        return
    with span("quiet"), _cond:  # the wait and the stopping, in the stage-time ledger as the part "quiet"
        _waiting += 1
        try:
            _cond.wait_for(lambda: _host == 0, WAIT_MAX_S)
        finally:
            _waiting -= 1
        _timings += 1
        if _timings == 1:
            for pid in _procs:
                _stop(pid)
    try:
        yield
    finally:
        with _cond:
            _timings -= 1
            if not _timings:
                _resume()
            _cond.notify_all()


@contextlib.contextmanager
def host_work():
    """Mark the block as work in this thread on this host's cores that would slow a host timing: it starts once
    no host timing runs or waits to run."""
    global _host
    with _cond:
        _cond.wait_for(lambda: _timings == 0 and _waiting == 0, WAIT_MAX_S)
        _host += 1
    try:
        yield
    finally:
        with _cond:
            _host -= 1
            _cond.notify_all()


def as_host_work(fn, *args):
    """fn(*args) as host work (host_work())."""
    with host_work():
        return fn(*args)


@contextlib.contextmanager
def process(pid: int):
    """Mark a compiler this process started (`pid`, with the programs it starts) as host work: stopped while a host
    timing runs (at once if one runs now), going on when it ends."""
    with _cond:
        _procs.add(pid)
        if _timings:
            _stop(pid)
    try:
        yield
    finally:
        with _cond:
            _procs.discard(pid)


def run_compiler(cmd: list[str], timeout_s: float, stdin: str | None = None) -> tuple[int | None, str]:
    """(exit status, stderr) of a compiler run for this process (`stdin` its input), or (None, "") when it ran
    past `timeout_s` (then killed). It is stopped while a kernel is timed on this host (process()), so compiling
    ahead of the device never slows a timing; the time it spends stopped counts toward its limit."""
    with subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc, process(proc.pid):
        try:
            _, stderr = proc.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None, ""
    return proc.returncode, stderr


def timed(fn, *args):
    """fn(*args) as a timing on this host (timing(on_host=True)): for work that times kernels in a child of its own
    (an engine)."""
    with timing(on_host=True):
        return fn(*args)


def _stop(pid: int) -> None:
    """SIGSTOP pid, then the processes it started (each stopped before its children are listed, so none starts
    another behind the walk), and wait until each has stopped (a signal takes effect when its process next runs,
    which may be a moment after kill() returns); remembered for _resume."""
    todo, stopping = [pid], []
    while todo:
        p = todo.pop()
        if _signal(p, signal.SIGSTOP):
            stopping.append(p)
            todo.extend(_children(p))
    _stopped.extend(stopping)
    deadline = time.monotonic() + STOP_WAIT_S
    while any(_running(p) for p in stopping) and time.monotonic() < deadline:
        time.sleep(0.001)


def _resume() -> None:
    while _stopped:
        _signal(_stopped.pop(), signal.SIGCONT)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended (or was reaped) since it was listed: nothing to stop or resume
        return False
    return True


def _running(pid: int) -> bool:
    """Whether `pid` has yet to stop (/proc/PID/stat's state is neither T, stopped, nor Z, ended); False once gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:  # it ended
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X")


def _children(pid: int) -> list[int]:
    """The processes `pid`'s threads started (Linux's /proc/PID/task/TID/children); none once it has ended."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # it ended
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:  # that thread (or the kernel's children file) is gone
            continue
    return out


def state() -> tuple[int, int, int, int]:
    """(host timings running, host timings waiting, host work running, compilers stopped) now in this process."""
    with _cond:
        return _timings, _waiting, _host, len(_stopped)

"""Timings on this host's cores kept apart from this process's other work there.

On the cpu target the device is this host's cores. A compile or numpy drawing an input set on one core beside a
two-thread kernel being timed on two slows that timing by up to 2x. Measured on the 2-core host (a 40-candidate
softmax campaign, each kernel timed again afterwards in quiet against the campaign's best): kernels screened out at
12-16 ms timed at 0.75-0.9x the best, a measured one told 16.0 ms timed at 0.73x, and the campaign settled on a
1-thread kernel at 7.4 ms where 2-thread ones at 4.1-4.2 ms exist. Lowering that work's priority (nice 19) was
not enough: the same campaign again settled on the same 1-thread kernel.

So a timing of a kernel that runs on this host (`timing(on_host=True)`: the cpu session's every bench, an engine's
timing in the benchmarker):
- waits for this process's host work in threads (`host_work()`: inputs drawn ahead, one set's draw or float64
  reference at a time) to end, and holds new such work off until it ends;
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
import sys
import threading
import time

from kfactory.observability.stagetime import span

_cond = threading.Condition()
_timings = 0                # host timings running
_waiting = 0                # host timings waiting for host work to end (they go first)
_host = 0                   # host work running in threads
_procs: set[int] = set()    # compilers running for this process
_stopped: list[int] = []    # the processes a running timing stopped
_since: dict[int, float] = {}      # per registered compiler stopped now, when (monotonic)
_stopped_s: dict[int, float] = {}  # per registered compiler, the seconds it spent stopped before
_guard: subprocess.Popen | None = None  # resumes what is stopped if this process dies (_start_guard)

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
        try:
            if _timings == 1:
                for pid in sorted(_procs):
                    _stop(pid)
        except BaseException:  # (a Ctrl-C while stopping): the timing never began, so nothing may stay stopped
            _end_timing()
            raise
    try:
        yield
    finally:
        with _cond:
            _end_timing()


def _end_timing() -> None:
    global _timings
    _timings -= 1
    if not _timings:
        _resume()
    _cond.notify_all()


@contextlib.contextmanager
def host_work():
    """Mark the block as work in this thread on this host's cores that would slow a host timing: it starts once
    no host timing runs or waits to run."""
    global _host
    with span("quiet"), _cond:  # the wait: time the kernels ran, not this work's own
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
        _stopped_s[pid] = 0.0
        try:
            if _timings:
                _stop(pid)
        except BaseException:
            _forget(pid)
            raise
    try:
        yield
    finally:
        with _cond:
            _forget(pid)


def _forget(pid: int) -> None:
    _procs.discard(pid)
    _stopped_s.pop(pid, None)
    _since.pop(pid, None)


def stopped_seconds(pid: int) -> float:
    """The seconds a registered compiler has spent stopped so far (a stop under way counts to now)."""
    with _cond:
        under_way = time.monotonic() - _since[pid] if pid in _since else 0.0
        return _stopped_s.get(pid, 0.0) + under_way


def run_compiler(cmd: list[str], timeout_s: float, stdin: str | None = None) -> tuple[int | None, str]:
    """(exit status, stderr) of a compiler run for this process (`stdin` its input), or (None, "") when it ran
    past `timeout_s` (then killed). It is stopped while a kernel is timed on this host (process()), so compiling
    ahead of the device never slows a timing; the time it spends stopped does not count toward its limit."""
    with subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        with process(proc.pid):
            start, data = time.monotonic(), stdin
            while True:
                left = start + timeout_s + stopped_seconds(proc.pid) - time.monotonic()
                try:
                    _, stderr = proc.communicate(data, timeout=max(left, 0.01))
                    break
                except subprocess.TimeoutExpired:
                    data = None  # sent already: a retried communicate() loses nothing
                    if start + timeout_s + stopped_seconds(proc.pid) > time.monotonic():
                        continue  # it was stopped for part of the time: its limit moves on by as much
                    proc.kill()
                    proc.communicate()
                    return None, ""
    return proc.returncode, stderr


def timed(on_host: bool, fn, *args):
    """fn(*args) as a timing (timing(on_host)): for work that times kernels in a child of its own (an engine)."""
    with timing(on_host):
        return fn(*args)


def _stop(pid: int) -> None:
    """SIGSTOP pid, then the processes it started, and wait until none of them runs (a signal takes effect when
    its process next runs, which may be a moment after kill() returns; a child it started meanwhile is found by
    the walk after its parent's stop took effect); remembered for _resume, and told to the guard first."""
    _since[pid] = time.monotonic()
    _start_guard()
    todo, stopping = [pid], []
    while todo:
        p = todo.pop()
        _tell_guard(str(p))
        if _signal(p, signal.SIGSTOP):
            stopping.append(p)
            _stopped.append(p)
            deadline = time.monotonic() + STOP_WAIT_S
            while _running(p) and time.monotonic() < deadline:
                time.sleep(0.001)
            todo.extend(c for c in _children(p) if c not in stopping)


def _resume() -> None:
    now = time.monotonic()
    for pid, since in _since.items():
        _stopped_s[pid] = _stopped_s.get(pid, 0.0) + (now - since)
    _since.clear()
    while _stopped:
        _signal(_stopped.pop(), signal.SIGCONT)
    _tell_guard("resumed")


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:  # it ended (or was reaped) since it was listed: nothing to stop or resume
        return False
    return True


def _state(pid: int) -> str:
    """A process's state letter from /proc/PID/stat ("" once it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):  # it ended (a read racing its reaping fails with ESRCH)
        return ""
    return stat.rsplit(")", 1)[1].split()[0]


def _running(pid: int) -> bool:
    """Whether `pid` is on a CPU or ready to be (R): one asleep or in disk wait stops before it runs again."""
    return _state(pid) == "R"


def _children(pid: int) -> list[int]:
    """The processes `pid`'s threads started (Linux's /proc/PID/task/TID/children, reliable once pid is stopped);
    none once it has ended."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except (FileNotFoundError, ProcessLookupError):  # it ended
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError):  # that thread (or the kernel's children file) is gone
            continue
    return out


#: the guard: a process of its own that holds the pids this process stopped and, should this process die while
#: they are stopped (killed, crashed), resumes them when its stdin closes, so that no compiler stays stopped
GUARD = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)   # (a group's SIGTERM, as timeout sends: it ends when stdin closes)
held = set()
for line in sys.stdin:
    word = line.strip()
    if word == "resumed":
        held.clear()
    elif word:
        held.add(int(word))
for pid in held:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
"""


def _start_guard() -> None:
    """The guard, started on the first stop (and again should it have died)."""
    global _guard
    if _guard is None or _guard.poll() is not None:
        _guard = subprocess.Popen([sys.executable, "-c", GUARD], stdin=subprocess.PIPE, text=True,
                                  stdout=subprocess.DEVNULL)


def _tell_guard(word: str) -> None:
    """Tell the guard a pid about to be stopped, or "resumed"."""
    if _guard is None or _guard.stdin is None or _guard.poll() is not None:
        return
    try:
        _guard.stdin.write(word + "\n")
        _guard.stdin.flush()
    except BrokenPipeError:  # it died since: the next stop starts another
        return


def state() -> tuple[int, int, int, int]:
    """(host timings running, host timings waiting, host work running, compilers stopped) now in this process."""
    with _cond:
        return _timings, _waiting, _host, len(_stopped)

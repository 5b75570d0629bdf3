"""Directories a process makes for its own use and removes when done, which a later process removes for it when it
died first (killed mid-compile, OOM-killed, stopped with SIGKILL): a compile's scratch directory, an engine build's,
the runner's shared-memory buffers. Each is named by its maker (pid namespace and pid) and locked by it while in
use, so the sweep never takes a directory some live process still uses, in this pid namespace or another (a
restarted container's predecessor, whose emptyDir or /tmp it inherits)."""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: an unlocked directory younger than this may be one whose maker has not locked it yet (microseconds after
#: mkdtemp): left for a later sweep
GRACE_S = 60.0
#: a directory named by no owner (made before owners were named) is removed only when unlocked and this old
LEGACY_S = 86400.0

_sweep_lock = threading.Lock()
_swept: set[tuple[Path, str]] = set()


def pid_namespace() -> str:
    """This process's pid namespace (its inode), so that a pid is only ever judged in the namespace it belongs to
    (containers may share a /dev/shm or a /tmp); "0" where /proc does not say."""
    try:
        link = os.readlink("/proc/self/ns/pid")   # "pid:[4026531836]"
    except OSError:
        return "0"
    digits = re.sub(r"\D", "", link)
    return digits or "0"


def _alive(pid: str) -> bool:
    """Whether a process of this namespace has this pid (a number no pid can be is no process)."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    except PermissionError:   # someone else's process: alive
        return True
    return True


def lock(directory: Path) -> int:
    """Hold an exclusive lock on a directory this process made, for as long as the returned descriptor is open
    (the kernel drops it when the process dies, however it dies, in whatever pid namespace)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _held(directory: Path) -> bool | None:
    """True when some process holds the directory's lock, False when none does, None when it is gone."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)   # (releases the lock taken just now)
    return False


def make_owned(base: Path, prefix: str) -> tuple[Path, int]:
    """A new directory under base named PREFIX-<pid namespace>-<pid>-<random>, and the descriptor that holds its
    lock (close it after removing the directory)."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-{pid_namespace()}-{os.getpid()}-", dir=base))
    return path, lock(path)


def sweep_stale(base: Path, prefix: str, grace_s: float = GRACE_S, legacy_s: float = LEGACY_S) -> int:
    """Remove the PREFIX-* directories under base that processes left when they died without removing them. A
    directory is its maker's while the maker holds its lock (lock), so one whose lock nobody holds is no process's.
    Left alone: a locked one, one of a live process of this namespace, one younger than grace_s (its maker may not
    have locked it yet), and one named by no owner (made before owners were named) younger than legacy_s. The
    number of directories removed."""
    owned = re.compile(rf"^{re.escape(prefix)}-(\d+)-(\d+)-")
    ns, removed, now = pid_namespace(), 0, time.time()
    for d in base.glob(glob.escape(prefix) + "-*"):   # (a prefix may hold a name such as "[x]")
        m = owned.match(d.name)
        if m is not None and m.group(1) == ns and _alive(m.group(2)):
            continue
        try:
            age = now - d.stat().st_mtime
        except FileNotFoundError:
            continue
        if age < (grace_s if m is not None else legacy_s) or _held(d) is not False:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed


def sweep_once(base: Path, prefix: str) -> None:
    """sweep_stale(base, prefix), the first time this process asks for that pair (a sweep lists the directory: once
    per process is enough, since what this process leaves it removes itself)."""
    with _sweep_lock:
        if (base, prefix) in _swept:
            return
        _swept.add((base, prefix))
        sweep_stale(base, prefix)


@contextlib.contextmanager
def owned_tempdir(prefix: str, base: Path | None = None) -> Iterator[Path]:
    """A scratch directory under base (default: the temporary directory) for the block's duration, removed after it;
    one left by a killed process is removed by the next process that makes one with this prefix there."""
    where = Path(base) if base is not None else Path(tempfile.gettempdir())
    sweep_once(where, prefix)
    path, fd = make_owned(where, prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)

"""Directories a process makes for its own use and removes when done, which a later process removes for it when it
died first (killed mid-compile, OOM-killed, stopped with SIGKILL): a compile's scratch directory, an engine build's,
an export's stage, the runner's shared-memory buffers.

Each is named by its maker (host, pid namespace, pid: PREFIX-<host>-<ns>-<pid>-<random>) and locked by it while in
use (flock), so the sweep never takes a directory some live process still uses:
- this host and pid namespace: the maker's pid tells (a dead maker's directory goes once GRACE_S old, whatever its
  lock says: on a filesystem that cannot lock a directory, NFS say, there is none);
- another pid namespace of this host (a restarted container's predecessor, whose emptyDir or /tmp it inherits): the
  lock tells, once GRACE_S old (a maker locks its directory microseconds after making it);
- another host (a data directory on a shared disk), or a name of no owner (made before owners were named): only
  when unlocked and LEGACY_S old, since a lock taken on another host may not be seen here.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import glob
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

#: an unlocked directory younger than this may be one whose maker has not locked it yet: left for a later sweep
GRACE_S = 60.0
#: another host's directory, or one named by no owner, is removed only when unlocked and this old
LEGACY_S = 86400.0
#: a long-running process sweeps a place again at most this often (what processes killed since then left)
SWEEP_EVERY_S = 600.0

#: what flock says on a filesystem that cannot lock a directory (NFS: ENOLCK, or EBADF for a read-only descriptor)
NO_LOCK = frozenset({errno.ENOLCK, errno.EBADF, errno.EINVAL, errno.EOPNOTSUPP})

_sweep_lock = threading.Lock()
_swept: dict[tuple[Path, str], float] = {}


def pid_namespace() -> str:
    """This process's pid namespace (its inode), so that a pid is only ever judged in the namespace it belongs to
    (containers may share a /dev/shm or a /tmp); "0" where /proc does not say."""
    try:
        link = os.readlink("/proc/self/ns/pid")   # "pid:[4026531836]"
    except OSError:
        return "0"
    digits = re.sub(r"\D", "", link)
    return digits or "0"


@functools.cache
def host_tag() -> str:
    """This host's boot, in 12 hex digits: pid namespace inodes repeat from host to host (the first one's is the
    same on every Linux), and a pid is only ever judged on the host that gave it. The boot id (new at each boot,
    as the pids are) where /proc has it, else the host's name."""
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        text = socket.gethostname()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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
    (the kernel drops it when the process dies, however it dies, in whatever pid namespace). Where the filesystem
    cannot lock a directory (NFS) the descriptor holds none: the name's pid still tells this host's sweeps."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in NO_LOCK:   # (BlockingIOError: someone else's already, not one this process just made)
            os.close(fd)
            raise
    return fd


def _held(directory: Path) -> bool | None:
    """True when some process holds the directory's lock, or when the filesystem cannot say (kept, then); False
    when none does; None when it is gone or cannot be opened (another user's)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:   # BlockingIOError: held; any other: this filesystem does not lock directories
        return True
    finally:
        os.close(fd)   # (releases the lock taken just now)
    return False


def make_owned(base: Path, prefix: str) -> tuple[Path, int]:
    """A new directory under base named PREFIX-<host>-<pid namespace>-<pid>-<random>, and the descriptor that holds
    its lock (close it after removing the directory)."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-{host_tag()}-{pid_namespace()}-{os.getpid()}-", dir=base))
    try:
        return path, lock(path)
    except BaseException:
        path.rmdir()
        raise


def _removable(d: Path, owner: re.Match | None, host: str, ns: str, now: float, grace_s: float,
               legacy_s: float) -> bool:
    """Whether the sweep may remove `d` (see the module's docstring)."""
    try:
        age = now - d.stat().st_mtime
    except FileNotFoundError:
        return False
    if owner is not None and owner.group(1) == host and owner.group(2) == ns:
        if not _alive(owner.group(3)):
            return age >= grace_s
        # a live pid whose directory is unlocked this long: the pid is another process's now, or its maker let go
        return age >= grace_s and _held(d) is False
    old_enough = legacy_s if owner is None or owner.group(1) != host else grace_s
    return age >= old_enough and _held(d) is False


def sweep_stale(base: Path, prefix: str, grace_s: float = GRACE_S, legacy_s: float = LEGACY_S) -> int:
    """Remove the PREFIX-* directories under base that processes left when they died without removing them (see
    the module's docstring for which those are); the number removed (one that could not be removed is not
    counted, and is tried again by the next sweep)."""
    owned = re.compile(rf"^{re.escape(prefix)}-([0-9a-f]+)-(\d+)-(\d+)-")
    host, ns, now, removed = host_tag(), pid_namespace(), time.time(), 0
    for d in base.glob(glob.escape(prefix) + "-*"):   # (a prefix may hold a name such as "[x]")
        if _removable(d, owned.match(d.name), host, ns, now, grace_s, legacy_s):
            shutil.rmtree(d, ignore_errors=True)
            removed += not d.exists()
    return removed


def sweep_once(base: Path, prefix: str) -> None:
    """sweep_stale(base, prefix), the first time this process asks for that pair and again when it asks
    SWEEP_EVERY_S later (a sweep lists the directory: what this process leaves it removes itself, what others
    killed meanwhile leave can wait that long). The sweep runs outside the module's lock: another pair's first
    use does not wait for it."""
    key, now = (base, prefix), time.monotonic()
    with _sweep_lock:
        if key in _swept and now - _swept[key] < SWEEP_EVERY_S:
            return
        _swept[key] = now
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

"""Ports for the servers that tests start: each pytest process claims a slice of ports of its own, outside the
kernel's ephemeral range, and hands them out in turn.

A port that `bind(0)` returned and was closed again stays free only until the next outgoing connection or
`bind(0)` anywhere on the host takes it. Under three workers that happened between choosing a service's metrics
port and starting the service (CI of stop 59: "cannot serve metrics on 0.0.0.0:36247: Address already in use"),
and a test that restarts a server on its port leaves the same gap open for as long as the server is down.

- The kernel hands out no port outside `ip_local_port_range` by itself, so no outgoing connection takes one.
- A slice is claimed with an exclusive lock on a file of its own (SLICE_DIR/slice-K), held for the process's
  whole life: no other pytest process of the user, of this session (xdist workers, the serial phase) or of
  another one running beside it on the host, hands out the same ports.
- The bind check passes over a port that something else (a program that picked it by itself) holds now.
"""
from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path
from typing import IO

#: below this, ports are left to the well-known and registered services a host may run
_LOWEST = 10000
#: ports a slice: a process hands out every one of them before it comes back to the first
_SLICE = 500
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: the slices' lock files: one directory a user (another user's could not be written to), so two users' sessions
#: on one host share only the bind check
SLICE_DIR = Path(tempfile.gettempdir()) / f"kfactory-test-ports-{os.getuid()}"


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself, first and last (32768-60999 where /proc does not say)."""
    try:
        low, high = _RANGE_FILE.read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _span() -> range:
    """The ports outside the ephemeral range that tests draw from: below it, or above it where a host's range
    starts low (some containers start it at 1024) and leaves more room there."""
    low, high = _ephemeral_range()
    below, above = range(_LOWEST, max(low, _LOWEST)), range(high + 1, 65536)
    return below if len(below) >= len(above) else above


def _claim(locks: list[IO[str]]) -> range:
    """The first slice no other process holds, locked for as long as this process lives (the open file goes in
    `locks`); RuntimeError, saying why, when there is none."""
    span = _span()
    count = len(span) // _SLICE
    if count == 0:
        raise RuntimeError(f"no room for test ports outside the ephemeral range {_ephemeral_range()}: widen "
                           f"{_RANGE_FILE} to leave {_SLICE} ports free below or above it")
    SLICE_DIR.mkdir(mode=0o700, exist_ok=True)
    if SLICE_DIR.stat().st_uid != os.getuid():   # another user's, made first: its locks are not ours to trust
        raise RuntimeError(f"{SLICE_DIR} belongs to another user: remove it, or set TMPDIR elsewhere")
    for k in range(count):
        f = open(SLICE_DIR / f"slice-{k}", "a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:   # another test process has it
            f.close()
            continue
        locks.append(f)
        return range(span.start + k * _SLICE, span.start + (k + 1) * _SLICE)
    raise RuntimeError(f"all {count} slices of test ports are claimed by other test processes (locks in "
                       f"{SLICE_DIR}); run fewer at once")


class _Allocator:
    """Hands out the ports of its slice in turn from a random start, so a port comes back only after the whole
    slice has been handed out (a chosen port's server may not have bound it yet)."""

    def __init__(self, ports: range):
        self.ports = ports
        self.next = random.SystemRandom().randrange(len(ports))   # not the `random` a test may have seeded

    def take(self) -> int:
        for _ in range(len(self.ports)):
            port = self.ports[self.next % len(self.ports)]
            self.next += 1
            if _bindable(port):
                return port
        raise RuntimeError(f"no free port in {self.ports.start}-{self.ports.stop - 1}: every one is held")


def _bindable(port: int) -> bool:
    """Whether nothing holds `port` on any IPv4 address (the servers tests start listen on IPv4; a wildcard
    bind conflicts with holders of 127.0.0.1 and of 0.0.0.0 alike, and with a closed socket's TIME_WAIT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


_locks: list[IO[str]] = []
_allocator: _Allocator | None = None


def free_port() -> int:
    """A TCP port that no one holds now, and that no other test process, nor the kernel, will hand out."""
    global _allocator
    if _allocator is None:
        _allocator = _Allocator(_claim(_locks))
    return _allocator.take()

"""Ports for the servers that tests start: each pytest process draws from a slice of its own, outside the kernel's
ephemeral range.

A port that `bind(0)` returned and was closed again stays free only until the next outgoing connection or
`bind(0)` anywhere on the host takes it. Under three workers that happened between choosing a service's metrics
port and starting the service (CI of stop 59: "cannot serve metrics on 0.0.0.0:36247: Address already in use").
The kernel never hands out ports outside `ip_local_port_range` on its own, and each xdist worker draws from its own
slice in turn, so the ports one process chose do not collide with each other, with another worker's or with
anyone's outgoing connections; the bind check skips a port that something (a server a test left running, another
program on the host) already holds."""
from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_LOWEST = 10000
_SLICE = 1500
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


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


def _slice() -> range:
    """This process's ports: the serial session (no xdist worker) takes the first slice, worker gwN the N+1-th."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    span = _span()
    size = min(_SLICE, len(span))
    start = span.start + (index % max(1, len(span) // size)) * size
    return range(start, start + size)


class _Allocator:
    """Hands out the ports of its slice in turn from a random start, so a port comes back only after the whole
    slice has been handed out (a chosen port's server may not have bound it yet)."""

    def __init__(self) -> None:
        self.ports = _slice()
        self.next = random.randrange(len(self.ports))

    def take(self) -> int:
        for _ in range(len(self.ports)):
            port = self.ports[self.next % len(self.ports)]
            self.next += 1
            if _bindable(port):
                return port
        raise RuntimeError(f"no free port in {self.ports.start}-{self.ports.stop - 1}: every one is held")


def _bindable(port: int) -> bool:
    """Whether nothing holds `port` on any address (the metrics server binds 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


_allocator: _Allocator | None = None


def free_port() -> int:
    """A TCP port that no one holds now and that no other test process, nor the kernel, will hand out."""
    global _allocator
    if _allocator is None:
        _allocator = _Allocator()
    return _allocator.take()

"""The test servers' port allocator: ports outside the kernel's ephemeral range, distinct within a process and
between workers, and never one that something holds."""
from __future__ import annotations

import socket

import ports


def test_ports_are_distinct_outside_the_ephemeral_range_and_in_this_workers_slice():
    taken = [ports.free_port() for _ in range(50)]
    assert len(set(taken)) == 50
    low, high = ports._ephemeral_range()
    assert all(not low <= p <= high for p in taken)
    assert all(p in ports._slice() for p in taken)


def test_workers_draw_from_slices_that_do_not_overlap(monkeypatch):
    seen = []
    for worker in ["", "gw0", "gw1", "gw2"]:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        seen.append(set(ports._slice()))
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])


def test_a_held_port_is_skipped():
    alloc = ports._Allocator()
    alloc.next = 0
    with socket.socket() as holder:
        holder.bind(("", alloc.ports[0]))
        assert alloc.take() == alloc.ports[1]   # the one held is passed over, the next handed out


def test_a_host_whose_ephemeral_range_starts_low_draws_above_it(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 50000))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert ports._slice().start > 50000 and ports._slice().stop <= 65536

"""The test servers' port allocator: ports outside the kernel's ephemeral range, from a slice each process claims
for its life, distinct within a process and between processes, and never one that something holds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ports

HERE = Path(__file__).parent


def test_ports_are_distinct_outside_the_ephemeral_range_and_in_this_process_slice():
    taken = [ports.free_port() for _ in range(50)]
    assert len(set(taken)) == 50
    low, high = ports._ephemeral_range()
    assert all(not low <= p <= high for p in taken)
    assert ports._allocator is not None and all(p in ports._allocator.ports for p in taken)


def test_another_process_claims_another_slice_and_gets_it_back_when_this_one_ends(tmp_path, monkeypatch):
    """Two pytest processes at once (xdist workers, or two sessions on one host) never share a slice; a slice is
    free again once the process that held it has ended."""
    monkeypatch.setattr(ports, "SLICE_DIR", tmp_path)
    mine = ports._claim(locks := [])
    child = ("import sys, ports; ports.SLICE_DIR = __import__('pathlib').Path(sys.argv[1]); "
             "r = ports._claim([]); print(r.start, r.stop)")

    def theirs() -> range:
        out = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True,
                             cwd=HERE, check=True).stdout.split()
        return range(int(out[0]), int(out[1]))
    assert not set(theirs()) & set(mine)
    locks.pop().close()   # this process lets its slice go
    assert theirs() == mine


def test_a_held_port_is_skipped(monkeypatch):
    alloc = ports._Allocator(range(20000, 20010))
    alloc.next = 0
    monkeypatch.setattr(ports, "_bindable", lambda port: port != 20000)   # 20000 held by something else
    assert alloc.take() == 20001 and alloc.take() == 20002


def test_a_host_whose_ephemeral_range_starts_low_draws_above_it_and_one_without_room_says_so(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 50000))
    assert ports._span().start == 50001 and ports._span().stop == 65536
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(RuntimeError, match="no room for test ports outside the ephemeral range"):
        ports._claim([])

"""Arenas made before the device is held (kfactory.sandbox.shm.ArenaRing.ready, Session.ready_buffers): a ring
grown ahead hands the next requests arenas they need not grow; an arena grows in place, so what requests handed
out stays readable and no second file is held beside it; an arena in use is left alone, and a growth a request
comes to want gives way; the work comes in pieces; a full filesystem stops it and leaves the arena as it was, for
the request to meet, typed; growth in another thread beside requests loses nothing; and a measurement drawn
ahead makes no file under its timings, its runner child mapping the grown arenas again."""
from __future__ import annotations

import contextlib
import math
import os
import subprocess
import threading
import time

import numpy as np
import pytest

from kfactory.judge import rotated
from kfactory.judge.checks import InputPool, n_sets
from kfactory.judge.measure import drawn_ahead
from kfactory.sandbox import shm
from kfactory.sandbox.shm import ArenaRing, SharedMemoryFull, ShmBuffers
from kfactory.sandbox.shm_args import bench_bytes
from test_rotated import loaded, problem  # noqa: F401 (fixtures)
from test_shm_hygiene import _tiny_tmpfs

MIB = 1 << 20
ALIGN = ShmBuffers.ALIGN


def _files(ring: ArenaRing) -> dict[str, int]:
    """Every file the ring's arenas hold, with its size."""
    return {str(f): f.stat().st_size for a in ring.arenas for f in a.dir.iterdir()}


def _counting():
    pieces = [0]

    @contextlib.contextmanager
    def piece():
        pieces[0] += 1
        yield
    return piece, pieces


def test_a_ring_grown_ahead_hands_out_arenas_that_need_no_new_file(monkeypatch):
    monkeypatch.setattr(shm, "GROW_PIECE", MIB)
    piece, pieces = _counting()
    ring = ArenaRing(64 * MIB)
    try:
        assert ring.ready([2 * MIB, 8 * MIB, 128 * MIB], piece) == 3   # the largest that fits
        made = _files(ring)
        assert sorted(made.values()) == [8 * MIB + ALIGN] * 3
        # allocated, then mapped in, a MiB at a time: a timing waits for one piece at most
        assert pieces[0] == 3 * 2 * math.ceil((8 * MIB + ALIGN) / MIB)
        for _ in range(3):
            with shm.request_buffers(ring, 8 * MIB, reserve=True) as (bufs, keep):
                bufs.new((2 * MIB,), "float32")
                assert set(keep) == set(made)
        assert _files(ring) == made
        assert ring.ready([8 * MIB], piece) == 0   # nothing left to grow
    finally:
        ring.close()


def test_an_arena_grows_in_place_and_what_it_handed_out_stays_readable():
    ring = ArenaRing(64 * MIB)
    try:
        pattern = np.arange(1, MIB // 4 + 1, dtype=np.float32)   # every page of the old file, none zero
        with shm.request_buffers(ring, MIB, reserve=True) as (bufs, _):
            path = bufs.path()
            _, _, view = bufs.new(pattern.shape, "float32")
            view[:] = pattern
        assert ring.ready([16 * MIB], contextlib.nullcontext) == 3
        assert bufs.path() == path and os.path.getsize(path) == 16 * MIB + ALIGN
        assert len(_files(ring)) == 3   # no old file beside a grown one
        np.testing.assert_array_equal(view, pattern)   # the old mapping
        np.testing.assert_array_equal(np.fromfile(path, np.float32, pattern.size), pattern)   # the file
    finally:
        ring.close()


def test_an_arena_in_use_is_left_to_grow_when_it_is_taken():
    ring = ArenaRing(64 * MIB)
    try:
        first = ring.take(MIB)
        small = os.path.getsize(first.path())
        assert ring.ready([4 * MIB], contextlib.nullcontext) == 2
        assert os.path.getsize(first.path()) == small
        ring.release(first)
        assert ring.ready([4 * MIB], contextlib.nullcontext) == 1
        assert os.path.getsize(first.path()) == 4 * MIB + ALIGN
    finally:
        ring.close()


@pytest.mark.parametrize("before, blocked_piece", [(0, 1), (MIB, 32)])
def test_a_growth_gives_way_to_a_request_that_wants_its_arena(monkeypatch, before, blocked_piece):
    """Stopped inside its first piece (a new file), or in the pass that maps pages in after 31 pieces of
    allocation (a file grown in place from 1 MiB): the file is as it was, and the request makes what it needs."""
    monkeypatch.setattr(shm, "GROW_PIECE", MIB)
    ring = ArenaRing(64 * MIB, count=1)
    if before:
        with shm.request_buffers(ring, before, reserve=True) as (bufs, _):
            _, _, view = bufs.new((1024,), "float32")
            view[:] = 7
    started, go = threading.Event(), threading.Event()
    pieces = [0]

    @contextlib.contextmanager
    def piece():
        pieces[0] += 1
        if pieces[0] == blocked_piece:
            started.set()
            assert go.wait(10)
        yield

    try:
        grower = threading.Thread(target=lambda: ring.ready([32 * MIB], piece))
        grower.start()
        assert started.wait(10)   # the growth holds the arena, inside that piece
        taken: list = []
        taker = threading.Thread(target=lambda: taken.append(ring.take(MIB)))
        taker.start()
        arena = ring.arenas[0]
        deadline = time.monotonic() + 10
        while not arena.wanting:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        go.set()
        grower.join(10)
        taker.join(10)
        assert taken == [arena] and pieces[0] == blocked_piece
        assert list(_files(ring).values()) == [max(before, MIB) + ALIGN]
        if before:
            np.testing.assert_array_equal(view, 7)
        ring.release(arena)
    finally:
        go.set()
        ring.close()


def test_a_request_over_the_rings_limit_makes_nothing_ahead():
    ring = ArenaRing(4 * MIB)
    assert ring.ready([8 * MIB], contextlib.nullcontext) == 0
    assert ring.arenas == []


def test_a_full_filesystem_stops_the_growth_and_leaves_the_arena_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "GROW_PIECE", 128 << 10)   # pieces that fit before one does not
    mnt = _tiny_tmpfs(tmp_path)
    ring = ArenaRing(64 * MIB, count=1, base=mnt)
    try:
        with shm.request_buffers(ring, 256 << 10, reserve=True) as (bufs, _):
            path = bufs.path()
        assert ring.ready([4 * MIB], contextlib.nullcontext) == 0   # no exception here
        assert _files(ring) == {path: (256 << 10) + ALIGN}   # cut back: the arena still serves what it did
        with shm.request_buffers(ring, 256 << 10, reserve=True) as (bufs, _):
            assert bufs.path() == path
        with pytest.raises(SharedMemoryFull, match="MiB free"):
            ring.take(4 * MIB)
    finally:
        ring.close()
        subprocess.run(["umount", str(mnt)], check=True)


def test_growth_beside_requests_in_another_thread_loses_nothing():
    ring = ArenaRing(64 * MIB)
    stop = threading.Event()

    def grow():
        size = MIB
        while not stop.is_set() and size <= 32 * MIB:
            ring.ready([size], contextlib.nullcontext)
            size += MIB

    grower = threading.Thread(target=grow)
    grower.start()
    try:
        for i in range(60):
            with shm.request_buffers(ring, MIB, reserve=True) as (bufs, keep):
                _, _, view = bufs.new((MIB // 8,), "float64")
                view[:] = i
                assert all(os.path.exists(p) for p in keep)
                assert float(view.sum()) == i * (MIB // 8)
    finally:
        stop.set()
        grower.join(30)
        ring.close()
    assert not grower.is_alive()


def test_a_measurement_drawn_ahead_makes_no_file_under_its_timings(loaded, problem, settings):  # noqa: F811
    target, session = loaded
    shape = problem.shapes("optimize")[0]
    needed = bench_bytes(problem, shape, 2, n_sets(problem, shape, target.cache_bytes(), kernels=2))
    if session.ring is None or needed > session.ring.max_bytes:
        pytest.skip("this host's /dev/shm gives the ring no arena that large")
    pool = InputPool(problem, 1)
    x, _, _ = pool.get(shape, "normal")
    for _ in range(3):   # one call each: the runner child now maps all three arenas, each one set's size
        session.call("ref", shape, x)
    before = _files(session.ring)
    assert len(before) == 3
    view = drawn_ahead(session, problem, [shape], pool, target.cache_bytes(), kernels=2)
    grown = _files(session.ring)
    assert set(grown) == set(before) and all(grown[p] > before[p] for p in grown)   # in place
    out = rotated.measure_rotated(session, ["ref", "numpy"], problem, shape, view, target.cache_bytes(),
                                  settings, 0.4)
    assert not out.reason, out.message   # the child mapped the grown files again, whole
    assert _files(session.ring) == grown

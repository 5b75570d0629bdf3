"""Arenas made before the device is held (kfactory.sandbox.shm.ArenaRing.ready, Session.ready_buffers): a ring
grown ahead hands the next requests arenas they need not grow; an arena in use is left alone; the work comes in
pieces a timing can wait between; what requests handed out stays readable; a full filesystem stops it quietly,
for the request to meet, typed; and a measurement drawn ahead makes no file during its timings."""
from __future__ import annotations

import contextlib
import math
import os
import subprocess

import numpy as np
import pytest

from kfactory.judge import rotated
from kfactory.judge.checks import InputPool
from kfactory.judge.measure import drawn_ahead
from kfactory.problems import load_problem
from kfactory.sandbox import shm
from kfactory.sandbox.shm import ArenaRing, SharedMemoryFull
from kfactory.targets import get_target
from test_shm_hygiene import _tiny_tmpfs

MIB = 1 << 20


def _files(ring: ArenaRing) -> set[str]:
    return {str(f) for a in ring.arenas for f in a.dir.iterdir()}


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
        assert ring.ready(8 * MIB, piece) == 3
        made = _files(ring)
        assert len(made) == 3 and all(os.path.getsize(f) >= 8 * MIB for f in made)
        # allocated, then mapped in, a MiB at a time: a timing waits for one piece at most
        assert pieces[0] == 3 * 2 * math.ceil((8 * MIB + shm.ShmBuffers.ALIGN) / MIB)
        for _ in range(3):
            with shm.request_buffers(ring, 8 * MIB, reserve=True) as (bufs, keep):
                bufs.new((2 * MIB,), "float32")
                assert set(keep) == made
        assert _files(ring) == made
        assert ring.ready(8 * MIB, piece) == 0   # nothing left to grow
    finally:
        ring.close()


def test_an_arena_in_use_is_left_to_grow_when_it_is_taken():
    ring = ArenaRing(64 * MIB)
    try:
        first = ring.take(MIB)
        small = first.path()
        assert ring.ready(4 * MIB, contextlib.nullcontext) == 2
        assert first.path() == small and os.path.getsize(small) < 4 * MIB
        ring.release(first)
        assert ring.ready(4 * MIB, contextlib.nullcontext) == 1
        assert os.path.getsize(first.path()) >= 4 * MIB
    finally:
        ring.close()


def test_what_a_request_handed_out_stays_readable_when_its_arena_grows():
    ring = ArenaRing(64 * MIB)
    try:
        with shm.request_buffers(ring, MIB, reserve=True) as (bufs, _):
            _, _, view = bufs.new((1024,), "float32")
            view[:] = np.arange(1024, dtype=np.float32)
        assert ring.ready(16 * MIB, contextlib.nullcontext) == 3
        np.testing.assert_array_equal(view, np.arange(1024, dtype=np.float32))
    finally:
        ring.close()


def test_a_request_over_the_rings_limit_makes_nothing_ahead():
    ring = ArenaRing(4 * MIB)
    assert ring.ready(8 * MIB, contextlib.nullcontext) == 0
    assert ring.arenas == []


def test_a_full_filesystem_stops_the_growth_for_the_request_to_meet_typed(tmp_path):
    mnt = _tiny_tmpfs(tmp_path)
    ring = ArenaRing(64 * MIB, base=mnt)
    try:
        assert ring.ready(4 * MIB, contextlib.nullcontext) == 0   # no exception here
        with pytest.raises(SharedMemoryFull, match="MiB free"):
            ring.take(4 * MIB)
    finally:
        ring.close()
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_measurement_drawn_ahead_makes_no_file_under_its_timings(settings, small_softmax):
    problem = load_problem(small_softmax)
    target = get_target("cpu", settings)
    session = target.session(problem, 2)
    try:
        source, flags = problem.reference_source("cpu")
        res = target.compile(source, "c", flags, "kernel")
        session.load_artifact("ref", res.artifact, "kernel")
        session.load_baseline("numpy", "numpy")
        shape = problem.shapes("optimize")[0]
        pool = drawn_ahead(session, problem, [shape], InputPool(problem, 1), target.cache_bytes(), kernels=2)
        made = _files(session.ring)
        assert len(made) == 3
        out = rotated.measure_rotated(session, ["ref", "numpy"], problem, shape, pool, target.cache_bytes(),
                                      settings, 0.4)
        assert not out.reason, out.message
        assert _files(session.ring) == made
    finally:
        session.close()

"""Shared memory left by a process that died (kfactory.sandbox.shm.sweep_stale), and a shared-memory filesystem too
small for a request (SharedMemoryFull): a killed service's buffers are freed by the next process that uses shared
memory, in its pid namespace or another (a directory is its maker's while the maker holds its lock), a live one's
are never touched (the sweep's other cases: tests/test_scratch.py), and a full /dev/shm is an error that says what
to fix, not a SIGBUS."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from kfactory.sandbox.shm import ShmBuffers, SharedMemoryFull, sweep_stale

MAKE = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kfactory.sandbox.shm import ShmBuffers
    bufs = ShmBuffers(Path(sys.argv[1]))
    bufs.new((1024,), "float32")
    print(bufs.dir, flush=True)
    time.sleep(60)
""")


def _owner(base) -> tuple[subprocess.Popen, str]:
    """A process that made a buffer directory under base and holds it (sleeping); (process, its directory)."""
    proc = subprocess.Popen([sys.executable, "-c", MAKE, str(base)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def test_a_killed_process_s_directory_is_swept_and_a_live_one_s_is_kept(tmp_path):
    live, live_dir = _owner(tmp_path)
    dead, dead_dir = _owner(tmp_path)
    try:
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait(10)
        assert os.path.isdir(dead_dir)
        assert sweep_stale(tmp_path) == 0   # within the grace a maker may not have locked its directory yet
        assert sweep_stale(tmp_path, grace_s=0) == 1
        assert not os.path.exists(dead_dir) and os.path.isdir(live_dir)
        assert os.listdir(live_dir), "the live process's file was touched"
    finally:
        live.kill()
        live.wait(10)
    assert sweep_stale(tmp_path, grace_s=0) == 1 and not os.path.exists(live_dir)


def test_an_arena_that_does_not_fit_is_forgotten(tmp_path):
    """A rewind to a larger arena deletes the old file first; when the new one does not fit, the arena names no
    file (a later, smaller request makes a fresh one instead of sending the deleted path to the runner)."""
    mnt = _tiny_tmpfs(tmp_path)
    try:
        with ShmBuffers(mnt) as bufs:
            bufs.reserve(256 << 10)
            with pytest.raises(SharedMemoryFull):
                bufs.rewind(4 << 20)
            assert bufs.path() == ""
            bufs.rewind(128 << 10)
            assert os.path.exists(bufs.path())
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _tiny_tmpfs(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    return mnt


def test_a_full_shared_memory_filesystem_is_a_clear_harness_error(tmp_path):
    mnt = _tiny_tmpfs(tmp_path)
    try:
        with ShmBuffers(mnt) as bufs:
            bufs.new((1024,), "float32")   # fits
            with pytest.raises(SharedMemoryFull, match=r"MiB free .* need 4 MiB: .*medium: Memory"):
                bufs.reserve(4 << 20)
            assert len(os.listdir(bufs.dir)) == 1   # the file that did not fit is gone
            bufs.new((1024,), "float32")   # and the process goes on
    finally:
        subprocess.run(["umount", str(mnt)], check=True)

"""Shared memory left by a process that died (kfactory.sandbox.shm.sweep_stale), and a shared-memory filesystem too
small for a request (SharedMemoryFull): a killed service's buffers are freed by the next process that uses shared
memory, a live one's are never touched, and a full /dev/shm is an error that says what to fix, not a SIGBUS."""
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
        other = tmp_path / "kf-shm-somebody-else"   # not named by an owner: never judged
        other.mkdir()
        assert os.path.isdir(dead_dir)
        assert sweep_stale(tmp_path) == 1
        assert not os.path.exists(dead_dir) and os.path.isdir(live_dir) and other.is_dir()
        assert os.listdir(live_dir), "the live process's file was touched"
    finally:
        live.kill()
        live.wait(10)
    assert sweep_stale(tmp_path) == 1 and not os.path.exists(live_dir)


def test_a_directory_of_another_pid_namespace_is_left_alone(tmp_path):
    # named for a pid namespace that is not ours: its pid means nothing here, whether or not one is running
    foreign = tmp_path / f"kf-shm-1-{2**22 + 7}-abcd"
    foreign.mkdir()
    assert sweep_stale(tmp_path) == 0 and foreign.is_dir()


def test_a_full_shared_memory_filesystem_is_a_clear_harness_error(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    try:
        with ShmBuffers(mnt) as bufs:
            bufs.new((1024,), "float32")   # fits
            with pytest.raises(SharedMemoryFull, match=r"MiB free .* need 4 MiB: .*medium: Memory"):
                bufs.reserve(4 << 20)
            assert len(os.listdir(bufs.dir)) == 1   # the file that did not fit is gone
            bufs.new((1024,), "float32")   # and the process goes on
    finally:
        subprocess.run(["umount", str(mnt)], check=True)

"""Scratch directories a killed process leaves (kfactory.platform.scratch): a compile or an engine build killed
midway leaves its directory, and the next one in that place removes it; a directory is its maker's while the maker
holds its lock, whatever pid namespace named it, and a live one's is never touched."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from kfactory.platform import scratch

PREFIXES = ("kf-shm", "kf-cc", "kf-engine")

#: a compiler that, asked to write an object (-o), says so in the file $HANGING and hangs: a compile in progress, to
#: be killed; anything else (its version, its predefined macros) cc answers
# (-### is the compile cache asking which programs a compile runs: tests/test_cpu_cache.py)
HANGING_CC = ('#!/bin/sh\ncase " $* " in *" -### "*) exec cc "$@";; *" -o "*) touch "$HANGING"; exec sleep 120;; '
              'esac\nexec cc "$@"\n')

CPU_COMPILE = textwrap.dedent("""
    import sys, tempfile
    tempfile.tempdir = sys.argv[1]
    from kfactory.platform.config import Settings
    from kfactory.targets.cpu.target import CpuTarget
    CpuTarget(Settings()).compile("void k(void) {}\\n", "c", "-O2", "k")
""")
ENGINE_BUILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from kfactory.engines.build import build
    build("int f(void) { return 0; }\\n", Path(sys.argv[1]))
""")


def _aged(d: Path, seconds: float) -> Path:
    d.mkdir()
    os.utime(d, (time.time() - seconds, time.time() - seconds))
    return d


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_directory_of_another_namespace_is_judged_by_its_lock(tmp_path, prefix):
    """A restarted container inherits its predecessor's /dev/shm or /tmp (an emptyDir) but not its pid namespace: a
    directory named for another namespace of this host is its maker's while the lock is held (here by this process,
    standing in for a live process of that namespace) and no one's once it is released."""
    foreign = tmp_path / f"{prefix}-{scratch.host_tag()}-1-{2**22 + 7}-abcd"
    foreign.mkdir()
    fd = scratch.lock(foreign)
    try:
        assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 0 and foreign.is_dir()
    finally:
        os.close(fd)
    assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 1 and not foreign.exists()
    other = tmp_path / f"kf-other-{scratch.host_tag()}-1-{2**22 + 7}-abcd"   # another prefix's: not this sweep's
    other.mkdir()
    assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 0 and other.is_dir()


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_dead_maker_of_this_namespace_is_told_by_its_pid_after_the_grace(tmp_path, prefix):
    """No pid can be 10**20 (os.kill overflows): its maker is dead, lock or no lock (a filesystem that cannot lock a
    directory holds none), once the grace for a maker that has not locked it yet is over."""
    dead = tmp_path / f"{prefix}-{scratch.host_tag()}-{scratch.pid_namespace()}-{10**20}-x"
    dead.mkdir()
    fd = scratch.lock(dead)
    try:
        assert scratch.sweep_stale(tmp_path, prefix) == 0 and dead.is_dir()
        assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 1 and not dead.exists()
    finally:
        os.close(fd)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_another_host_s_directory_is_removed_only_when_old_and_unlocked(tmp_path, prefix):
    """A data directory on a disk that several hosts mount: pid namespace inodes repeat from host to host, so a pid
    of another host's is never judged here, and its lock may not be seen here."""
    ns = scratch.pid_namespace()
    recent = _aged(tmp_path / f"{prefix}-{'0' * 12}-{ns}-{10**20}-a", 3600)
    old = _aged(tmp_path / f"{prefix}-{'0' * 12}-{ns}-{10**20}-b", scratch.LEGACY_S + 60)
    assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 1
    assert recent.is_dir() and not old.exists()


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_directory_named_by_no_owner_is_removed_only_when_old_and_unlocked(tmp_path, prefix):
    legacy = tmp_path / f"{prefix}-2ikc_9hi"
    legacy.mkdir()
    (legacy / "f").write_bytes(b"x")
    assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 0 and legacy.is_dir()
    day_ago = time.time() - scratch.LEGACY_S - 60
    os.utime(legacy, (day_ago, day_ago))
    assert scratch.sweep_stale(tmp_path, prefix, grace_s=0) == 1 and not legacy.exists()


def test_an_owned_directory_is_removed_after_its_block_even_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError):
        with scratch.owned_tempdir("kf-cc", tmp_path) as d:
            assert d.name.startswith(f"kf-cc-{scratch.host_tag()}-{scratch.pid_namespace()}-{os.getpid()}-")
            (d / "k.c").write_text("x")
            assert scratch.sweep_stale(tmp_path, "kf-cc", grace_s=0) == 0   # a live process's: kept
            raise RuntimeError("the block failed")
    assert not d.exists() and os.listdir(tmp_path) == []


def _killed_midway(script: str, base: Path, prefix: str, env: dict[str, str]) -> Path:
    """Run `script` BASE in a child until its compiler hangs (HANGING_CC), kill it and the compiler with SIGKILL,
    and return the PREFIX-* directory it left under base."""
    hanging = base.parent / "hanging"
    proc = subprocess.Popen([sys.executable, "-c", script, str(base)], start_new_session=True,
                            env={**os.environ, **env, "HANGING": str(hanging)})
    try:
        deadline = time.monotonic() + 60
        while not hanging.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, f"the child exited with {proc.returncode} before its compiler ran"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    left = list(base.glob(f"{prefix}-*"))
    assert hanging.exists() and len(left) == 1, "the child's compiler never ran, or it made no directory"
    two_minutes_ago = time.time() - 120   # the grace, for a directory whose maker may not have locked it yet, is past
    os.utime(left[0], (two_minutes_ago, two_minutes_ago))
    return left[0]


@pytest.fixture
def hanging_cc(tmp_path) -> Path:
    cc = tmp_path / "hanging-cc"
    cc.write_text(HANGING_CC)
    cc.chmod(0o755)
    return cc


def test_a_compile_killed_midway_leaves_a_directory_the_next_compile_removes(tmp_path, hanging_cc, monkeypatch):
    from kfactory.platform.config import Settings
    from kfactory.targets.cpu.target import CpuTarget

    base = tmp_path / "tmp"
    base.mkdir()
    data = {"KFACTORY_DATA_DIR": str(tmp_path / "data")}
    left = _killed_midway(CPU_COMPILE, base, "kf-cc", {"KFACTORY_CC": str(hanging_cc), **data})
    assert (left / "k.c").is_file()

    monkeypatch.setattr(tempfile, "tempdir", str(base))
    monkeypatch.delenv("KFACTORY_CPU_OBJECT_CACHE")   # compiled for real, not read from the session's cache
    target = CpuTarget(Settings(cc="cc", data_dir=tmp_path / "data"))
    result = target.compile("int k(void) { return 1; }\n", "c", "-O2", "k")
    assert result.ok and result.artifact
    assert os.listdir(base) == [], "the killed compile's directory, or this one's, is still there"


def test_an_engine_build_killed_midway_leaves_a_directory_the_next_build_removes(tmp_path, hanging_cc, monkeypatch):
    from kfactory.engines.build import build

    cache = tmp_path / "cache"
    cache.mkdir()
    _killed_midway(ENGINE_BUILD, cache, "kf-engine", {"CC": str(hanging_cc)})

    monkeypatch.setenv("CC", "cc")
    monkeypatch.delenv("KFACTORY_ENGINE_OBJECT_CACHE", raising=False)   # (the session's may hold this object)
    result = build("int g(void) { return 2; }\n", cache)
    assert result.ok and not result.cached
    assert not list(cache.glob("kf-engine-*")), "the killed build's directory, or this one's, is still there"


def test_a_prefix_with_glob_characters_sweeps_its_own_directories_alone(tmp_path):
    """An export's stage is named after the user's --out, which may hold [ ] or *: read as a pattern, ".a[b]"
    would match ".ab" (another export's) and not itself."""
    host = scratch.host_tag()
    own, other = tmp_path / f".a[b].kf-export-{host}-1-7-x", tmp_path / f".ab.kf-export-{host}-1-7-x"
    own.mkdir()
    other.mkdir()
    assert scratch.sweep_stale(tmp_path, ".a[b].kf-export", grace_s=0) == 1
    assert not own.exists() and other.is_dir()


def test_a_killed_run_s_nats_store_is_removed_by_the_next_embedded_server(tmp_path, monkeypatch):
    """`kfactory run` starts a nats-server over a store in /tmp (kf-nats-*): killed, it left the store for good."""
    from kfactory.bus.natsd import EmbeddedNats

    made = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, signal, sys, tempfile
        tempfile.tempdir = sys.argv[1]
        from kfactory.bus.natsd import EmbeddedNats
        print(EmbeddedNats().store_dir, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """), str(tmp_path)], capture_output=True, text=True, timeout=60)
    left = Path(made.stdout.strip())
    assert made.returncode == -signal.SIGKILL and left.is_dir() and left.parent == tmp_path
    os.utime(left, (time.time() - 120, time.time() - 120))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = EmbeddedNats()
    assert not left.exists() and server.store_dir.is_dir()
    server.stop()
    assert os.listdir(tmp_path) == []


def test_a_nats_server_that_fails_to_start_says_why_and_leaves_no_store(tmp_path, monkeypatch):
    """Its error named nats.log in a store it then kept until the next run swept it; the error now carries the
    log's last words, and the store goes."""
    import socket

    from kfactory.bus.natsd import EmbeddedNats, NatsServerError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as taken:   # the port the server is told to listen on is someone else's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedNats(port=taken.getsockname()[1])
        with pytest.raises(NatsServerError, match=r"nats-server exited with 1: .*address already in use"):
            server.start()
    assert os.listdir(tmp_path) == []

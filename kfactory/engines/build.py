"""Compile a generated engine source into a shared object, cached by content.

The system C compiler (`cc`, or $CC / Settings.cc) builds `-O3 -march=native -fPIC -shared -fopenmp` (the
kernels' AVX2/FMA/F16C paths are chosen by -march=native; OpenMP runs the threads). The object lands in
<data_dir>/engines/<sha256 of compiler, flags and source>.so, its own sha256 beside it (.so.sha256): building the
same source again is a lookup, and an object that is not the one built (damaged since) is built again.
Where Settings.engine_object_cache names a directory, every build also looks there before it compiles, and leaves
what it built there (best effort: a failure to share is logged, never the build's): data directories on one host
(workspaces, a test's) build each engine once between them. It keeps a directory per processor as the compiler
sees it (-march=native), and is used only while it belongs to this user and no one else may write to it (an
object planted there would run as the user).
A compile failure is a `BuildResult` with ok False and the compiler's log, never an exception; only a
missing compiler, an unwritable cache directory or a compiler stopped from outside (CompilerInterrupted: the
environment, not the source) raises.
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kfactory.judge import quiet
from kfactory.observability.log import get_logger
from kfactory.platform import scratch
from kfactory.platform.fsutil import atomic_write, others_may_write
from kfactory.targets.base import check_not_interrupted
from kfactory.targets.cpu.cpuinfo import native_tag

#: flags of every engine build; -z defs makes an unresolved symbol a build failure, not a load failure
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fopenmp")
LINK = ("-Wl,-z,defs", "-lm")
COMPILE_TIMEOUT_S = 180

log = get_logger("engines")


@dataclass(frozen=True)
class BuildResult:
    """What a build produced: `ok` and the object's `path`, or the failure's `log`; `cached` when the object
    was already there (in the data directory's cache, or copied from the host's shared one); `seconds` the
    compiler's run (0 when cached); `command` as run."""
    ok: bool
    path: Path | None
    log: str
    seconds: float
    cached: bool
    command: str


def default_cache_dir() -> Path:
    from kfactory.platform.config import Settings
    return Path(Settings().data_dir) / "engines"


def compiler() -> str:
    """The C compiler: $CC when set, else Settings.cc (cc)."""
    if os.environ.get("CC"):
        return os.environ["CC"]
    from kfactory.platform.config import Settings
    return Settings().cc


def _compiler_identity(cc: str) -> str:
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"the C compiler {cc!r} cannot be run: {e}") from e
    return proc.stdout.splitlines()[0] if proc.stdout else cc


@dataclass(frozen=True)
class Unit:
    """A further translation unit linked into the engine (a searched op kernel, kfactory/engines/ops.py):
    its C source, the flags it is compiled with (those it was verified with, plus -fPIC), and the symbols it
    exports: every other global symbol of its object is made local before the link, so a kernel's helper can
    neither collide with the engine's symbols nor interpose on them (a global `malloc` of its own, say)."""
    source: str
    flags: tuple[str, ...]
    exports: tuple[str, ...]


def build(source: str, cache_dir: Path | None = None, extra_flags: tuple[str, ...] = (),
          units: tuple[Unit, ...] = ()) -> BuildResult:
    """Compile `source` (C), and link `units` into it, as one cached shared object; see the module docstring."""
    cc = compiler()
    flags = (*FLAGS, *extra_flags)
    key = hashlib.sha256("\0".join([_compiler_identity(cc), *flags, source,
                                     *("\1".join([*u.flags, *u.exports, u.source]) for u in units)]
                                    ).encode()).hexdigest()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{key}.so"
    cmd = [cc, "-x", "c", *flags, "-o", str(out), "-", "-x", "none", *LINK]
    if _intact(out):
        return BuildResult(True, out, "", 0.0, True, " ".join(cmd))
    (cache / f"{key}.c").write_text(source)   # kept beside the object: what ran is readable afterwards
    for i, unit in enumerate(units):
        (cache / f"{key}.unit{i}.c").write_text(unit.source)
    shared = _shared_cache(cc)
    if shared is not None and _copy_intact(shared / out.name, out):
        return BuildResult(True, out, "", 0.0, True, " ".join(cmd))
    # a build killed midway leaves this directory (its objects can be large): the next build here removes it
    with scratch.owned_tempdir("kf-engine", cache) as tmp:
        tmp_out = tmp / "engine.so"
        t0 = time.perf_counter()
        objects, failed = _compile_units(cc, units, tmp)
        if failed is not None:
            return failed
        cmd = [cc, "-x", "c", *flags, "-o", str(tmp_out), "-", "-x", "none", *map(str, objects), *LINK]
        result = _run(cmd, source)
        if not result.ok:
            return result
        _seal(tmp_out, out)
        os.replace(tmp_out, out)   # atomic: a concurrent build of the same key finds a whole object or none
    if shared is not None:
        _share(out, shared)
    cmd[cmd.index(str(tmp_out))] = str(out)
    return BuildResult(True, out, result.log, time.perf_counter() - t0, False, " ".join(cmd))


def _digest_path(obj: Path) -> Path:
    return obj.with_name(obj.name + ".sha256")


def _seal(built: Path, out: Path) -> None:
    """Record the sha256 of the object `built` that is about to become `out`, beside it (written first: a
    digest without its object is a miss, an object without its digest too)."""
    atomic_write(_digest_path(out), hashlib.sha256(built.read_bytes()).hexdigest().encode())


def _shared_cache(cc: str) -> Path | None:
    """This processor's directory in Settings.engine_object_cache, created; None where it is unset, or cannot
    be used (logged once, with what to fix)."""
    from kfactory.platform.config import Settings
    shared = Settings().engine_object_cache
    if shared is None:
        return None
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if not _mine_alone(shared, shared):
            return None   # (nothing made inside a directory that is refused)
        mine = shared / native_tag(cc)
        mine.mkdir(mode=0o755, exist_ok=True)
        # the processor's directory too: it may have been made before a chmod of its parent
        return mine if _mine_alone(mine, shared) else None
    except OSError as e:
        _refuse_once(str(shared), f"it cannot be made or read ({e})")
        return None


def _mine_alone(d: Path, shared: Path) -> bool:
    """Whether the directory `d` belongs to this user and no one else may write to it; else refused, logged."""
    if not (why := others_may_write(d)):
        return True
    _refuse_once(str(shared), f"{why}; chmod go-w it, or unset KFACTORY_ENGINE_OBJECT_CACHE")
    return False


@functools.lru_cache(maxsize=None)
def _refuse_once(shared: str, why: str) -> None:
    log.warning("the shared engine object cache is not used: " + why, cache=shared)


def _share(out: Path, shared: Path) -> None:
    """Leave the object `out` in the shared cache; a failure (a full disk, say) is logged, the build stands."""
    try:
        _copy_intact(out, shared / out.name)
    except OSError as e:
        log.warning("an engine object could not be left in the shared cache", object=out.name, cache=str(shared),
                    error=str(e))


def _copy_intact(src: Path, dst: Path) -> bool:
    """Copy the object `src` and its digest to `dst` (readable by all, as the compiler leaves an object) when
    `src` is intact (see _intact; a reader of `dst` meanwhile finds the old object, the new one, or a miss);
    False, copying nothing, when it is missing or damaged. The bytes copied are the very bytes checked."""
    checked = _checked(src)
    if checked is None:
        return False
    data, digest = checked
    atomic_write(_digest_path(dst), digest.encode(), mode=0o644)
    atomic_write(dst, data, mode=0o755)
    return True


def _intact(out: Path) -> bool:
    """Whether the cached object `out` is the one its build wrote: its sha256 is the one recorded beside it. A
    cut-short or damaged object (a full disk, a crash, a hand) would load as a crash in every engine that uses
    it, a fault of the design's; it is built again instead. An object cached before digests were kept is built
    again once."""
    return _checked(out) is not None


def _checked(obj: Path) -> tuple[bytes, str] | None:
    """(the object's bytes, its recorded sha256) when they match; None when either is missing or they differ."""
    try:
        data, digest = obj.read_bytes(), _digest_path(obj).read_text().strip()
    except OSError:
        return None
    return (data, digest) if hashlib.sha256(data).hexdigest() == digest else None


def _run(cmd: list[str], source: str) -> BuildResult:
    """One compiler run over `source` on stdin: ok, or a failed BuildResult with the compiler's log."""
    t0 = time.perf_counter()
    # stopped while a kernel or an engine is timed on this host (kfactory/judge/quiet.py)
    returncode, stderr = quiet.run_compiler(cmd, COMPILE_TIMEOUT_S, stdin=source)
    if returncode is None:
        return BuildResult(False, None, f"the compiler ran past {COMPILE_TIMEOUT_S} s", COMPILE_TIMEOUT_S,
                           False, " ".join(cmd))
    seconds = time.perf_counter() - t0
    check_not_interrupted(returncode, cmd[0])
    if returncode != 0:
        return BuildResult(False, None, stderr[-20000:] or f"{cmd[0]} exited with {returncode}",
                           seconds, False, " ".join(cmd))
    return BuildResult(True, None, stderr[-20000:], seconds, False, " ".join(cmd))


def _compile_units(cc: str, units: tuple[Unit, ...], tmp: Path) -> tuple[list[Path], BuildResult | None]:
    """Each unit compiled to an object in `tmp`: the objects, or the first failure."""
    objects: list[Path] = []
    for i, unit in enumerate(units):
        obj = tmp / f"unit{i}.o"
        result = _run([cc, "-x", "c", "-c", "-fPIC", *unit.flags, "-o", str(obj), "-"], unit.source)
        if result.ok:
            result = _run(["objcopy", *(f"--keep-global-symbol={s}" for s in unit.exports), str(obj)], "")
        if not result.ok:
            return objects, BuildResult(False, None, f"unit {i}: {result.log}", result.seconds, False,
                                        result.command)
        objects.append(obj)
    return objects, None

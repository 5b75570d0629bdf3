"""The cpu target's compile cache: a compiled kernel's shared object, with its compile's report and log, filed
under a key over everything that decides the object: the compiler (the path it is invoked by, the file that path
resolves to, its version and the programs it runs, the environment variables it reads), what `-march=native`
means to it on this host, the whole command (language, flags and the target's fixed words) and the source.

Only the sandbox's checks of the source and flags run before a lookup; on a hit the object's symbols are read
again (nm) and the checks of what it imports and defines run on them, as after a compile: a rule or a reading
changed since the entry was written applies to it. Failed compiles are not kept (a compiler that failed for want
of disk or memory would fail the kernel for good). An entry is its object written first, then its JSON with the
object's sha256: a reader that finds the JSON finds the object whole and checks it; anything torn, damaged or
unreadable is a miss (the kernel compiles again). The directory and its entries must be this user's alone, checked
at every use: an object another user could plant there would be judged as the kernel's."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format

from kfactory.observability.log import get_logger
from kfactory.platform.fsutil import atomic_write, others_may_write
from kfactory.v1 import events_pb2 as pb

log = get_logger("cpu-cache")

#: the entries' layout; a change of it (or of what a compile records) starts a new cache beside the old
SCHEMA = "2"
#: what a compiler reads from the environment to find headers, libraries and its own programs
COMPILER_ENVIRONMENT = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX",
                        "COMPILER_PATH", "GCC_COMPARE_DEBUG")


@dataclass
class Entry:
    """A compile that succeeded: the object (and where it lies, for nm), its report and log."""
    artifact: bytes
    report: pb.CompileReport
    log: str
    path: Path


def compiler_identity(cc: str) -> str:
    """The compiler `cc` names, as it is now ("" when it cannot be found or asked: nothing is cached then): the
    path it is invoked by (a driver such as ccache or clang picks its behaviour by that name), the file it resolves
    to (size, time: an upgrade replaces it), its --version and the programs a compile runs (-###), and the
    environment variables it reads. Looked up at every compile; the compiler asked only when its file changed."""
    found = shutil.which(cc)
    if found is None:
        return ""
    real = os.path.realpath(found)
    try:
        st = os.stat(real)
    except OSError:
        return ""
    asked = _asked(found, real, st.st_size, st.st_mtime_ns)
    if not asked:
        return ""
    env = "|".join(f"{k}={os.environ.get(k, '')}" for k in COMPILER_ENVIRONMENT)
    return f"{found}|{real}|{st.st_size}|{st.st_mtime_ns}|{asked}|{env}"


@functools.lru_cache(maxsize=16)
def _asked(found: str, real: str, size: int, mtime_ns: int) -> str:
    """The compiler's --version and the commands one compile runs (-###: cc1 and collect2 by their paths), or ""."""
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
        runs = subprocess.run([found, "-###", "-x", "c", "-c", os.devnull, "-o", os.devnull], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    if version.returncode != 0:
        return ""
    return version.stdout + "\0" + runs.stderr


def key(compiler: str, host: str, command: list[str], source: str) -> str:
    """sha256 over the parts, each length-prefixed (no two lists of parts collide)."""
    h = hashlib.sha256()
    for part in (SCHEMA, compiler, host, *command, "", source):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


class CompileCache:
    """Entries under `directory`: KEY.so and KEY.json."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._refused = ""   # why the directory was last refused (told once)

    def usable(self) -> bool:
        """Whether the directory can be used now: made if need be, this user's alone (checked at every use, as a
        chmod may come later); else logged once, and the compile runs the compiler."""
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            why = others_may_write(self.directory)
        except OSError as e:
            why = f"it cannot be made or read ({e})"
        if why and why != self._refused:
            log.warning("the compile cache is not used: " + why + " (KFACTORY_CPU_OBJECT_CACHE, or the data "
                        "directory's cc_cache)", cache=str(self.directory))
        self._refused = why
        return not why

    def _paths(self, k: str) -> tuple[Path, Path]:
        return self.directory / f"{k}.so", self.directory / f"{k}.json"

    def load(self, k: str) -> Entry | None:
        """The entry under key `k`, or None (absent, torn, damaged, unreadable or not this user's alone: a miss)."""
        if not self.usable():
            return None
        so, meta_path = self._paths(k)
        try:
            if others_may_write(so) or others_may_write(meta_path):
                return None
            meta = json.loads(meta_path.read_text())
            report = json_format.ParseDict(meta["report"], pb.CompileReport())
            artifact = so.read_bytes()
            intact = hashlib.sha256(artifact).hexdigest() == meta["sha256"]
            entry = Entry(artifact, report, str(meta["log"]), so)
        except (OSError, ValueError, KeyError, TypeError, json_format.ParseError):
            return None
        return entry if intact else None

    def store(self, k: str, artifact: bytes, report: pb.CompileReport, compile_log: str) -> None:
        """File a compile that succeeded (readable by all, writable by this user alone); a cache that cannot be
        written costs a compile later, not this one."""
        if not self.usable():
            return
        so, meta_path = self._paths(k)
        meta = {"report": json_format.MessageToDict(report, preserving_proto_field_name=True), "log": compile_log,
                "sha256": hashlib.sha256(artifact).hexdigest()}
        try:
            atomic_write(so, artifact, mode=0o644)
            atomic_write(meta_path, json.dumps(meta).encode(), mode=0o644)
        except OSError:
            return

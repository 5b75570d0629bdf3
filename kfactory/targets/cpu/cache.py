"""The cpu target's compile cache: a compiled kernel's shared object and what the compile read of it (its imports,
the functions it defines, its log and report), filed under a key over everything that decides the object: the
compiler (its resolved path, size, time and version), this host's processor and C library (`-march=native` builds
for the processor), the language, the flags and the source.

Only the sandbox's checks of the source and flags run before a lookup, and the checks of what the object imports
and defines run on every hit as on a compile: a rule changed since the entry was written applies to it. Failed
compiles are not kept (a compiler that failed for want of disk or memory would fail the kernel for good). An
entry is its object written first, then its JSON with the object's sha256: a reader that finds the JSON finds the
object whole and checks it; anything torn, damaged or unreadable is a miss (the kernel compiles again). A
directory another user could write into is not used (an object planted there would be judged as the kernel's)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from google.protobuf import json_format

from kfactory.observability.log import get_logger
from kfactory.platform.fsutil import atomic_write, others_may_write
from kfactory.v1 import events_pb2 as pb

log = get_logger("cpu-cache")

#: the entries' layout; a change of it (or of what a compile records) starts a new cache beside the old
SCHEMA = "1"


@dataclass
class Entry:
    """A compile that succeeded: the object and what was read of it."""
    artifact: bytes
    report: pb.CompileReport
    undefined: list[str]
    functions: set[str]
    log: str


@lru_cache(maxsize=16)
def compiler_identity(cc: str) -> str:
    """The compiler `cc` names, as it is now: resolved path, size, modification time and first line of
    --version ("" when it cannot be found or asked: nothing is cached then). An upgrade replaces the driver, so
    its size or time changes with it."""
    found = shutil.which(cc)
    if found is None:
        return ""
    path = os.path.realpath(found)
    try:
        st = os.stat(path)
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    version = next((line for line in out.stdout.splitlines() if line.strip()), "")
    return f"{path}|{st.st_size}|{st.st_mtime_ns}|{version}" if out.returncode == 0 else ""


def key(compiler: str, host: str, language: str, words: list[str], source: str) -> str:
    """sha256 over the parts, each length-prefixed (no two lists of parts collide)."""
    h = hashlib.sha256()
    for part in (SCHEMA, compiler, host, language, *words, "", source):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


class CompileCache:
    """Entries under `directory`, two levels (ab/abcdef....so and .json) so that no directory holds them all."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._usable: bool | None = None

    def usable(self) -> bool:
        """Whether the directory can be used: made if need be, this user's alone; else logged once, and every
        compile runs the compiler."""
        if self._usable is None:
            try:
                self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
                why = others_may_write(self.directory)
            except OSError as e:
                why = f"it cannot be made or read ({e})"
            if why:
                log.warning("the compile cache is not used: " + why + " (KFACTORY_CPU_OBJECT_CACHE, or the data "
                            "directory's cc_cache)", cache=str(self.directory))
            self._usable = not why
        return self._usable

    def _paths(self, k: str) -> tuple[Path, Path]:
        base = self.directory / k[:2] / k
        return base.with_suffix(".so"), base.with_suffix(".json")

    def load(self, k: str) -> Entry | None:
        """The entry under key `k`, or None (absent, torn or unreadable: a miss)."""
        if not self.usable():
            return None
        so, meta_path = self._paths(k)
        try:
            meta = json.loads(meta_path.read_text())
            report = json_format.ParseDict(meta["report"], pb.CompileReport())
            artifact = so.read_bytes()
            entry = Entry(artifact, report, list(meta["undefined"]), set(meta["functions"]), str(meta["log"]))
            intact = hashlib.sha256(artifact).hexdigest() == meta["sha256"]
        except (OSError, ValueError, KeyError, TypeError, json_format.ParseError):
            return None
        return entry if intact else None

    def store(self, k: str, entry: Entry) -> None:
        """File a compile that succeeded; a cache that cannot be written costs a compile later, not this one."""
        if not self.usable():
            return
        so, meta_path = self._paths(k)
        meta = {"report": json_format.MessageToDict(entry.report, preserving_proto_field_name=True),
                "undefined": entry.undefined, "functions": sorted(entry.functions), "log": entry.log,
                "sha256": hashlib.sha256(entry.artifact).hexdigest()}
        try:
            so.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(so, entry.artifact)
            atomic_write(meta_path, json.dumps(meta).encode())
        except OSError:
            return

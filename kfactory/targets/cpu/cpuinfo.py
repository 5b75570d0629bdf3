"""What /proc/cpuinfo says about this host's processor: its text, and the flags of its first processor.

Small and import-free so that modules which only ask "does this host have AVX-512?" (an engine design space)
need not load the cpu target.
"""
from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
from pathlib import Path


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text, or "" where there is none (not Linux, or /proc hidden)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # callers fall back: the model to platform's, the identity and the flags to none
        return ""


def cpu_flags(cpuinfo: str) -> set[str]:
    """The ISA flags of the first processor in `cpuinfo`'s text (x86 "flags", Arm "Features")."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def host_has(flag: str) -> bool:
    """Whether this host's processor lists `flag` (e.g. "avx512f")."""
    return flag in cpu_flags(read_cpuinfo())


@functools.lru_cache(maxsize=8)
def native_tag(cc: str) -> str:
    """What -march=native means to `cc` on this host, hashed: the macros it predefines there (__AVX2__ and the
    like). An object built for one processor may not run on another (SIGILL), and a cache may be on a disk several
    hosts mount: the engines' object cache and the cpu target's compile cache key by it."""
    try:
        proc = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", "-"], input="", capture_output=True,
                              text=True, timeout=60)
        seen = proc.stdout if proc.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        seen = ""
    # unknown: a directory of this host's own, then
    return hashlib.sha256((seen or f"{platform.node()}\0{cc}").encode()).hexdigest()[:16]

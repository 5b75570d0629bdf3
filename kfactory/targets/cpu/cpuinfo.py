"""What /proc/cpuinfo says about this host's processor: its text, and the flags of its first processor.

Small and import-free so that modules which only ask "does this host have AVX-512?" (an engine design space)
need not load the cpu target.
"""
from __future__ import annotations

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

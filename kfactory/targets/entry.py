"""Whether a compiled artifact defines the kernel's entry function, and if not, why in words that say what to fix:
the name misspelt, the function C++-mangled (no extern "C"), or nothing defined at all. Shared by the targets so
that a missing entry is a compile error everywhere, not a crash when the runner loads it."""
from __future__ import annotations

import re


def names_entry(name: str, entry: str) -> bool:
    """True for the entry's own name, or a C++-mangled name of a function called `entry` (_Z6kernelPfi,
    _ZN2ns6kernelEPf)."""
    if name == entry:
        return True
    # the length prefix must be whole: "1k" inside "_Z11kernel_abcd" is not a function called k
    return name.startswith("_Z") and re.search(rf"(?<!\d){len(entry)}{re.escape(entry)}", name) is not None


def missing_entry(functions: set[str], entry: str, where: str) -> str:
    """Why `where` (the artifact, in words: "the cubin") lacks function `entry` among `functions`, or "" when it
    has it."""
    if entry in functions:
        return ""
    mangled = sorted(f for f in functions if names_entry(f, entry))
    if mangled:
        return (f"{where} has no function {entry!r}, only the C++-mangled {mangled[0]!r}: "
                f"declare the kernel extern \"C\"")
    listed = ", ".join(repr(f) for f in sorted(functions)[:20]) or "none"
    more = f" and {len(functions) - 20} more" if len(functions) > 20 else ""
    return f"{where} has no function {entry!r} (it has: {listed}{more})"

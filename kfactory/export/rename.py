"""Renaming a kernel's entry symbol in its source, so two exported kernels can live in one program.

Every kernel's entry is `kernel` today. Compiling with -Dkernel=NAME would change the flags it was measured
with, so the source itself is rewritten: every identifier token equal to the entry becomes NAME. Comments,
string and character literals are skipped (the text "a softmax kernel" in a comment stays as it is), and so
are longer identifiers that merely contain the entry (`kernel_param_x` in PTX, `kernel_size` in C).
"""
from __future__ import annotations

import re

from kfactory.export.errors import ExportError

_SKIP = r"""
    (?P<skip> //[^\n]*                          # line comment
            | /\*.*?\*/                         # block comment
            | "(?:\\.|[^"\\\n])*"               # string literal
            | '(?:\\.|[^'\\\n])*'               # character literal
    )
"""
#: C, C++, CUDA and PTX share these lexical forms for what must not be rewritten (comments, string and
#: character literals); anything else that looks like an identifier is one. PTX names may also hold $ and
#: start with % (a register, never the entry): both count as part of the name there, so `%kernel` stays.
_TOKENS = {
    "c": re.compile(_SKIP + r"| (?P<ident> [A-Za-z_][A-Za-z0-9_]*)", re.VERBOSE | re.DOTALL),
    "ptx": re.compile(_SKIP + r"| (?P<ident> [A-Za-z_$%][A-Za-z0-9_$]*)", re.VERBOSE | re.DOTALL),
}


def _tokens(language: str) -> re.Pattern:
    return _TOKENS["ptx" if language == "ptx" else "c"]


C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RenameError(ExportError):
    """The entry cannot be renamed safely: it is absent, or the new name is already used in the source."""


def identifiers(source: str, language: str = "c") -> set[str]:
    """Every identifier token of a source (language c, cpp, cuda or ptx), outside comments and literals."""
    return {m.group("ident") for m in _tokens(language).finditer(source) if m.group("ident")}


def rename_symbols(source: str, renames: dict[str, str], language: str = "c") -> str:
    """`source` with each identifier token in `renames` replaced by its new name (comments, literals and
    identifiers that only contain an old name are left alone). Raises RenameError when an old name does not
    occur, or a new name already does: the rewrite would then change what the code means."""
    present = identifiers(source, language)
    for old, new in renames.items():
        if old not in present:
            raise RenameError(f"the source has no identifier {old!r} to rename")
        if new in present and new != old:
            raise RenameError(f"the source already uses the identifier {new!r}; choose another --name")

    def sub(m: re.Match) -> str:
        ident = m.group("ident")
        return renames.get(ident, ident) if ident else m.group(0)

    return _tokens(language).sub(sub, source)


def rename_entry(source: str, entry: str, name: str, language: str = "c") -> str:
    """`source` with its entry symbol renamed to `name` (see rename_symbols)."""
    return rename_symbols(source, {entry: name}, language)


def rename_signature(signature: str, name: str) -> str:
    """An ABI signature ('void kernel(const float *x, ...)') with its function name replaced by `name`."""
    m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", signature)
    if m is None:
        raise RenameError(f"cannot find the function name in the ABI signature {signature!r}")
    return signature[:m.start(1)] + name + signature[m.end(1):]

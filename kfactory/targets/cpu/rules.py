"""Sandbox rules for cpu candidates, checked before and after compiling.

The source check refuses headers outside a whitelist, inline assembly, token pasting and calls into the
operating system (files, processes, raw threads, sockets, dynamic loading). Because a source check alone can
be fooled (a bare `extern` declaration of a name it does not know, macro tricks), the compiled object's
undefined symbols are checked against a whitelist too: maths, OpenMP's runtime, a few memory functions and
the toolchain's own symbols.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

ALLOWED_HEADERS = frozenset({
    "math.h", "stdint.h", "stddef.h", "stdbool.h", "string.h", "float.h", "limits.h", "omp.h",
    "immintrin.h", "x86intrin.h", "arm_neon.h", "arm_sve.h", "complex.h", "tgmath.h",
})
BANNED_IDENTIFIERS = frozenset({
    # processes and the kernel
    "syscall", "fork", "vfork", "clone", "execve", "execv", "execvp", "execl", "execlp", "system", "popen",
    "kill", "raise", "signal", "sigaction", "ptrace", "exit", "_exit", "abort", "setjmp", "longjmp",
    # files and memory mapping
    "open", "openat", "creat", "fopen", "freopen", "read", "write", "pread", "pwrite", "unlink", "remove",
    "rename", "mmap", "munmap", "mprotect", "dup", "dup2", "ioctl", "fcntl", "chdir", "getenv", "setenv",
    # raw threads (parallelism is OpenMP pragmas only)
    "pthread_create", "pthread_join", "pthread_detach", "thrd_create",
    # network
    "socket", "connect", "bind", "listen", "accept", "send", "recv", "sendto", "recvfrom", "gethostbyname",
    "getaddrinfo",
    # dynamic loading, and reaching into the host process
    "dlopen", "dlsym", "dlclose", "__libc_start_main", "environ",
})
ALLOWED_SYMBOL_PREFIXES = ("GOMP_", "omp_", "_ZGV", "__cxa_finalize", "__gmon_start__", "_ITM_",
                           "__stack_chk_fail", "__isnan", "__isinf", "__fpclassify", "__finite", "__signbit")
ALLOWED_SYMBOLS = frozenset({
    "memcpy", "memset", "memmove", "memcmp", "__memcpy_chk", "__memset_chk",
    # libm (single and double precision)
    *(f + s for f in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "pow", "sin",
                      "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan", "atan2", "erf", "erfc",
                      "fabs", "floor", "ceil", "round", "trunc", "fmod", "fma", "fmax", "fmin", "ldexp",
                      "frexp", "copysign", "nearbyint", "rint", "lrint", "hypot", "sincos", "lgamma", "tgamma")
      for s in ("", "f")),
})

_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]")
_IDENT = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


@dataclass(frozen=True)
class Violation:
    """A broken rule: which, where, and the offending text."""
    rule: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.rule}: {self.text.strip()[:120]}" if self.line else f"{self.rule}: {self.text}"


def _blank(match: re.Match) -> str:
    """Comments and literals become spaces, keeping line numbers."""
    return re.sub(r"[^\n]", " ", match.group(0))


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, text) per logical line: backslash-newline splices are joined as the
    preprocessor joins them, and the digraph %: and the trigraph ??= read as #, so `#inc\\<newline>lude`
    or `%:include` cannot hide a directive from the rules."""
    out, start, buf = [], 1, ""
    for no, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = no
        if line.endswith("\\"):
            buf += line[:-1]
            continue
        out.append((start, (buf + line).replace("%:", "#").replace("??=", "#")))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def check_source(source: str) -> list[Violation]:
    """Every rule the source breaks, with its line."""
    code = dict(_logical_lines(_COMMENT_OR_STRING.sub(_blank, source)))
    out: list[Violation] = []
    raw_lines = source.splitlines()
    for no, raw in _logical_lines(source):
        line = code.get(no, "")
        shown = raw_lines[no - 1]
        inc = _INCLUDE.match(raw)
        if inc and inc.group(1) not in ALLOWED_HEADERS:
            out.append(Violation(f"header <{inc.group(1)}> is not allowed (allowed: "
                                 f"{', '.join(sorted(ALLOWED_HEADERS))})", no, shown))
            continue
        if "##" in line:
            out.append(Violation("token pasting (##) is not allowed", no, shown))
        for ident in _IDENT.findall(line):
            if ident in ("asm", "__asm", "__asm__"):
                out.append(Violation("inline assembly is not allowed", no, shown))
            elif ident in BANNED_IDENTIFIERS:
                out.append(Violation(f"{ident} is not allowed (no file, process, raw thread, network or "
                                     "system calls; parallelism through OpenMP pragmas only)", no, shown))
    return out


def check_imports(symbols: list[str]) -> list[Violation]:
    """Undefined symbols of the compiled object that are outside the whitelist."""
    bad = []
    for sym in symbols:
        name = sym.split("@", 1)[0]
        if name in ALLOWED_SYMBOLS or name.startswith(ALLOWED_SYMBOL_PREFIXES):
            continue
        bad.append(Violation("imports a symbol outside the whitelist", 0, name))
    return bad

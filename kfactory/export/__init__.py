"""`kfactory export`: a verified kernel as files usable without kfactory.

    export(evidence, problem, fmt, name, out_dir, priors=()) -> [paths written]

fmt "c" writes NAME.h (the ABI with the entry renamed NAME, and the evidence), the renamed source (NAME.c,
.cpp, .cu or .ptx) and build.sh (libNAME.so or NAME.cubin, with the measured flags); "python" adds NAME.py
(numpy only); "torch" adds NAME_torch.py (a torch.library op) on top of that. A template family's kernel also
gets NAME_params.h (its best parameters per device, from `priors`: memory's measurements of the family).
A kernel whose evidence does not show it passed verification is refused (NotVerified, one line).
"""
from __future__ import annotations

import builtins
import ctypes
import ctypes.util
import keyword
import sys
from pathlib import Path

from kfactory.export.c import write_c
from kfactory.export.errors import ExportError
from kfactory.export.evidence import NotVerified, judged
from kfactory.export.params import write_params
from kfactory.export.rename import C_IDENTIFIER
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

FORMATS = ("c", "python", "torch")
#: C and C++ keywords (and CUDA's built-in names) that cannot name a function
RESERVED = frozenset("""auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef union unsigned void
volatile while bool true false class namespace template typename this new delete operator private public
protected virtual friend using try catch throw const_cast static_cast dynamic_cast reinterpret_cast explicit
mutable constexpr decltype noexcept nullptr alignas alignof char16_t char32_t static_assert thread_local
threadIdx blockIdx blockDim gridDim warpSize main""".split())

#: modules an exported module or torch op imports: NAME.py must not take their name
SHADOWED = frozenset({"numpy", "torch", "cuda", "ml_dtypes", "typing_extensions"})

__all__ = ["FORMATS", "ExportError", "NotVerified", "check_name", "export"]


def check_name(name: str) -> None:
    """ExportError unless `name` can name the exported C function, its files and a Python module: a C
    identifier (letters, digits, '_', not first a digit), no keyword of C, C++ or Python, at most 64
    characters, not starting with '_kf_' (the exported module's own names), no module an exported module
    imports or the standard library has (NAME.py would shadow it), no standard C header's (NAME.h would hide
    it), no function or object of the C library (the export's symbol would replace it) and no Python builtin
    (the module's function would replace it inside the module)."""
    if not C_IDENTIFIER.fullmatch(name or ""):
        shown = repr(name) if len(name or "") <= 80 else f"{name[:80]!r}..."
        raise ExportError(f"--name {shown} is not a C identifier (letters, digits and '_', not starting with a digit)")
    if len(name) > 64:
        raise ExportError(f"--name is {len(name)} characters; at most 64")
    if name in RESERVED or keyword.iskeyword(name) or name.startswith("_kf_"):
        raise ExportError(f"--name {name!r} is reserved in C, C++, CUDA or Python (or by the exporter)")
    if name in sys.stdlib_module_names or name in SHADOWED:
        raise ExportError(f"--name {name!r}: NAME.py would shadow the module {name}; choose another")
    if name in C_HEADERS:
        raise ExportError(f"--name {name!r}: NAME.h would hide the C library's <{name}.h> from a program built "
                          "with the export's directory on its include path; choose another")
    if _c_library_symbol(name):
        raise ExportError(f"--name {name!r} is a function or object of the C library (libc or libm): the export's "
                          "symbol would replace it in every program that links it; choose another")
    if name in dir(builtins):
        raise ExportError(f"--name {name!r} is a Python builtin: the exported module's function would replace it "
                          "inside the module, which calls it; choose another")


#: the C standard library's headers and the POSIX headers a C program commonly includes: NAME.h must not hide one
C_HEADERS = frozenset("""assert complex ctype errno fenv float inttypes iso646 limits locale math setjmp signal stdalign
stdarg stdatomic stdbool stddef stdint stdio stdlib stdnoreturn string tgmath threads time uchar wchar wctype
unistd pthread fcntl dlfcn sched strings alloca malloc memory""".split())


def _c_library_symbol(name: str) -> bool:
    """Whether the C library (libc, or libm) defines `name`: looked up in those libraries themselves, not in the
    process's global scope (which holds whatever else was loaded) nor among the ctypes object's attributes."""
    found = False
    for lib in ("c", "m"):
        path = ctypes.util.find_library(lib)
        try:
            handle = ctypes.CDLL(path)  # path None: the process itself, where libc is
        except (OSError, TypeError):    # no such library here (TypeError: CDLL(None) off POSIX)
            continue
        try:
            handle[name]
            found = True
        except AttributeError:
            pass  # not defined there: the answer for this library
    return found


def export(evidence: spb.CandidateEvidence, problem, fmt: str, name: str, out_dir: Path | str,
           priors: list[pb.Prior] | tuple = ()) -> list[Path]:
    """Write the kernel of `evidence` (a kernel of `problem`) in format `fmt` into out_dir; the paths written.
    Raises NotVerified (an ExportError) when the evidence does not show a verified kernel, ExportError when
    the export cannot be made as asked; nothing is written then."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    check_name(name)
    j = judged(evidence, problem.name)
    if j.target_kind not in problem.spec.abi:
        raise ExportError(f"problem {problem.name} has no ABI for target {j.target_kind}")
    out = Path(out_dir)
    # text of every file first: an export that fails writes nothing
    from kfactory.export.python import module_text
    from kfactory.export.torch import op_text

    texts = {}
    if fmt in ("python", "torch"):
        texts[f"{name}.py"] = module_text(j, problem, name)
    if fmt == "torch":
        texts[f"{name}_torch.py"] = op_text(j, problem, name)
    params = (f"{name}_params.h",) if j.candidate.family and j.params else ()   # (write_params writes it)
    written = write_c(j, problem, name, out, also=(*texts, *params))
    for fname, text in texts.items():
        (out / fname).write_text(text)
        written.append(out / fname)
    return written + write_params(j, problem, name, out, list(priors))

"""A problem's ABI on a target as an exported wrapper needs it: each argument's name, whether it is a tensor
(a pointer) or a scalar (a shape symbol, or one of the problem's params), and a scalar's C type, read from the
ABI's C signature."""
from __future__ import annotations

from dataclasses import dataclass

from kfactory.export.errors import ExportError
from kfactory.problems.params import abi_misfit, signature_params

#: C spellings of scalar types -> the exported wrapper's names for them (ctypes and struct know each)
SCALAR_TYPES = {
    "int64_t": "int64", "long long": "int64", "long long int": "int64", "signed long long": "int64",
    "int32_t": "int32", "int": "int32", "signed int": "int32", "signed": "int32",
    "uint64_t": "uint64", "unsigned long long": "uint64", "size_t": "uint64",
    "uint32_t": "uint32", "unsigned": "uint32", "unsigned int": "uint32",
    "long": "long", "unsigned long": "ulong",
    "float": "float32", "double": "float64",
}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}


class AbiError(ExportError):
    """The ABI's signature cannot be mapped onto the problem's tensors and symbols."""


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a tensor (passed as a pointer) or a scalar of a C type (a shape symbol, or a
    problem param when `param`)."""
    name: str
    tensor: bool
    scalar_type: str = ""   # int64, int32, uint64, uint32, long, ulong, float32, float64 (scalars only)
    c_type: str = ""        # as the signature spells it
    param: bool = False     # one of the problem's params (its value is a keyword argument of the wrappers)


def parse_args(signature: str) -> list[tuple[str, str]]:
    """[(C type, name)] of a C signature's parameters, in order (the loader's reading of it)."""
    try:
        return signature_params(signature)
    except ValueError as exc:
        raise AbiError(str(exc)) from exc


def _scalar_type(c_type: str) -> str:
    words = [w for w in c_type.split() if w not in _QUALIFIERS]
    key = " ".join(words)
    if key not in SCALAR_TYPES:
        raise AbiError(f"scalar type {c_type!r} is not one the exporter knows ({', '.join(sorted(SCALAR_TYPES))})")
    return SCALAR_TYPES[key]


def abi_args(problem, target: str) -> list[Arg]:
    """The problem's ABI arguments on `target` (cpu or cuda), checked against abi.args and the problem's
    tensors, symbols and params: a tensor must be a pointer, a symbol or param a scalar of a known C type."""
    kind = target.split(":", 1)[0]
    abi = problem.spec.abi.get(kind)
    if abi is None:
        raise AbiError(f"problem {problem.name} has no ABI for target {kind}")
    params = parse_args(abi.signature)
    spec = problem.spec
    dtypes = {t.name: t.dtype for t in spec.inputs + spec.outputs}
    if why := abi_misfit(abi.signature, abi.args, dtypes, {t.name for t in spec.outputs}, spec.symbols):
        raise AbiError(f"the ABI of {problem.name} on {kind}: {why}")
    out = []
    for c_type, name in params:
        if name in dtypes:
            out.append(Arg(name, True, c_type=c_type))
        elif name in spec.symbols or name in spec.params:
            if "*" in c_type:
                raise AbiError(f"argument {name!r} is a scalar but the signature passes a pointer")
            out.append(Arg(name, False, _scalar_type(c_type), c_type, param=name in spec.params))
        else:
            raise AbiError(f"argument {name!r} is neither a tensor, a shape symbol nor a param of {problem.name}")
    return out


def derivable(problem) -> list[str]:
    """The shape symbols the outputs and arguments need that no input's shape gives: a wrapper that derives
    the shape from its inputs cannot call such a kernel (empty for every built-in problem)."""
    given = {d for t in problem.spec.inputs for d in t.shape if isinstance(d, str)}
    needed = {d for t in problem.spec.outputs for d in t.shape if isinstance(d, str)}
    needed |= {a for abi in problem.spec.abi.values() for a in abi.args if a in problem.spec.symbols}
    return sorted(needed - given)

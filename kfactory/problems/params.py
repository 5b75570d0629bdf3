"""A problem's scalar parameters (problem.yaml `params:`, e.g. rmsnorm's `eps`): how each reaches the code.

One value per parameter, the spec's, is the value campaigns verify and time with. It reaches:
- the reference: `reference(inputs, **params)`, and `baselines(**params)` / `cuda_baselines(**params)`, as
  keyword arguments (only when the problem declares parameters, so packages without any are called as before);
- the kernel: a parameter listed in an ABI's `args` is a scalar argument of the C type its signature gives it
  (float or double for a float parameter, an integer type for an int one), passed at every call, so one compiled
  kernel serves every value and an exported kernel takes the value as an argument (default: the spec's);
- templates: every parameter is a Jinja variable of every family's template and compile_flags (beside the design
  point's own parameters), so a template may also compile a value in.
A parameter no ABI lists reaches the kernel only through its template (hand-written kernels hard-code it).
"""
from __future__ import annotations

import re

#: names a parameter cannot take: the Jinja globals a template would no longer reach, and its loop variable
JINJA_RESERVED = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace", "loop", "self", "caller",
                            "true", "false", "none", "True", "False", "None"})

_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict"}
_PARAM = re.compile(r"^(?P<type>.*?)(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<array>\[\s*\])?\s*$", re.DOTALL)

#: C types a float parameter may be passed as, and the runner's argument type for each
FLOAT_ARGTYPES = {"float": "f32", "double": "f64"}
#: C integer types an int parameter may be passed as -> (lowest, highest) value; every one travels as an int64
#: (as the shape symbols do): the low bits are what a narrower C parameter reads, on x86-64 and in CUDA's
#: parameter buffer alike, so the value must fit the declared type
INT_RANGES = {
    "int64_t": (-2 ** 63, 2 ** 63 - 1), "long long": (-2 ** 63, 2 ** 63 - 1), "long long int": (-2 ** 63, 2 ** 63 - 1),
    "signed long long": (-2 ** 63, 2 ** 63 - 1), "long": (-2 ** 63, 2 ** 63 - 1),
    "int32_t": (-2 ** 31, 2 ** 31 - 1), "int": (-2 ** 31, 2 ** 31 - 1), "signed int": (-2 ** 31, 2 ** 31 - 1),
    "signed": (-2 ** 31, 2 ** 31 - 1),
    "uint64_t": (0, 2 ** 64 - 1), "unsigned long long": (0, 2 ** 64 - 1), "size_t": (0, 2 ** 64 - 1),
    "unsigned long": (0, 2 ** 64 - 1),
    "uint32_t": (0, 2 ** 32 - 1), "unsigned": (0, 2 ** 32 - 1), "unsigned int": (0, 2 ** 32 - 1),
}


def signature_params(signature: str) -> list[tuple[str, str]]:
    """[(C type, name)] of a C signature's parameters, in order; ValueError saying what cannot be read."""
    open_at, close_at = signature.find("("), signature.rfind(")")
    if open_at < 0 or close_at < open_at:
        raise ValueError(f"no parameter list in the ABI signature {signature!r}")
    body = signature[open_at + 1:close_at].strip()
    if not body or body == "void":
        return []
    out = []
    for part in body.split(","):
        m = _PARAM.match(part.strip())
        if m is None or not m.group("type").strip():
            raise ValueError(f"cannot read the parameter {part.strip()!r} of the ABI signature {signature!r}")
        c_type = " ".join(m.group("type").split())
        out.append((f"{c_type} *" if m.group("array") else c_type, m.group("name")))   # `float x[]` is a pointer
    return out


def abi_misfit(signature: str, args: list[str], tensors: dict[str, str], outputs: set[str],
               symbols: list[str]) -> str:
    """Why `args` cannot be the parameters of C `signature` ('' when they can): the same names in the same
    order; a tensor (`tensors`: name -> dtype) a pointer, an output's not const, float32 as float and float64 as
    double; a shape symbol an integer by value. A kernel is called with its args in that order, so a mismatch
    rejects every correct kernel for a reason of its own. ValueError when the signature cannot be read."""
    params = signature_params(signature)
    names = [n for _, n in params]
    if names != list(args):
        return f"args {list(args)} must name the signature's parameters in its order, {names}"
    for c_type, name in params:
        if name in tensors:
            head = c_type.split("*")[0].split()
            want = {"float32": "float", "float64": "double"}.get(tensors[name])
            if "*" not in c_type:
                return f"tensor {name!r} must be passed as a pointer, not {c_type!r}"
            if name in outputs and "const" in head:
                return f"output {name!r} is written: its pointer cannot be const ({c_type!r})"
            if want is not None and bare_type(" ".join(head)) != want:
                return f"tensor {name!r} is {tensors[name]}: pass it as {want} *, not {c_type!r}"
        elif name in symbols and (why := check_c_type("int", c_type)):
            return f"shape symbol {name!r}: {why}"
    return ""


def bare_type(c_type: str) -> str:
    """A C type without its qualifiers (const, volatile, restrict), words single-spaced."""
    return " ".join(w for w in c_type.split() if w not in _QUALIFIERS)


def c_param_types(signature: str) -> dict[str, str]:
    """name -> C type of each parameter of a signature; {} when it cannot be read (the signature is then
    prose, as a replay problem's is, and nothing can be checked against it)."""
    try:
        return {name: c_type for c_type, name in signature_params(signature)}
    except ValueError:
        return {}


def check_c_type(kind: str, c_type: str | None, spec=None) -> str:
    """Why a parameter of type `kind` (float or int) cannot be passed as `c_type` ('' when it can); with the
    parameter's `spec`, an int's value and range must also fit the C type."""
    if c_type is None:
        return "the signature does not name it (abi.args and the signature must list the same arguments)"
    if "*" in c_type:
        return f"a scalar parameter cannot be passed as a pointer ({c_type!r})"
    t = bare_type(c_type)
    if kind == "float":
        return "" if t in FLOAT_ARGTYPES else f"a float parameter is passed as float or double, not {c_type!r}"
    if t not in INT_RANGES:
        return f"an int parameter is passed as a C integer type ({', '.join(sorted(INT_RANGES))}), not {c_type!r}"
    lo, hi = INT_RANGES[t]
    for key in ("value", "min", "max"):
        v = getattr(spec, key, None) if spec is not None else None
        if v is not None and not lo <= v <= hi:
            return f"{key} {v} does not fit its C type {c_type!r} [{lo}, {hi}]"
    return ""


def argtype(kind: str, c_type: str) -> str:
    """The runner's argument type for a parameter passed as `c_type`: f32, f64 (floats) or i64 (integers)."""
    return FLOAT_ARGTYPES[bare_type(c_type)] if kind == "float" else "i64"


def abi_argtypes(problem, kind: str) -> list[str]:
    """The runner's type of each argument of the problem's ABI on target `kind` (cpu, cuda): ptr for a tensor,
    i64 for a shape symbol, f32/f64/i64 for a parameter as its C type says (validated when the spec loaded)."""
    spec = problem.spec
    abi = spec.abi[kind]
    tensors = {t.name for t in spec.inputs + spec.outputs}
    types = c_param_types(abi.signature) if any(a in spec.params for a in abi.args) else {}
    return ["ptr" if a in tensors else argtype(spec.params[a].type, types[a]) if a in spec.params else "i64"
            for a in abi.args]


def scalar_arg(problem, name: str, shape: dict[str, int]) -> dict:
    """The runner's descriptor of scalar argument `name`: a shape symbol's size ({"int"}), or a parameter's
    spec value ({"float"} or {"int"})."""
    p = problem.spec.params.get(name)
    if p is None:
        return {"name": name, "int": int(shape[name])}
    return {"name": name, "float": float(p.value)} if p.type == "float" else {"name": name, "int": int(p.value)}

"""`--format python`: NAME.py, a module that needs only numpy (and cuda-bindings for a cuda kernel), exposing
NAME(*inputs, out=None, **params) and selftest(); it builds the kernel with build.sh's command on first use,
beside the C export's files (written too). Each of the problem's params that the ABI passes to the kernel is a
keyword argument defaulting to the problem's value (kfactory.problems.params)."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from kfactory.export.abi import abi_args, derivable
from kfactory.export.c import build_for, source_name
from kfactory.export.errors import ExportError
from kfactory.export.evidence import Judged, summary_lines
from kfactory.export.reference import embed
from kfactory.export.templates import HERE, fill

if TYPE_CHECKING:
    from kfactory.problems import Problem

#: what a launch rule's expressions may contain: the generated module evaluates them with eval()
_SAFE_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp,
               ast.Compare, ast.IfExp, ast.Call, ast.Tuple, ast.List, ast.operator, ast.unaryop, ast.boolop,
               ast.cmpop)
_FUNCTIONS = {"min", "max", "abs", "ceil", "cdiv"}
#: the generated module's template (_runtime.py) and the parts appended to it, in order (templates.fill)
RUNTIME = ("_runtime.py", "_runtime_load.py", "_runtime_selftest.py")


def check_launch_rule(rule: dict) -> None:
    """ExportError unless each expression is arithmetic over names, numbers, strings and the launch functions."""
    for key in ("grid", "block", "smem"):
        expr = rule.get(key)
        if not isinstance(expr, str):
            continue
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError as exc:
            raise ExportError(f"launch rule {key}={expr!r} is not an expression: {exc.msg}") from exc
        for node in ast.walk(tree):
            if not isinstance(node, _SAFE_NODES):
                raise ExportError(f"launch rule {key}={expr!r} holds {type(node).__name__}, which an exported "
                                  "module will not evaluate")
            if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
                raise ExportError(f"launch rule {key}={expr!r} calls something other than {sorted(_FUNCTIONS)}")
            if isinstance(node, ast.Name) and node.id.startswith("__"):
                raise ExportError(f"launch rule {key}={expr!r} names {node.id}")


def _tensor(t) -> dict:
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def _selftest_shapes(problem: Problem) -> list[dict]:
    """The verification shapes (small and ragged), else the smallest optimisation shape."""
    verify = problem.shapes("verify")
    if verify:
        return [dict(s) for s in verify]
    smallest = min(problem.shapes("optimize"), key=lambda s: sum(s.values()))
    return [dict(smallest)]


def param_config(problem, args) -> dict:
    """name -> {type, value, min, max, argument} of each of the problem's params; `argument`: the kernel takes
    it as an argument (else the value is compiled into the kernel and cannot be changed by a caller)."""
    passed = {a.name for a in args if a.param}
    return {n: {"type": p.type, "value": p.value, "min": p.min, "max": p.max, "argument": n in passed}
            for n, p in problem.spec.params.items()}


#: names a param cannot have in the generated wrappers: the public function's own arguments
_WRAPPER_NAMES = frozenset({"inputs", "out", "seed", "verbose", "tensors"})


def module_config(j: Judged, problem, name: str, reference_missing: str) -> dict:
    """The _CONFIG of the generated module: the ABI, params, shapes, tolerances, build command, launch rule."""
    if missing := derivable(problem):
        raise ExportError(f"the inputs' shapes do not give {missing}, which the kernel needs: a Python wrapper "
                          "cannot derive its arguments")
    args = abi_args(problem, j.candidate.target)
    if clash := sorted(n for n in problem.spec.params
                       if n in _WRAPPER_NAMES or n == name or n.startswith("_kf_")
                       or n in {t.name for t in problem.spec.inputs}):
        raise ExportError(f"the problem's params {clash} would shadow an argument of the exported function; "
                          "rename them in problem.yaml")
    launch = j.launch
    if j.target_kind == "cuda":
        if not launch:
            raise ExportError(f"candidate {j.candidate.id[:12]} has no launch rule")
        check_launch_rule(launch)
    build = build_for(j, name)
    return {
        "name": name, "problem": problem.name, "candidate_id": j.candidate.id, "target": j.target_kind,
        "inputs": [_tensor(t) for t in problem.spec.inputs], "outputs": [_tensor(t) for t in problem.spec.outputs],
        "symbols": list(problem.spec.symbols),
        "args": [{"name": a.name, "tensor": a.tensor, "type": a.scalar_type, "c_type": a.c_type, "param": a.param}
                 for a in args],
        "params": param_config(problem, args),
        "tolerance": {k: v.model_dump() for k, v in problem.spec.tolerance.items()},
        "distributions": {k: {n: d.model_dump() for n, d in v.items()} for k, v in problem.spec.distributions.items()},
        "selftest_shapes": _selftest_shapes(problem),
        "build": build.config(),
        "sources": [source_name(j, name)] + (["build_cubin.py"] if j.target_kind == "cuda" else []),
        "launch": launch, "measured_threads": j.candidate.runner_threads,
        "reference_missing": reference_missing,
    }


def params_doc(params: dict) -> list[str]:
    """One line per param for the wrappers' docstrings: its default, range, and whether it can be changed."""
    lines = []
    for n, p in params.items():
        rng = "" if p["min"] is None and p["max"] is None else \
            f", range [{'-inf' if p['min'] is None else p['min']}, {'inf' if p['max'] is None else p['max']}]"
        if p["argument"]:
            lines.append(f"{n}: {p['type']}, default {p['value']!r} (the problem's value, which kfactory verified "
                         f"and timed the kernel with){rng}")
        else:
            lines.append(f"{n} = {p['value']!r} is compiled into this kernel (not an argument)")
    return lines


def _public_function(problem, name: str, params: dict) -> str:
    ins = ", ".join(f"{t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]" for t in problem.spec.inputs)
    outs = ", ".join(f"{t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]" for t in problem.spec.outputs)
    several = len(problem.spec.outputs) > 1
    returns = f"a tuple ({outs})" if several else outs
    out_kind = "a tuple of arrays" if several else "an array"
    kw = [n for n, p in params.items() if p["argument"]]
    sig = "".join(f", {n}={params[n]['value']!r}" for n in kw)
    doc = "".join(f"\n    {line}" for line in params_doc(params))
    return f'''

def {name}(*inputs, out=None{sig}):
    """{problem.name} on the exported kernel.

    inputs (in this order, C-contiguous numpy arrays): {ins}
    returns: {returns}
    out: {out_kind} of those shapes and dtypes to write into (default: new arrays)
    The shape symbols ({", ".join(problem.spec.symbols)}) are read from the inputs' shapes.{doc}
    """
    return _kf_call(inputs, out, {{{", ".join(f"{n!r}: {n}" for n in kw)}}})
'''


def _check_names(extra: str, name: str) -> None:
    """ExportError when NAME or a name of the embedded reference would shadow one of the module's own."""
    runtime = {n for f in RUNTIME for node in ast.parse((HERE / f).read_text()).body for n in _defined(node)}
    theirs = {n for node in ast.parse(extra).body for n in _defined(node)} if extra else set()
    if name in runtime | theirs:
        raise ExportError(f"--name {name} is a name the exported module already uses; choose another")
    if clash := sorted((runtime & theirs) - {"np", "math", "_kf_reference"}):
        raise ExportError(f"the problem's reference defines {clash}, which the exported module uses too")


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def module_text(j: Judged, problem, name: str) -> str:
    """The text of NAME.py."""
    ref = embed(problem)
    if ref.code:
        _check_reference(problem, ref.code)
    config = module_config(j, problem, name, ref.why_not)
    doc = "\n".join(summary_lines(j, problem, name)) + (
        f"\n\nUsage (with this directory on sys.path):\n    import {name}\n    y = {name}.{name}(x)\n"
        f"    {name}.selftest()   # fresh random inputs against the float64 reference\n"
        "The first call builds the kernel with build.sh's command (CC overrides the compiler) unless the built file "
        "is newer than its sources.\n")
    if j.target_kind == "cpu" and j.candidate.runner_threads:
        doc += (f"It was measured with OMP_NUM_THREADS={j.candidate.runner_threads}; OpenMP kernels take the thread "
                "count from the environment.\n")
    extra = _public_function(problem, name, config["params"]) + (
        "\n\n" + ref.code if ref.code else "\n_kf_reference = None\n")
    _check_names(ref.code, name)
    return fill(RUNTIME[0], doc, config, extra, parts=RUNTIME[1:])


def _check_reference(problem, code: str) -> None:
    """The embedded code must compute what the problem's reference computes (on a small draw): a helper the
    copy missed would otherwise show up only in a user's selftest()."""
    import numpy as np

    from kfactory.judge.inputs import draw

    shape = _selftest_shapes(problem)[0]
    inputs = draw(problem, shape, next(iter(problem.spec.distributions)), 1)
    namespace: dict = {}
    exec(compile(code, f"<{problem.name} reference>", "exec"), namespace)  # noqa: S102 - the problem's own code
    got = namespace["reference"](dict(inputs), **problem.params)
    want = problem.reference.reference(dict(inputs), **problem.params)
    for t in problem.spec.outputs:
        if not np.array_equal(np.asarray(got[t.name]), np.asarray(want[t.name]), equal_nan=True):
            raise ExportError(f"the embedded copy of {problem.name}'s reference disagrees with reference.py")


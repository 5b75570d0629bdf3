"""Embedding a problem's float64 reference into an exported Python module, where that can be done standalone.

A reference embeds when `reference()` and the module-level names it reaches (helpers, constants) use no
import but numpy and math; their source is copied as it is in reference.py. Otherwise (a reference that
imports kfactory or another package, such as kda_bf16's, which reuses kda's) the module's selftest() says why
it cannot run.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ALLOWED_MODULES = frozenset({"numpy", "math"})


@dataclass(frozen=True)
class Embedded:
    """The reference's code to append to a module (empty when it cannot be embedded, with the reason)."""
    code: str
    why_not: str = ""


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _import_modules(node: ast.AST) -> list[str]:
    """The top-level modules every import statement inside `node` brings in."""
    mods = []
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            mods += [a.name.split(".")[0] for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            mods.append("." if n.level else (n.module or "").split(".")[0])
    return mods


def embed(problem) -> Embedded:
    """The reference of `problem` as standalone code defining `reference(inputs) -> outputs`, or why not."""
    path = Path(problem.directory) / "reference.py"
    try:
        text = path.read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        return Embedded("", f"the problem's reference.py cannot be read ({type(exc).__name__})")
    top: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        for name in _bound_names(node):
            top[name] = node
    if "reference" not in top:
        return Embedded("", "the problem's reference.py defines no reference()")
    needed: list[ast.stmt] = []
    foreign: set[str] = set()
    todo = [top["reference"]]
    while todo:
        node = todo.pop()
        if node in needed:
            continue
        needed.append(node)
        foreign |= set(_import_modules(node)) - ALLOWED_MODULES
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        todo += [top[name] for name in used if name in top and top[name] not in needed]
    if foreign:
        return Embedded("", f"the problem's reference imports {', '.join(sorted(foreign))}, so it cannot be embedded "
                            "in a module that needs only numpy; check this kernel with kfactory instead")
    lines = text.splitlines()
    chunks = []
    for node in sorted(needed, key=lambda n: n.lineno):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        chunks.append("\n".join(lines[start - 1:node.end_lineno]))
    code = "\n\n\n".join(chunks)
    return Embedded(f"# The problem's float64 reference, copied from {problem.name}/reference.py.\n{code}\n\n\n"
                    "_kf_reference = reference\n")

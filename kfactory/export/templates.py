"""Filling the exporter's template modules (_build_cubin.py, _runtime.py with its parts, _torch_op.py).

Each template is a real module of this package, so it is linted and read like any other code; the exporter
copies its text, replaces its docstring with the export's own and its `_CONFIG: dict = {}` marker line with the
export's configuration as a Python literal. A template too long for one module is split into parts: each part
is a module that imports what it uses of the earlier ones from kfactory (for the linters); its code is appended
without its docstring and imports, and those of its imports the template lacks are put before the _CONFIG line
(its `from __future__` import and its imports from kfactory are dropped). The copy imports nothing of kfactory."""
from __future__ import annotations

import ast
import pprint
from pathlib import Path

HERE = Path(__file__).parent
MARKER = "_CONFIG: dict = {}  # kfactory-export: config"


def fill(template: str, docstring: str, config: dict, extra: str = "", parts: tuple[str, ...] = ()) -> str:
    """The text of `template` (a file name in this package) with `docstring` for its module docstring,
    `config` for its _CONFIG, the text of each of `parts` (file names in this package: part_text) and `extra`
    (code) appended. The result is parsed, so a bad fill fails here."""
    text = (HERE / template).read_text()
    if text.count(MARKER) != 1:
        raise RuntimeError(f"{template}: expected one line {MARKER!r}")
    tree = ast.parse(text)
    first = tree.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
        raise RuntimeError(f"{template} has no module docstring to replace")
    lines = text.splitlines(keepends=True)
    rest = "".join(lines[first.end_lineno:])
    literal = pprint.pformat(config, width=110, sort_dicts=False)
    # the literal must round-trip: only plain data (str, int, float, bool, None, lists, dicts) is allowed
    if ast.literal_eval(literal) != config:
        raise RuntimeError("the export's configuration is not plain data")
    imports, codes = _imports(tree), []
    for part in parts:
        their_imports, code = part_text(part)
        imports += [i for i in their_imports if i not in imports]
        codes.append(code)
    added = "".join(f"{i}\n" for i in imports[len(_imports(tree)):])   # the parts' imports the template lacks
    config_line = (added + "\n" if added else "") + f"_CONFIG: dict = {literal}"
    out = f'"""{_docstring(docstring)}"""\n' + rest.replace(MARKER, config_line)
    out = out.rstrip("\n") + "".join("\n\n\n" + code.rstrip("\n") for code in codes) + "\n" + extra
    ast.parse(out)
    return out


def _imports(tree: ast.Module) -> list[str]:
    return [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]


def part_text(part: str) -> tuple[list[str], str]:
    """(the imports, the code) of `part` (a file name in this package) as fill appends it to its template: the
    code without the module docstring and imports; the imports (as ast.unparse writes them) without the
    `from __future__` one and those from kfactory (what they import is defined by the template or an earlier
    part)."""
    text = (HERE / part).read_text()
    if MARKER in text:
        raise RuntimeError(f"{part}: a part has no _CONFIG of its own; it imports the template's")
    tree = ast.parse(text)
    drop: set[int] = set()
    imports = []
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            ours = isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("__future__", "kfactory")
            if not ours:
                imports.append(ast.unparse(node))
        elif not docstring:
            continue
        drop.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = text.splitlines(keepends=True)
    return imports, "".join(line for n, line in enumerate(lines, 1) if n not in drop).strip("\n") + "\n"


def _docstring(text: str) -> str:
    """Text safe inside a triple-quoted string: control characters other than line breaks made spaces,
    backslashes and quote runs escaped."""
    text = "".join(ch if ch.isprintable() or ch == "\n" else " " for ch in text)
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return text[:-1] + '\\"' if text.endswith('"') else text   # a quote next to the closing ones would join them

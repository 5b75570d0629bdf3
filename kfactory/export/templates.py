"""Filling the exporter's template modules (_build_cubin.py, _runtime.py, _torch_op.py).

Each template is a real module of this package, so it is linted and read like any other code; the exporter
copies its text, replaces its docstring with the export's own and its `_CONFIG: dict = {}` marker line with the
export's configuration as a Python literal. The copy imports nothing of kfactory."""
from __future__ import annotations

import ast
import pprint
from pathlib import Path

HERE = Path(__file__).parent
MARKER = "_CONFIG: dict = {}  # kfactory-export: config"


def fill(template: str, docstring: str, config: dict, extra: str = "") -> str:
    """The text of `template` (a file name in this package) with `docstring` for its module docstring,
    `config` for its _CONFIG and `extra` (code) appended. The result is parsed, so a bad fill fails here."""
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
    out = f'"""{_docstring(docstring)}"""\n' + rest.replace(MARKER, f"_CONFIG: dict = {literal}") + extra
    ast.parse(out)
    return out


def _docstring(text: str) -> str:
    """Text safe inside a triple-quoted string: control characters other than line breaks made spaces,
    backslashes and quote runs escaped."""
    text = "".join(ch if ch.isprintable() or ch == "\n" else " " for ch in text)
    text = text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return text[:-1] + '\\"' if text.endswith('"') else text   # a quote next to the closing ones would join them

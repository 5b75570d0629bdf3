"""The launch rule of a cuda kernel: grid, block and dynamic shared memory as expressions over the shape
symbols and the design point's parameters, evaluated per call.

A rule is a dict {"grid": expr, "block": expr, "smem": expr (optional, default "0"), "params": {...}}.
Each expression is a simpleeval expression (no attribute access, no imports) over the shape symbols and the
params (a shape symbol wins over a param of the same name), with the functions min, max, abs, ceil and
cdiv(a, b) (ceiling division). grid and block give an int or a tuple/list of 1 to 3 ints; smem an int.

A hand-written .cu or .ptx file carries its rule in a comment header (see parse_header):

    // kfactory: grid=(cdiv(cols, 256), rows) block=256 smem=0
"""
from __future__ import annotations

import re
from dataclasses import dataclass


from kfactory.platform.expressions import ERRORS as EXPRESSION_ERRORS, evaluate

MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS = 1024
RULE_KEYS = ("grid", "block", "smem")


@dataclass(frozen=True)
class Launch:
    """One launch configuration: grid and block as (x, y, z), dynamic shared memory in bytes."""
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int = 0

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def as_json(self) -> dict:
        return {"grid": list(self.grid), "block": list(self.block), "smem": self.smem}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _eval(what: str, expr, names: dict):
    if not isinstance(expr, str):  # a literal from YAML (128, [4, 2]) is taken as it is
        return expr
    try:
        return evaluate(expr, names)
    except EXPRESSION_ERRORS as e:
        raise ValueError(f"launch rule: {what}={expr!r} cannot be evaluated with {names}: "
                         f"{type(e).__name__}: {e}") from e


def _dims(what: str, expr, value, limits: tuple[int, int, int]) -> tuple[int, int, int]:
    vals = list(value) if isinstance(value, (tuple, list)) else [value]
    if not 1 <= len(vals) <= 3:
        raise ValueError(f"launch rule: {what}={expr!r} gave {value!r}; expected an int or 1 to 3 ints")
    for axis, v in zip("xyz", vals):
        if not _is_int(v):
            raise ValueError(f"launch rule: {what}={expr!r} gave {value!r}; {what}.{axis} is "
                             f"{type(v).__name__} {v!r}, not an integer (use cdiv(a, b) or a // b, not a / b)")
    vals += [1] * (3 - len(vals))
    for axis, v, lim in zip("xyz", vals, limits):
        if not 1 <= v <= lim:
            raise ValueError(f"launch rule: {what}={expr!r} gave {what}.{axis}={v}; it must be in 1..{lim}")
    return vals[0], vals[1], vals[2]


def evaluate_launch(rule: dict, shape: dict[str, int]) -> Launch:
    """The launch configuration of `rule` at `shape`; a ValueError says which expression is wrong and why."""
    if not isinstance(rule, dict):
        raise ValueError(f"launch rule must be a dict with grid and block, not {type(rule).__name__}")
    missing = [k for k in ("grid", "block") if rule.get(k) in (None, "")]
    if missing:
        raise ValueError(f"launch rule has no {' and '.join(missing)} (got keys {sorted(rule)})")
    params = rule.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError(f"launch rule params must be a dict, not {type(params).__name__}")
    names = {**params, **shape}
    grid = _dims("grid", rule["grid"], _eval("grid", rule["grid"], names), MAX_GRID)
    block = _dims("block", rule["block"], _eval("block", rule["block"], names), MAX_BLOCK)
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS:
        raise ValueError(f"launch rule: block={rule['block']!r} gave {block} = {threads} threads per block; "
                         f"at most {MAX_THREADS}")
    smem_expr = rule.get("smem", "0")
    smem_expr = "0" if smem_expr in (None, "") else smem_expr
    smem = _eval("smem", smem_expr, names)
    if not _is_int(smem):
        raise ValueError(f"launch rule: smem={smem_expr!r} gave {type(smem).__name__} {smem!r}, not an integer")
    if smem < 0:
        raise ValueError(f"launch rule: smem={smem_expr!r} gave {smem}; dynamic shared memory must be >= 0")
    return Launch(grid, block, smem)


_HEADER = re.compile(r"^\s*(?://+|/\*+)\s*kfactory\s*:\s*(?P<body>.*?)\s*(?:\*/)?\s*$")
_KEY_AT = re.compile(r"\s*([A-Za-z_]\w*)\s*=(?!=)")


def _split_pairs(body: str) -> list[tuple[str, str]]:
    """'grid=(cdiv(cols, 256), rows) block=128' -> [('grid', '(cdiv(cols, 256), rows)'), ('block', '128')]:
    a value runs until the next `name=` outside brackets."""
    pairs: list[tuple[str, str]] = []
    pos = 0
    m = _KEY_AT.match(body, pos)
    if not m:
        raise ValueError(f"kfactory header: expected name=value pairs, got {body!r}")
    while m:
        key, start = m.group(1), m.end()
        depth, i = 0, start
        nxt = None
        while i < len(body):
            ch = body[i]
            if ch in "([{":
                depth += 1
            elif ch in ")]}":
                depth -= 1
            elif ch.isspace() and depth == 0:
                nxt = _KEY_AT.match(body, i)
                if nxt:
                    break
            i += 1
        value = body[start:i].strip()
        if not value:
            raise ValueError(f"kfactory header: {key}= has no value in {body!r}")
        if depth != 0:
            raise ValueError(f"kfactory header: unbalanced brackets in {key}={value!r}")
        pairs.append((key, value))
        m = nxt if i < len(body) else None
    return pairs


def parse_header(source: str) -> dict | None:
    """The launch rule in a source's comment header, or None when it has none.

    The header is the first line of the form `// kfactory: grid=EXPR block=EXPR [smem=EXPR]` (also
    `/* kfactory: ... */`); EXPR may contain spaces inside brackets, e.g. `grid=(cdiv(cols, 256), rows)`.
    The returned rule has "params": {} (a hand-written kernel has no design point). A header with a
    missing grid or block, an unknown or repeated name raises ValueError.
    """
    for line in source.splitlines():
        m = _HEADER.match(line)
        if not m:
            continue
        rule: dict = {}
        for key, value in _split_pairs(m.group("body")):
            if key not in RULE_KEYS:
                raise ValueError(f"kfactory header: unknown name {key!r}; expected {', '.join(RULE_KEYS)}")
            if key in rule:
                raise ValueError(f"kfactory header: {key} is given twice")
            rule[key] = value
        missing = [k for k in ("grid", "block") if k not in rule]
        if missing:
            raise ValueError(f"kfactory header: missing {' and '.join(missing)} in {line.strip()!r}")
        rule.setdefault("smem", "0")
        rule["params"] = {}
        return rule
    return None

"""Strategy options: each strategy module declares its own in a table, and every caller's options are checked
against it before the strategy is made.

The table is Kernel Tuner's `_options` pattern: option name -> (description, default, type), here an `Option`
with optional choices and bounds. `OPTIONS` in a strategy module is its table; `parse` checks a campaign's options
(strings from a spec or the command line, or typed values from Python) and converts them to the table's types;
`describe` prints the table (`kfactory strategies describe NAME`).

A portfolio's members are strategies too: `MEMBER.OPTION` (e.g. `tpe.startup=20`) sets an option of one member, and
is checked against that member's table.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple


class BadStrategyOption(ValueError):
    """An option the strategy does not have, or a value its table does not allow; the message names the allowed."""


class Option(NamedTuple):
    """One row of a strategy's table: what the option does, its default, its type (int, float, bool, str, tuple of
    str or dict), and optionally the values allowed (choices; for a tuple, of each item) and inclusive bounds."""
    description: str
    default: Any
    type: type
    choices: tuple = ()
    low: float | None = None
    high: float | None = None


#: how a boolean is written in a spec or on the command line
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def type_name(opt: Option) -> str:
    """The type as the tables and errors say it."""
    names: dict[type, str] = {tuple: "list", dict: "mapping"}
    return names.get(opt.type, opt.type.__name__)


def _convert(opt: Option, value: Any) -> Any:
    """`value` as the option's type: a string is parsed; a typed value must already be of it. ValueError if not."""
    if opt.type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"is not a boolean ({'/'.join(_TRUE[:2] + _FALSE[:2])})")
    if opt.type is int:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError("is not an integer")
        try:
            return int(value)  # int("1.5") raises: a fraction is no integer
        except ValueError:
            raise ValueError("is not an integer") from None
    if opt.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError("is not a number")
        try:
            number = float(value)
        except ValueError:
            raise ValueError("is not a number") from None
        if not math.isfinite(number):
            raise ValueError("is not a finite number")
        return number
    if opt.type is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ValueError("is not a comma-separated list of names")
        return tuple(i.strip() for i in items if i.strip())
    if opt.type is dict:
        if not isinstance(value, dict):
            raise ValueError("is not a mapping (on a spec or the command line, set MEMBER.OPTION=VALUE instead)")
        return value
    if not isinstance(value, str):
        raise ValueError("is not a string")
    return value


def _check_value(opt: Option, value: Any) -> None:
    """ValueError when a converted value is outside the option's choices or bounds."""
    items = value if opt.type is tuple else (value,)
    if opt.choices and (bad := [i for i in items if i not in opt.choices]):
        which = f" ({bad[0]!r})" if opt.type is tuple else ""
        raise ValueError(f"is not one of {', '.join(map(str, opt.choices))}{which}")
    if opt.type is tuple and not items:
        raise ValueError("is an empty list")
    if opt.low is not None and value < opt.low:
        raise ValueError(f"is below {opt.low}")
    if opt.high is not None and value > opt.high:
        raise ValueError(f"is above {opt.high}")


def parse_one(strategy: str, table: dict[str, Option], name: str, value: Any) -> Any:
    """One option's value, converted and checked; BadStrategyOption names the option and what it allows."""
    opt = table.get(name)
    if opt is None:
        allowed = ", ".join(table) or "none"
        raise BadStrategyOption(f"strategy {strategy} has no option {name!r}; its options: {allowed} "
                                f"(kfactory strategies describe {strategy})")
    try:
        converted = _convert(opt, value)
        _check_value(opt, converted)
    except ValueError as e:
        raise BadStrategyOption(f"strategy {strategy}: option {name}={_shown(value)} {e} ({name}, "
                                f"{_article(type_name(opt))} {type_name(opt)}: {opt.description})") from None
    return converted


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _shown(value: Any) -> str:
    """A value as an error quotes it: its start only, when it is long."""
    text = str(value)
    return text if len(text) <= 60 else f"{text[:60]}..."


def describe(strategy: str, doc: str, table: dict[str, Option]) -> str:
    """A strategy's documentation: the first paragraph of its module's docstring and its option table."""
    summary = " ".join((doc or "").strip().split("\n\n")[0].split())
    lines = [f"{strategy}: {summary}", ""]
    if not table:
        return "\n".join(lines + ["options: none"])
    rows = [(name, type_name(opt), _default(opt), _allowed(opt), opt.description) for name, opt in table.items()]
    header = ("option", "type", "default", "allowed", "description")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
    lines += ["", f"set with: kfactory run PROBLEM --strategy {strategy} --strategy-option NAME=VALUE (repeatable), "
              "or a campaign spec's strategy_options"]
    return "\n".join(lines)


def _default(opt: Option) -> str:
    if opt.type is tuple:
        return ",".join(opt.default)
    if opt.default is None or opt.default == {}:
        return "-"
    return str(opt.default).lower() if opt.type is bool else str(opt.default)


def _allowed(opt: Option) -> str:
    if opt.choices:
        return "|".join(map(str, opt.choices))
    if opt.low is None and opt.high is None:
        return "-"
    low = "-inf" if opt.low is None else opt.low
    high = "inf" if opt.high is None else opt.high
    return f"[{low},{high}]"  # no space: one cell of the table, one word

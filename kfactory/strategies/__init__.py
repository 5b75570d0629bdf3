"""Search strategies behind one ask/tell interface, one module each, chosen by name.

`make_strategy(name, space, seed, **options)` makes one: `space` is the design space (base.Space, every family of
the problem on the target), `seed` fixes its random choices, and `options` are checked against the strategy's
table (`OPTIONS` in its module, see options.py; `kfactory strategies describe NAME` prints it). Then:
- `ask()` returns the next Point (family, params) to try, or None when the strategy has nothing left to propose;
- `tell(point, score)` reports a result: seconds, lower is better, or None for a failure (strategies learn from
  failures too);
- `warm(evidence)` gives other campaigns' measurements before the first ask, and `trust()` says how far the
  strategy trusts each of their sources (None when it measures no such thing).
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.options import BadStrategyOption, Option, describe, parse_one

KNOWN = ("random", "grid", "evolutionary", "surrogate", "tpe", "cma", "portfolio", "default", "descent")


class UnknownStrategy(ValueError):
    """No strategy module by that name."""


def _module(name: str) -> ModuleType:
    if name not in KNOWN:
        raise UnknownStrategy(f"unknown strategy {name!r}; known: {', '.join(KNOWN)}")
    return importlib.import_module(f"kfactory.strategies.{name}")


def options_table(name: str) -> dict[str, Option]:
    """The strategy's option table (UnknownStrategy for a name not in KNOWN)."""
    return _module(name).OPTIONS


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options converted to the strategy's types and checked against its table; BadStrategyOption for an
    option it does not have or a value its table does not allow. A portfolio's `MEMBER.OPTION` entries are
    checked against that member's table and gathered into its member_options."""
    table = options_table(name)
    plain = {k: v for k, v in options.items() if "." not in k}
    out = {k: parse_one(name, table, k, v) for k, v in plain.items()}
    dotted = {k: v for k, v in options.items() if "." in k}
    if dotted or out.get("member_options"):
        out["member_options"] = _member_options(name, table, out, dotted)
    return out


def _member_options(name: str, table: dict[str, Option], given: dict, dotted: dict) -> dict[str, dict]:
    """{member: its checked options}, from member_options and the `MEMBER.OPTION` entries."""
    if "members" not in table:
        key = next(iter(dotted))
        raise BadStrategyOption(f"strategy {name} has no members: {key!r} names no option of it; its options: "
                                f"{', '.join(table) or 'none'} (kfactory strategies describe {name})")
    members = given.get("members", table["members"].default)
    merged: dict[str, dict] = {m: dict(o) for m, o in (given.get("member_options") or {}).items()}
    for key, value in dotted.items():
        member, _, option = key.partition(".")
        merged.setdefault(member, {})[option] = value
    for member in merged:
        if member not in members:
            raise BadStrategyOption(f"strategy {name}: {member!r} is not one of its members ({', '.join(members)}); "
                                    f"set members=... to choose them")
    return {m: {k: parse_one(m, options_table(m), k, v) for k, v in opts.items()} for m, opts in merged.items()}


def make_strategy(name: str, space: Space, seed: int, **options: Any) -> Strategy:
    """The strategy called `name` over `space`, with its options checked first (UnknownStrategy,
    BadStrategyOption)."""
    module = _module(name)
    return module.make(space, seed, **check_options(name, options))


def describe_strategy(name: str) -> str:
    """`kfactory strategies describe NAME`: what the strategy does (its module's docstring) and its option table."""
    module = _module(name)
    return describe(name, module.__doc__ or "", module.OPTIONS)


__all__ = ["KNOWN", "BadStrategyOption", "Option", "Point", "Space", "Strategy", "UnknownStrategy", "check_options",
           "describe_strategy", "make_strategy", "options_table"]

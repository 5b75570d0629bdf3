"""Search strategies behind one ask/tell interface, one module each, chosen by name.

A strategy is built as `make(space, rng, **options)`; `ask()` returns the next (family, params) to try or None
when the space is exhausted; `tell(family, params, score)` reports a result (score in seconds, lower is better;
None for a failure: strategies learn from failures too).
"""
from __future__ import annotations

import importlib

from kfactory.strategies.base import Point, Space, Strategy

KNOWN = ("random", "grid", "evolutionary", "surrogate", "tpe", "cma", "portfolio", "default")


class UnknownStrategy(ValueError):
    """No strategy module by that name."""


def make_strategy(name: str, space: Space, seed: int, **options) -> Strategy:
    """The strategy called `name` over `space`."""
    if name not in KNOWN:
        raise UnknownStrategy(f"unknown strategy {name!r}; known: {', '.join(KNOWN)}")
    return importlib.import_module(f"kfactory.strategies.{name}").make(space, seed, **options)


__all__ = ["KNOWN", "Point", "Space", "Strategy", "UnknownStrategy", "make_strategy"]

"""Targets, one package each (kfactory/targets/<name>/, whose `target` module exposes
`make(option, settings) -> Target`)."""
from __future__ import annotations

import importlib

from kfactory.targets.base import BenchResult, CallResult, CompileResult, Session, Target

KNOWN = ("cpu", "cuda", "replay")


class UnknownTarget(ValueError):
    """No target module by that name."""


def get_target(spec: str, settings) -> Target:
    """The target for a spec such as 'cpu' or 'cuda:sm_90a' (the part after ':' is the target's option)."""
    name, _, option = spec.partition(":")
    if name not in KNOWN:
        raise UnknownTarget(f"unknown target {spec!r}; known targets: {', '.join(KNOWN)}")
    return importlib.import_module(f"kfactory.targets.{name}.target").make(option, settings)


__all__ = ["BenchResult", "CallResult", "CompileResult", "Session", "Target", "get_target", "UnknownTarget"]

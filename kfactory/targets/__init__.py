"""Targets, one package each (kfactory/targets/<name>/, whose `target` module exposes
`make(option, settings) -> Target`)."""
from __future__ import annotations

import importlib
import re

from kfactory.targets.base import BenchResult, CallResult, CompileResult, Session, Target

KNOWN = ("cpu", "cuda", "replay")
#: a cuda architecture's form: sm_NN, sm_NNa (arch-specific: wgmma, TMA, tcgen05) and sm_NNf (family-specific,
#: CUDA 12.9 on)
CUDA_ARCH_RE = re.compile(r"sm_(\d{1,3})([af]?)")
#: a shape as the archive files it: the problem's symbols' values in order, joined by x (4096x4096); an engine's
#: timings are of a decode context (128) and a prefill (prefill_128)
SHAPE_RE = re.compile(r"([a-z]+_)?[1-9]\d*(x[1-9]\d*)*")


class UnknownTarget(ValueError):
    """No target module by that name."""


def get_target(spec: str, settings) -> Target:
    """The target for a spec such as 'cpu' or 'cuda:sm_90a' (the part after ':' is the target's option)."""
    name, _, option = spec.partition(":")
    if name not in KNOWN:
        raise UnknownTarget(f"unknown target {spec!r}; known targets: {', '.join(KNOWN)}")
    return importlib.import_module(f"kfactory.targets.{name}.target").make(option, settings)


def filter_error(spec: str) -> str:
    """Why `spec` can name no campaign's target, as a query filters by it (kfactory best, lessons, export:
    `cuda` for every architecture, `cuda:sm_90a` for one), or "" when it can. A mistyped target would otherwise
    match nothing and read as "no measurement"."""
    name, _, option = spec.partition(":")
    if name not in KNOWN:
        return f"unknown target {spec!r}; known targets: {', '.join(KNOWN)} (cuda:sm_90a for one architecture)"
    # (`cpu:` and `cuda:`, an empty option, are the bare target, as get_target reads them)
    if name == "cpu" and option:
        return f"the cpu target takes no option (got {spec!r})"
    if name == "cuda" and option and not CUDA_ARCH_RE.fullmatch(option):
        return f"malformed cuda architecture {option!r}: expected sm_NN or sm_NNa, e.g. cuda:sm_90a"
    return ""


def shape_error(shape: str) -> str:
    """Why `shape` is no shape a query can ask for, or "" when it is one."""
    if SHAPE_RE.fullmatch(shape):
        return ""
    return (f"malformed shape {shape!r}: write the problem's sizes in its symbols' order joined by x, e.g. 4096x4096 "
            "(an engine's: 128, prefill_128)")


__all__ = ["BenchResult", "CallResult", "CompileResult", "Session", "Target", "get_target", "UnknownTarget"]

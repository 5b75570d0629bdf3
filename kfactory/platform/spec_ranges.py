"""The range of every numeric field of a CampaignSpec, checked at submit (planner) and in the CLI first.

A value outside its range is refused naming the field (and the CLI flag that sets it), before any protobuf is
built: a Python int past a field's width raises a bare ValueError in protobuf, a negative `parallel` would make
`in_flight() >= parallel` always true and a NaN or infinite time budget would never be spent, so such a
campaign would run until cancelled.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from kfactory.platform.config import DEVICE_SECONDS_MAX


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    flag: str       # the CLI flag that sets the field
    meaning: str    # what 0 means, where it means something


INT32_MAX = 2**31 - 1
#: every numeric field of CampaignSpec (proto/kfactory/v1/events.proto); a test checks none is missing
RANGES: dict[str, Range] = {
    "budget_candidates": Range(0, 1_000_000, "--budget", "0: no candidate limit (then give --seconds)"),
    "budget_seconds": Range(0, 366 * 86400, "--seconds", "0: no time limit"),
    "budget_device_seconds": Range(0, DEVICE_SECONDS_MAX, "--device-seconds",
                                   "0: the planner's KFACTORY_DEVICE_SECONDS, else no device-time limit"),
    "threads": Range(0, 4096, "--threads", "0: every core"),
    "seed": Range(0, 2**64 - 1, "--seed", "0: a random seed"),
    "parallel": Range(0, 100_000, "--parallel", "0: the planner's default (kfactory.judge.order.default_parallel)"),
    "warm_start": Range(0, 10_000, "--warm", "0: a cold start"),
    "token_budget": Range(0, 2**62, "--token-budget", "0: the configured default"),
    "timing_rounds": Range(0, 100, "--rounds", "0: the first timing only"),
    "showdown_rounds": Range(0, 100, "--showdown", "0: no showdown"),
    "showdown_margin": Range(0, 100, "--showdown-margin", "0: the default, 1.15; else at least 1"),
    "goal_fraction": Range(0, 1, "--goal", "0: no goal"),
}
#: `kfactory priors --limit` and PriorsRequest.limit (0: the default, 8)
PRIORS_LIMIT = Range(0, 100_000, "--limit", "0: the default, 8")


def range_error(name: str, value: float, r: Range, named: bool = True) -> str:
    """Why `value` cannot be field `name` ("" when it can); `named`: the message starts with the field and flag."""
    if isinstance(value, float) and not math.isfinite(value) or not r.low <= value <= r.high:
        head = f"{name} ({r.flag}): " if named else ""
        return f"{head}{value!r} is out of range: give a number from {_num(r.low)} to {_num(r.high)} ({r.meaning})"
    return ""


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def spec_errors(values: Mapping[str, float] | object) -> list[str]:
    """One message per field of `values` (a CampaignSpec or the CLI's dict of its numbers) out of its range."""
    out = []
    for name, r in RANGES.items():
        value = values[name] if isinstance(values, Mapping) else getattr(values, name)
        if value is not None and (err := range_error(name, value, r)):
            out.append(err)
    return out


def cli_type(name: str, number=int):
    """An argparse `type=` that reads `number` and refuses it outside field `name`'s range: argparse then prints
    one line naming the flag and exits 2."""
    import argparse

    r = PRIORS_LIMIT if name == "priors_limit" else RANGES[name]

    def parse(text: str):
        try:
            value = number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if number is int else 'a number'}")
        if err := range_error(name, value, r, named=False):  # argparse names the flag
            raise argparse.ArgumentTypeError(err)
        return value
    parse.__name__ = number.__name__  # argparse names the type in its messages
    return parse

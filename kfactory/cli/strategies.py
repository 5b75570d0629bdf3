"""`kfactory strategies list|describe NAME`: the search strategies, and each one's options as its table declares
them (kfactory/strategies/options.py), which `--strategy-option NAME=VALUE` and a spec's strategy_options set."""
from __future__ import annotations

import argparse
import re
import sys

EXIT_USAGE = 2


def add_parser(sub) -> None:
    """The `strategies` command group."""
    p = sub.add_parser("strategies", help="list the search strategies, or describe one and its options",
                       description="The search strategies (--strategy NAME) and their options (--strategy-option "
                                   "NAME=VALUE, repeatable; a portfolio member's as MEMBER.NAME=VALUE).")
    p.add_argument("action", choices=("list", "describe"))
    p.add_argument("name", nargs="?", help="describe: the strategy")


def run(args: argparse.Namespace) -> int:
    """Print the list or one strategy's description; exit 2 for a missing or unknown name."""
    from kfactory.strategies import KNOWN, UnknownStrategy, describe_strategy

    if args.action == "list":
        for name in KNOWN:
            print(f"{name:13s} {_summary(describe_strategy(name))}")
        return 0
    if not args.name:
        print("kfactory strategies describe: name a strategy (kfactory strategies list)", file=sys.stderr)
        return EXIT_USAGE
    try:
        print(describe_strategy(args.name))
    except UnknownStrategy as e:
        print(f"kfactory: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _summary(description: str) -> str:
    """The first sentence of a description's first line, without the 'name: ' it starts with, clipped."""
    text = re.split(r"(?<=\.)\s", description.split("\n", 1)[0].split(": ", 1)[-1])[0]
    return text if len(text) <= 100 else text[:97] + "..."

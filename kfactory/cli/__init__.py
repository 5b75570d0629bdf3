"""The `kfactory` command line (kfactory.cli.main), and what its commands share: exit statuses, argparse types."""
from __future__ import annotations

import argparse

#: a service or the host could not do it now; the same command may succeed later (sysexits' EX_UNAVAILABLE)
EXIT_UNAVAILABLE = 69


def query_filter(check: str):
    """An argparse `type=` for a query's --target or --shape: one kfactory.targets' `check` (filter_error,
    shape_error) finds wrong is refused (argparse names the flag, exits 2) instead of matching nothing."""
    def parse(text: str) -> str:
        import kfactory.targets   # numpy with it: only for a command given the flag

        if text and (err := getattr(kfactory.targets, check)(text)):
            raise argparse.ArgumentTypeError(err)
        return text.removesuffix(":")   # `cuda:` is `cuda`: every architecture's
    return parse

"""What a process imports before it does any work: every service, runner and CLI command is a fresh interpreter,
started many times in a campaign (and hundreds of times in this suite), so a heavy module imported at start is
paid on each. scipy.stats alone cost 0.8 s of every planner, compiler, coder and benchmarker start."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kfactory.platform.app import SERVICE_NAMES

#: imported where they are used, never at a process's start
HEAVY = ("scipy.stats", "scipy.linalg", "scipy.optimize")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_a_service_starts_without_scipy(service):
    loaded = _modules_after(f"from kfactory.platform.app import service_class\nservice_class({service!r})")
    assert f"kfactory.services.{service}.service" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_command_lines_parser_imports_neither_scipy_nor_the_engines_modules():
    loaded = _modules_after("from kfactory.cli.main import build_parser\nbuild_parser()")
    assert "kfactory.engines.defaults" in loaded
    assert not loaded & {*HEAVY, "kfactory.engines.showdown", "kfactory.engines.design"}, loaded


def test_the_interval_of_the_median_still_uses_scipy_where_it_is_computed():
    from kfactory.judge.stats import latin_square_halfwidth, median_ranks
    import numpy as np

    # the order-statistic interval: P(B <= 1) for B ~ Bin(9, 1/2) is 10/512 <= 0.025 < P(B <= 2) = 46/512
    assert median_ranks(9) == (1, 7)
    assert median_ranks(5) == (0, 4)
    logs = np.log(np.array([[1.0, 1.01, 0.99], [2.0, 2.02, 1.98], [3.0, 3.03, 2.97]]))
    assert latin_square_halfwidth(logs) > 0

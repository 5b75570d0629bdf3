"""What a process imports before it does any work: every service, runner and CLI command is a fresh interpreter,
started many times in a campaign (and hundreds of times in this suite), so a heavy module imported at start is
paid on each. scipy.stats alone cost 0.8 s of every planner, compiler, coder and benchmarker start."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from kfactory.platform.app import SERVICE_NAMES

#: imported where they are used, never at a process's start
HEAVY = ("scipy.stats", "scipy.linalg", "scipy.optimize")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_a_service_starts_without_scipy_but_the_benchmarker_with_its_intervals(service):
    loaded = _modules_after(f"from kfactory.platform.app import service_class\nservice_class({service!r})")
    assert f"kfactory.services.{service}.service" in loaded
    if service == "benchmarker":   # it needs scipy.stats at its first summary, inside a lease: it imports it first
        assert "scipy.stats" in loaded
    else:
        assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_command_lines_parser_imports_neither_scipy_nor_the_engines_modules():
    loaded = _modules_after("from kfactory.cli.main import build_parser\nbuild_parser()")
    assert "kfactory.engines.defaults" in loaded
    assert not loaded & {*HEAVY, "kfactory.engines.showdown", "kfactory.engines.design"}, loaded


def test_an_engine_child_starts_without_the_tokenizer_and_the_package_still_gives_it():
    """An engine child (started for every engine timed) never tokenizes: jinja2 and tokenizers (0.2 s) are
    imported by the first use of kfactory.models.Tokenizer, or by training tiny-llama's tokenizer."""
    loaded = _modules_after("import kfactory.engines.child")
    assert "kfactory.models.loader" in loaded and "kfactory.models.tiny" in loaded
    assert not loaded & {"jinja2", "tokenizers", "kfactory.models.tokenizer"}, sorted(loaded)
    from kfactory.models import Tokenizer
    from kfactory.models.tokenizer import Tokenizer as direct
    assert Tokenizer is direct


def test_the_intervals_are_computed_as_before_with_scipy_imported_where_they_are():
    from kfactory.judge.stats import latin_square_halfwidth, median_ranks

    # the order-statistic interval: P(B <= 1) for B ~ Bin(9, 1/2) is 10/512 <= 0.025 < P(B <= 2) = 46/512
    assert median_ranks(9) == (1, 7)
    assert median_ranks(5) == (0, 4)
    # 3 kernels x 3 runs: kernel and run effects plus eps * f((k + j) mod 3), f = (1, -1, 0), which is orthogonal
    # to kernels, runs and places ((k - j) mod 3), so it is the whole residual: s = eps sqrt(6 / 2), 2 degrees of
    # freedom; Student's t at 0.975 with 2 of them is 0.95 sqrt(2 / (1 - 0.95^2)) (its CDF is 1/2 + t / 2 sqrt(2 + t^2))
    eps, f = 0.01, np.array([1.0, -1.0, 0.0])
    k, j = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    logs = np.log([1.0, 2.0, 3.0])[:, None] + np.array([0.0, 0.02, -0.01])[None, :] + eps * f[(k + j) % 3]
    t975 = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2))
    assert latin_square_halfwidth(logs) == pytest.approx(t975 * eps * math.sqrt(3) / math.sqrt(6), rel=1e-9)

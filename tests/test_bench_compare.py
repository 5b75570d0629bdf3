"""bench/throughput.py's comparison of two campaigns' best kernels over blocks (_block_ratios): the ratios are
geometric means of the blocks' ratios, the interval a 95% t-interval over blocks, and a difference is outside the
noise only when that interval leaves out 1."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t

BENCH = Path(__file__).resolve().parent.parent / "bench" / "throughput.py"


def _load():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("throughput_bench", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_block_ratios_are_geometric_means_with_a_t_interval():
    blocks = [{"new": 1.00, "baseline": 1.02, "control": 0.99}, {"new": 1.01, "baseline": 1.00, "control": 1.00},
              {"new": 0.99, "baseline": 1.00, "control": 1.01}, {"new": 1.03, "baseline": 1.01, "control": 1.02}]
    out = _load()._block_ratios(blocks)
    logs = np.log([b["new"] / b["baseline"] for b in blocks])
    half = student_t.ppf(0.975, 3) * np.std(logs, ddof=1) / 2
    assert out["new_over_baseline"] == pytest.approx(math.exp(logs.mean()), abs=1e-4)
    assert out["new_interval"] == pytest.approx([math.exp(logs.mean() - half), math.exp(logs.mean() + half)],
                                                abs=1e-4)
    assert out["new_blocks"] == pytest.approx([b["new"] / b["baseline"] for b in blocks], abs=1e-4)
    assert out["blocks"] == 4 and not out["significant"] and not out["control_significant"]
    assert out["new_over_control"] == pytest.approx(
        math.exp(np.mean(np.log([b["new"] / b["control"] for b in blocks]))), abs=1e-4)


def test_a_difference_every_block_agrees_on_is_outside_the_noise():
    blocks = [{"new": 1.05 + 0.002 * i, "baseline": 1.0, "control": 1.0 + 0.003 * (-1) ** i} for i in range(4)]
    out = _load()._block_ratios(blocks)
    assert out["significant"] and out["new_interval"][0] > 1.04
    assert not out["control_significant"]
    assert out["new_over_control_significant"]


def test_the_verdict_is_at_the_scored_shape_and_the_other_search_s_reach_is_found_by_design_point():
    from kfactory.problems import load_problem

    bench, softmax = _load(), load_problem("softmax")   # scored at 4096x4096, its first optimisation shape
    slower_elsewhere = {"4096x4096": {"new_interval": [0.93, 0.98]}, "1x50257": {"new_interval": [1.001, 1.02]}}
    assert bench.verdict(slower_elsewhere, softmax) == {"scored_shape": "4096x4096", "best_no_worse": True}
    slower = {"4096x4096": {"new_interval": [1.01, 1.05]}, "1x50257": {"new_interval": [0.9, 0.95]}}
    assert bench.verdict(slower, softmax)["best_no_worse"] is False
    assert bench.verdict({"same_kernel": True}, softmax)["best_no_worse"] is True
    assert bench.verdict({"4096x4096": {"error": "WRONG_RESULT: ..."}}, softmax)["best_no_worse"] is None
    other = [{"params": {"vec": 16, "unroll": 4}, "score_s": 0.0056, "screened_out": False},
             {"params": {"vec": 16, "unroll": 1}, "score_s": 0.0060, "screened_out": True}]
    assert bench.reached({"params": {"unroll": 1, "vec": 16}}, other) == {"rank": 1, "score_s": 0.0060,
                                                                          "screened_out": True}
    assert bench.reached({"params": {"vec": 8, "unroll": 1}}, other) is None


def test_the_verdict_over_seeds_pools_the_seeds_ratios_with_a_t_interval_over_them():
    """--seeds: throughput ratios and best kernels over several seeds (the same kernel counts as 1; a seed whose
    comparison failed counts in neither the ratios nor the interval)."""
    bench = _load()
    runs = [{"throughput_ratio": 3.2, "best_no_worse": True, "scored_shape": "4096x4096",
             "best_interleaved": {"4096x4096": {"new_over_baseline": 1.02}}},
            {"throughput_ratio": 4.0, "best_no_worse": True, "best_interleaved": {"same_kernel": True}},
            {"throughput_ratio": 2.5, "best_no_worse": False, "scored_shape": "4096x4096",
             "best_interleaved": {"4096x4096": {"new_over_baseline": 0.97}}},
            {"throughput_ratio": 3.0, "best_no_worse": None, "scored_shape": "4096x4096",
             "best_interleaved": {"4096x4096": {"error": "WRONG_RESULT"}}}]
    out = bench.over_seeds(runs)
    assert out["throughput_ratios"] == [3.2, 4.0, 2.5, 3.0] and out["throughput_ratio_least"] == 2.5
    assert out["throughput_ratio_geomean"] == pytest.approx((3.2 * 4.0 * 2.5 * 3.0) ** 0.25, abs=1e-3)
    assert out["best_no_worse_seeds"] == "2 of 3"   # the failed comparison decides nothing
    logs = np.log([1.02, 1.0, 0.97])
    half = student_t.ppf(0.975, 2) * np.std(logs, ddof=1) / math.sqrt(3)
    assert out["best_new_over_baseline"] == [1.02, 1.0, 0.97]
    assert out["best_new_over_baseline_interval"] == pytest.approx(
        [math.exp(logs.mean() - half), math.exp(logs.mean() + half)], abs=1e-4)
    assert out["best_no_worse_over_seeds"] is True
    worse = bench.over_seeds([{"throughput_ratio": 3.0, "scored_shape": "s", "best_no_worse": False,
                               "best_interleaved": {"s": {"new_over_baseline": r}}} for r in (1.05, 1.06, 1.04)])
    assert worse["best_no_worse_over_seeds"] is False and worse["best_no_worse_seeds"] == "0 of 3"
    one = bench.over_seeds([{"throughput_ratio": 3.0, "best_no_worse": False, "scored_shape": "s",
                             "best_interleaved": {"s": {"new_over_baseline": 1.3}}}])
    assert one["best_no_worse_over_seeds"] is None and "best_new_over_baseline_interval" not in one

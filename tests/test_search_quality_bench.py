"""bench/search_quality.py on small hand-made recorded spaces: seeds run on worker processes give exactly the
figures one process gives, and --warm-only compares cold and warm starts alone, on the named targets."""
from __future__ import annotations

import gzip
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "bench" / "search_quality.py"
PARAMS = {"block_size_x": [16, 32, 64, 128], "tile": [1, 2, 3, 4], "flag": [0, 1]}
POINTS = [(b, t, f) for b in PARAMS["block_size_x"] for t in PARAMS["tile"] for f in PARAMS["flag"]]


def time_a(b, t, f):  # the two recorded devices
    return 1.0 + abs(b - 64) / 32 + abs(t - 3) + 2 * f


def time_b(b, t, f):
    return 1.0 + abs(b - 32) / 16 + abs(t - 2) * 1.5 + 2 * (1 - f)


def _bench():
    spec = importlib.util.spec_from_file_location("search_quality", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # the worker processes find the seed functions by module name
    spec.loader.exec_module(mod)
    return mod


def _write(path: Path, time_of) -> None:
    cache = {}
    for b in PARAMS["block_size_x"]:
        for t in PARAMS["tile"]:
            for f in PARAMS["flag"]:
                ms = time_of(b, t, f)
                cache[f"{b},{t},{f}"] = {"block_size_x": b, "tile": t, "flag": f, "time": ms, "times": [ms],
                                         "compile_time": 1.0, "benchmark_time": 1.0}
    with gzip.open(path, "wt") as fh:
        json.dump({"device_name": path.stem, "kernel_name": "k", "problem_size": [1],
                   "tune_params_keys": list(PARAMS), "tune_params": PARAMS, "objective": "time", "cache": cache}, fh)


def _args(data: Path, out: Path, jobs: int) -> list[str]:
    return ["--data", str(data), "--seeds", "3", "--budgets", "5", "10", "--strategies", "default", "random",
            "--kt-strategies", "--warm-max-evals", "20", "--warm-source-budget", "8", "--jobs", str(jobs),
            "--json", str(out)]


def _run(mod, data: Path, out: Path, jobs: int) -> dict:
    """The bench's figures for `jobs`, without the timings: in this process with one job; with workers in a
    process of its own (the bench forks them, and a fork of a test process whose earlier tests left gRPC's
    native threads running can crash in the child: a segfault in a worker's garbage collection seen in CI)."""
    if jobs == 1:
        assert mod.main(_args(data, out, jobs)) == 0
    else:
        run = subprocess.run([sys.executable, str(BENCH), *_args(data, out, jobs)], capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    for per in doc["spaces"].values():
        for row in per.values():
            for cell in row.values():
                cell.pop("seconds")
    doc.pop("settings")
    return doc


def test_seeds_on_two_worker_processes_give_the_figures_of_one(tmp_path):
    # without Kernel Tuner strategies to race (--kt-strategies with none) the bench never imports kernel_tuner,
    # a bench-only tool (it pulls pandas, scikit-learn and pymoo) that is not in the dev extras
    _write(tmp_path / "k-A.json.gz", time_a)
    _write(tmp_path / "k-B.json.gz", time_b)
    mod = _bench()
    two = _run(mod, tmp_path, tmp_path / "two.json", 2)
    one = _run(mod, tmp_path, tmp_path / "one.json", 1)
    assert one == two
    # the workers are the block's only: none is left to use after it (the pool starts its processes on first
    # use, so none is forked here)
    with mod.workers(2):
        assert mod._POOL is not None
    assert mod._POOL is None
    assert set(one["warm_start"]) == {"k-A", "k-B"}
    for name in ("k-A", "k-B"):
        w = one["warm_start"][name]
        assert len(w["cold"]) == len(w["warm"]) == 3
        assert all(1 <= n <= 21 for n in w["cold"] + w["warm"])
        assert one["spaces"][name]["10"]["random"]["mean_ratio"] >= 1.0
        lo, hi = w["ratio_interval_90"]
        assert lo <= w["ratio"] <= hi
    # the other device's whole space, best first, reaches A's one point within 5% of its optimum (64, 3, 0) at:
    b_order = sorted(POINTS, key=lambda k: (time_b(*k), k))
    assert one["warm_start"]["k-A"]["evidence_rank_whole"] == b_order.index((64, 3, 0)) + 1


def time_c(b, t, f):  # a third device, upside down against A
    return 12.0 - time_a(b, t, f)


def test_warm_only_compares_the_named_targets_warmed_from_every_other_device(tmp_path, capsys):
    for name, time_of in (("A", time_a), ("B", time_b), ("C", time_c)):
        _write(tmp_path / f"k-{name}.json.gz", time_of)
    mod = _bench()
    out = tmp_path / "warm.json"
    assert mod.main(["--data", str(tmp_path), "--warm-only", "--warm-targets", "k-A", "--seeds", "3", "--budgets",
                     "5", "10", "--warm-max-evals", "20", "--warm-source-budget", "8", "--jobs", "1",
                     "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert all(not row for per in doc["spaces"].values() for row in per.values())  # no strategy was raced
    [(name, w)] = doc["warm_start"].items()
    assert name == "k-A" and w["from"] == ["k-B", "k-C"]
    assert w["informative"] == doc["meta"]["k-A"]["hard"]
    assert w["third_bar"] == w["cold_median_evals"] / 3
    assert w["third_applies"] == (w["evidence_rank_whole"] <= w["third_bar"])
    # how far the warm runs trusted each source device, and how much of the search the evidence led
    assert set(w["source_trust"]) == {"k-B", "k-C"} and 0.0 <= w["evidence_say"] <= 1.0
    assert all(0.0 <= t["weight"] <= 1.0 and -1.0 <= t["agreement"] <= 1.0 for t in w["source_trust"].values())
    assert 1 <= w["evidence_led_evals"] <= 10
    printed = capsys.readouterr().out
    assert w["paired_difference"]["median"] == float(np.median(np.subtract(w["warm"], w["cold"])))
    assert "k-A" in printed and "warm/cold" in printed and "warm-cold per seed" in printed
    assert "informative spaces (not flat): " in printed and "at most the evidence-led evaluations on " in printed
    assert "b=5 " not in printed  # the race's tables are not printed
    # a target that is not among the recordings is refused
    assert mod.main(["--data", str(tmp_path), "--warm-only", "--warm-targets", "k-Z", "--jobs", "1"]) == 2


def test_the_warm_over_cold_interval_is_as_wide_as_the_seeds_make_it():
    mod = _bench()
    assert mod.median_ratio_interval([5.0] * 30, [50.0] * 30) == [0.1, 0.1]  # no spread, no doubt
    # a needle: cold seeds find it anywhere from 2 to 600 evaluations
    cold = [2, 43, 65, 72, 73, 115, 120, 124, 127, 135, 156, 166, 172, 179, 189, 206, 224, 253, 273, 277, 479, 481,
            508, 589, 595, 601, 601, 601, 601, 601]
    warm = [n + 100 for n in cold]
    lo, hi = mod.median_ratio_interval(warm, cold)
    ratio = (197.5 + 100) / 197.5
    assert lo < 1.2 < ratio < 1.8 < hi  # the seeds alone leave a wide interval around it
    assert mod.median_ratio_interval(warm, cold) == [lo, hi]  # seeded: the same every run
    assert all(math.isnan(v) for v in mod.median_ratio_interval([5.0], [50.0]))  # one seed: no interval


def test_warm_minus_cold_per_seed_sees_a_steady_cost_the_ratio_of_medians_loses():
    mod = _bench()
    # the same needle's seeds, the warm start paying 8 evaluations on most of them (capped runs differ by 0)
    cold = [2, 43, 65, 72, 73, 115, 120, 124, 127, 135, 156, 166, 172, 179, 189, 206, 224, 253, 273, 277, 479, 481,
            508, 589, 595, 601, 601, 601, 601, 601]
    warm = [min(c + 8, 601) for c in cold]
    warm[3], warm[10] = 20, 150  # two seeds where it paid off
    lo, hi = mod.median_ratio_interval(warm, cold)
    assert lo < 1.0 < hi  # the ratio of medians cannot tell
    got = mod.paired_difference(warm, cold)
    assert got["median"] == 8.0 and got["interval_90"] == [8.0, 8.0]
    # a mixed, tied sample: the seeded interval is pinned, and it brackets the median
    mixed = mod.paired_difference([c + d for c, d in zip(cold, [0, 1, 2, 3, 5, 8] * 5)], cold)
    assert mixed["median"] == 2.5 and mixed["interval_90"] == [1.5, 3.0]
    one = mod.paired_difference([50.0], [20.0])  # one seed: its difference, and no interval
    assert one["median"] == 30.0 and all(math.isnan(v) for v in one["interval_90"])


def test_kernel_tuner_cache_reads_are_kept_for_the_last_file_only():
    mod = _bench()
    mod._READ_MEMO.clear()
    calls = []

    def read(path, open_cache=True):
        calls.append((path, open_cache))
        return {"file": path}

    memo = mod.memo_last_read(read)
    assert memo("a.json", False) is memo("a.json", False)
    assert calls == [("a.json", False)]
    memo("b.json", False)
    assert list(mod._READ_MEMO) == ["b.json"]  # a's parse is dropped once the race moves on
    memo("a.json", True)  # opened for writing: never memoised
    assert calls[-1] == ("a.json", True) and list(mod._READ_MEMO) == ["b.json"]

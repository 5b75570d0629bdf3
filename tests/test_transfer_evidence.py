"""bench/transfer_evidence.py on two small hand-made recorded spaces whose ranks are known by construction."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from kfactory.targets.replay import load_space

BENCH = Path(__file__).resolve().parents[1] / "bench" / "transfer_evidence.py"
PARAMS = {"block_size_x": [32, 64, 128], "flag": [0, 1]}


def _bench():
    spec = importlib.util.spec_from_file_location("transfer_evidence", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _space(path: Path, times: dict[tuple, float]):
    cache = {",".join(map(str, k)): {"block_size_x": k[0], "flag": k[1], "time": t, "times": [t],
                                       "compile_time": 1.0, "benchmark_time": 1.0} for k, t in times.items()}
    with gzip.open(path, "wt") as f:
        json.dump({"device_name": path.stem, "kernel_name": "k", "problem_size": [1], "tune_params_keys": list(PARAMS),
                   "tune_params": PARAMS, "objective": "time", "cache": cache}, f)
    return load_space(path)


def test_ranks_of_the_targets_best_point_in_a_source_overall_and_in_its_corner(tmp_path):
    # target: (64, 1) is the optimum and the only point within 5%
    target = _space(tmp_path / "k-T.json.gz", {(32, 0): 5.0, (64, 0): 4.0, (128, 0): 6.0,
                                                (32, 1): 3.0, (64, 1): 1.0, (128, 1): 2.0})
    # source: flag 0 is its better corner; inside flag 1, (128, 1) beats (64, 1)
    source = _space(tmp_path / "k-S.json.gz", {(32, 0): 1.0, (64, 0): 1.5, (128, 0): 1.2,
                                                (32, 1): 4.0, (64, 1): 3.0, (128, 1): 2.5})
    c = _bench().compare(target, source, 1.05)
    assert c == {"good": 1, "points": 6, "rank": 5, "rank_in_corner": 2, "corner_size": 3, "corner_rank": 2,
                 "corners": 2, "source_ratio": 3.0}

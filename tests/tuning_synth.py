"""A small recorded tuning space in Kernel Tuner's cache format, written at test time, for tests that must
not depend on the shared recordings (../shared/data/tuning-spaces/ is not on every machine). Two "devices"
share the parameter space and disagree somewhat about what is fast, as real GPUs do; LANDSCAPES adds devices
made to agree or disagree outright, for the warm start's trust in its sources (tests/test_source_trust.py)."""
from __future__ import annotations

import gzip
import itertools
import json
import math
from pathlib import Path

PARAMS = {"block_x": [16, 32, 64, 128, 256], "block_y": [1, 2, 4, 8], "tile": [1, 2, 3, 4], "shmem": [0, 1]}
CONSTRAINT = "block_x * block_y <= 512"


def _time(p: dict, device: int) -> float | str:
    if p["tile"] == 4 and p["shmem"] == 1 and p["block_x"] == 256:
        return "RuntimeFailedConfig"
    if p["tile"] == 3 and p["block_y"] == 8 and p["block_x"] >= 64:
        return "CompilationFailedConfig"
    best_x = 64 if device == 0 else 128  # the devices' optima are near each other, not the same
    return (1.0 + 0.3 * abs(math.log2(p["block_x"] / best_x)) + 0.2 * abs(p["block_y"] - 4) / 4
            + 0.15 * abs(p["tile"] - 2) + (0.0 if p["shmem"] else 0.25) + 0.01 * device)


def bowl(p: dict) -> float:
    """A device whose one best point (64, 4, 2, shared memory) is the only one within 5% of its optimum."""
    return (1.0 + 0.3 * abs(math.log2(p["block_x"] / 64)) + 0.2 * abs(p["block_y"] - 4) / 4
            + 0.15 * abs(p["tile"] - 2) + (0.0 if p["shmem"] else 0.25))


def agreeing(p: dict) -> float:
    """Another device that ranks the space as `bowl` does (slower, and more so where bowl is slow)."""
    return 2.5 * bowl(p) ** 1.2


def upside_down(p: dict) -> float:
    """A device whose fast points are `bowl`'s slow ones: its evidence points away from bowl's optimum."""
    return 4.0 - bowl(p)


#: hand-made devices by name, for write_spaces(landscapes=...)
LANDSCAPES = {"bowl": bowl, "agreeing": agreeing, "upside_down": upside_down}


def write_spaces(directory: Path, kernel: str = "synthetic_conv", devices=("GPU0", "GPU1"),
                 landscapes: dict | None = None) -> list[Path]:
    """<kernel>-<device>.json.gz cache files plus the T1 file <kernel>.json with the constraint. `landscapes`:
    device -> time of a parameter dict (no failures), instead of the two devices that disagree somewhat."""
    directory.mkdir(parents=True, exist_ok=True)
    t1 = {"General": {"BenchmarkName": kernel}, "ConfigurationSpace": {
        "TuningParameters": [{"Name": k, "Type": "int", "Values": json.dumps(v)} for k, v in PARAMS.items()],
        "Conditions": [{"Expression": CONSTRAINT, "Parameters": ["block_x", "block_y"]}]}}
    (directory / f"{kernel}.json").write_text(json.dumps(t1))
    paths = []
    for d, device in enumerate(devices):
        cache = {}
        for values in itertools.product(*PARAMS.values()):
            p = dict(zip(PARAMS, values))
            if p["block_x"] * p["block_y"] > 512:
                continue
            t = landscapes[device](p) if landscapes else _time(p, d)
            cache[",".join(map(str, values))] = {**p, "time": t, "times": [t] * 3 if isinstance(t, float) else [],
                                                 "compile_time": 800.0, "benchmark_time": 50.0}
        path = directory / f"{kernel}-{device}.json.gz"
        with gzip.open(path, "wt") as f:
            json.dump({"device_name": device, "kernel_name": kernel, "problem_size": [1024],
                       "tune_params_keys": list(PARAMS), "tune_params": PARAMS, "objective": "time",
                       "cache": cache}, f)
        paths.append(path)
    return paths

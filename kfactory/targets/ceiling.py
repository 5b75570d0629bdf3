"""Measured ceilings of a cpu host (memory bandwidth), measured once per device and cached on disk."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from kfactory.log import get_logger
from kfactory.runner import Runner, RunnerFault, ShmBuffers

log = get_logger("ceiling")
PROBE = Path(__file__).with_name("cpu_stream.c")
ELEMENTS = 1 << 25  # 128 MB per array: far beyond any last-level cache


def cached_bandwidth(cache: Path, device_id: str) -> float | None:
    try:
        return float(json.loads(cache.read_text())[device_id]["mem_bandwidth_gbps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def measure_bandwidth(target, threads: int) -> float:
    """Read+write bandwidth in GB/s (median of interleaved-free samples) of a simple OpenMP copy-scale loop."""
    res = target.compile(PROBE.read_text(), "c", "-O3 -fopenmp", "kernel")
    if not res.ok:
        raise RuntimeError(f"bandwidth probe failed to compile: {res.log[-500:]}")
    so = target.cache_dir / "cpu_stream.so"
    so.write_bytes(res.artifact)
    runner = Runner(threads, timeout_s=60)
    try:
        with ShmBuffers() as bufs:
            x_path, x_off, x = bufs.new((ELEMENTS,), "float32")
            y_path, y_off, _ = bufs.new((ELEMENTS,), "float32")
            x[:] = 1.0
            runner.request({"op": "load", "key": "stream", "kind": "so", "path": str(so), "entry": "kernel",
                            "argtypes": ["ptr", "ptr", "i64"]})
            args = [{"name": "x", "path": x_path, "offset": x_off, "dtype": "float32", "shape": [ELEMENTS]},
                    {"name": "y", "path": y_path, "offset": y_off, "dtype": "float32", "shape": [ELEMENTS]},
                    {"name": "n", "int": ELEMENTS}]
            reply = runner.request({"op": "bench", "kernels": [{"key": "stream", "argsets": [args]}],
                                    "min_samples": 10, "min_s": 0.3, "max_s": 1.0, "noise": 0.02,
                                    "warmup_s": 0.05}, timeout_s=60)
    finally:
        runner.stop()
    med = float(np.median(reply["samples"]["stream"]))
    return 2 * 4 * ELEMENTS / med / 1e9


def bandwidth(target, device_id: str, threads: int) -> float:
    """The host's measured bandwidth (GB/s), from the cache or measured now; 0.0 if it cannot be measured."""
    cache = Path(target.settings.data_dir) / "ceilings.json"
    found = cached_bandwidth(cache, device_id)
    if found is not None:
        return found
    try:
        # the best of one thread and all: on some hosts (shared cores, VMs) one thread streams faster
        gbps = max(measure_bandwidth(target, t) for t in sorted({1, threads}))
    except (RunnerFault, RuntimeError, OSError) as e:
        log.warning("could not measure memory bandwidth; roofline fractions will be 0", error=str(e))
        return 0.0
    try:
        data = json.loads(cache.read_text()) if cache.exists() else {}
    except ValueError:
        data = {}
    data[device_id] = {"mem_bandwidth_gbps": gbps, "threads": threads, "measured_at": time.time()}
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.rename(cache)
    log.info("measured memory bandwidth", gbps=round(gbps, 1), device=device_id)
    return gbps

"""The one shape every baseline's result has, and the roofline fractions computed from it.

    {"name", "available": bool, "status": "ok" | "not_importable" | "failed", "reason", "threads",
     "decode_tokens_per_s": {"128": x, "1024": y}, "prefill_tokens_per_s": z, "peak_rss_mb": r,
     "weights_format": "f32" | "q4_1" | "float64", "roofline_fraction": {"128": f, "1024": g, "prefill_512": h},
     ...details: "load_peak_rss_mb", "peak_rss_scope", "formats", "config", "decode_steps", "prefill_tokens",
     "seconds"}

peak_rss_mb is the peak while measuring ("peak_rss_scope": "run"), the weights already resident; the peak of
loading them is load_peak_rss_mb (where the peak cannot be reset, both are the process's: scope "process").

A baseline that cannot run is a result too (available False, a status and a reason), never an exception, so a
bench prints every engine it was asked for.
"""
from __future__ import annotations

import ctypes
import gc
import resource
import sys
from pathlib import Path

from kfactory.engines.baselines.roofline import Cost, Formats, decode_cost, prefill_cost, token_roofline
from kfactory.models.gguf_model import LlamaConfig

OK, NOT_IMPORTABLE, FAILED = "ok", "not_importable", "failed"
#: the keys every result has, whatever its status
KEYS = ("name", "available", "status", "reason", "threads", "decode_tokens_per_s", "prefill_tokens_per_s",
        "peak_rss_mb", "weights_format", "roofline_fraction")


class NotImportable(Exception):
    """A baseline's library is not importable by this interpreter (the message says which and how to get it)."""


def empty(name: str, threads: int, status: str, reason: str) -> dict:
    """A result with no measurements: a baseline that could not run, and why."""
    return {"name": name, "available": False, "status": status, "reason": reason, "threads": threads,
            "decode_tokens_per_s": {}, "prefill_tokens_per_s": None, "peak_rss_mb": None,
            "weights_format": None, "roofline_fraction": {}}


def peak_rss_mb() -> float:
    """This process's peak resident set in MB since it started or since `reset_peak_rss`: VmHWM where /proc has
    it, else ru_maxrss (kilobytes on Linux, bytes on macOS; never reset)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def release_freed_memory() -> None:
    """Hand memory freed while loading back to the system (gc, then glibc's malloc_trim), so that heap our
    loader's transient arrays left behind is not counted as the engine's resident set. No-op elsewhere."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> bool:
    """Restart the peak-RSS count from the current RSS (Linux: "5" to /proc/self/clear_refs resets VmHWM), so
    that a baseline's peak is that of running, not of converting its weights on the way in (our loader, not the
    engine, dequantises a tensor at a time). False where it cannot be reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def decode_step_cost(result: dict, context: int, steps: int | None = None) -> Cost:
    """The cost of one of `steps` (default: the result's timed decode steps) single steps after `context` tokens:
    they attend to context + 1 .. context + steps positions, costed at their mean."""
    steps = result["decode_steps"] if steps is None else steps
    return decode_cost(LlamaConfig(**result["config"]), Formats(**result["formats"]), context + (steps + 1) / 2)


def add_roofline(result: dict, ceilings: dict[str, float]) -> dict:
    """Fill result["roofline_fraction"] (per decode context and for the prefill) from its measurements and the
    host's ceilings (roofline.token_roofline: the read bandwidth's; result["roofline"]["per_token"] also holds the
    copy bandwidth's); each decode step is costed at the mean number of positions its timed steps attended."""
    if not result.get("available"):
        return result
    config = LlamaConfig(**result["config"])
    formats = Formats(**result["formats"])
    out: dict[str, float | None] = {}
    detail: dict[str, dict] = {}

    def place(key: str, cost: Cost, rate: float | None) -> None:
        detail[key] = token_roofline(cost, ceilings, 1 / rate if rate else None)
        out[key] = detail[key]["fraction"]

    for ctx, rate in result["decode_tokens_per_s"].items():
        place(ctx, decode_step_cost(result, int(ctx)), rate)
    n = result.get("prefill_tokens")
    if n and result.get("prefill_tokens_per_s"):
        place(f"prefill_{n}", prefill_cost(config, formats, n), result["prefill_tokens_per_s"])
    result["roofline_fraction"] = out
    result["roofline"] = {"ceilings": dict(ceilings), "per_token": detail}
    over = sorted(k for k, v in out.items() if v is not None and v > 1)
    if over:
        # faster than the speed of light: a ceiling was measured low (a loaded host, a probe that under-reads),
        # not a fast engine; the bound named in result["roofline"]["per_token"] says which ceiling
        result["roofline"]["warning"] = (f"fraction above 1 at {', '.join(over)}: a host ceiling is below what "
                                         "this engine reached (measured under load, or a probe that under-reads)")
    return result

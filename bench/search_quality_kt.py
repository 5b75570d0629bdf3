"""bench/search_quality.py's Kernel Tuner side: its strategies run in simulation mode on the same recorded spaces
(Kernel Tuner is a bench-only dependency: `pip install kernel_tuner`)."""
from __future__ import annotations

import gzip
import json
import math
import random
import shutil
import time
import warnings
from pathlib import Path

import numpy as np


# ----------------------------------------------------------------------------------------------- Kernel Tuner side
def kt_available() -> str | None:
    try:
        import kernel_tuner  # noqa: F401
        return None
    except ImportError as e:
        return f"{type(e).__name__}: {e}"


_READ_MEMO: dict = {}


def memo_last_read(read):
    """`read` (Kernel Tuner's read_cache) with each parsed file kept until another file is read: the race goes
    space by space, and each worker process holds its own memo, which nothing else clears. Reads that open the
    cache for writing are passed through."""
    def read_cache(cachefile, open_cache=True):
        if open_cache:
            return read(cachefile, open_cache)
        if cachefile not in _READ_MEMO:
            _READ_MEMO.clear()
            _READ_MEMO[cachefile] = read(cachefile, open_cache)
        return _READ_MEMO[cachefile]
    return read_cache


def _memoize_kt_cache_reads() -> None:
    """Kernel Tuner re-reads (and re-parses) the whole cache file on every tune_kernel call; in simulation mode
    it only reads it (the runner copies each record it serves), so parse each file once (memo_last_read)."""
    import kernel_tuner.util as ktu
    if getattr(ktu, "_kf_memo", False):
        return
    ktu.read_cache = memo_last_read(ktu.read_cache)
    ktu._kf_memo = True


def prepare_kt(rs, gz: Path, tmp: Path) -> dict:
    """A plain-JSON copy of the cache (Kernel Tuner opens it as text) and the tune_kernel arguments."""
    out = tmp / (rs.name + ".json")
    if not out.exists():
        with gzip.open(gz, "rb") as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
    with open(out) as f:
        head = json.load(f)
    return dict(kernel_name=head["kernel_name"], kernel_source="", problem_size=head["problem_size"],
                arguments=[], tune_params={k: list(v) for k, v in rs.params.items()},
                restrictions=list(rs.constraints) or None, cache=str(out), simulation_mode=True, quiet=True)


def run_kt(strategy: str, args: dict, opt: float, seed: int, budget: int) -> tuple[float, int]:
    """(best/opt, distinct configurations evaluated) of one seeded Kernel Tuner run."""
    import kernel_tuner
    random.seed(seed)
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _env = kernel_tuner.tune_kernel(**args, strategy=strategy, strategy_options={"max_fevals": budget},
                                                 seed=seed)
    keys = list(args["tune_params"])
    seen, best = set(), math.inf
    for r in results:
        seen.add(tuple(r.get(k) for k in keys))
        t = r.get("time")
        if "__error__" not in r and isinstance(t, (int, float)) and math.isfinite(t):
            best = min(best, t)
    return best / opt, len(seen)


def _kt_seed(job: tuple) -> tuple[float, int, float] | str:
    """One seeded Kernel Tuner run: (best/opt, distinct configurations, seconds), or why it failed."""
    strat, kt_args, opt, seed, b = job
    t0 = time.time()
    try:
        r, n = run_kt(strat, kt_args, opt, seed, b)
    except Exception as e:  # noqa: BLE001 - one strategy failing must not stop the race
        return f"{type(e).__name__}: {e}"
    return r, n, time.time() - t0

"""The judge's own device kernels (kfactory/targets/cuda/judge/): kf_draw fills a verification input in place from
its recorded seed (the counter-based generator; kfactory.judge.counter_rng is its host twin), kf_compare reduces an
output against its float64 reference to one partial kf_stats a block, which `merge` folds into the figures
kfactory.judge.numerics builds a Check from, kf_count_diff counts the bytes in which two buffers differ (what a
kernel wrote into an input) and kf_count_unequal the elements in which two outputs differ in value. Their
source is one NVRTC unit (the headers inlined: NVRTC has no include path of ours), built with --fmad=false so that
the device rounds as the twin does.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

HERE = Path(__file__).with_name("judge")
#: NVRTC options the judge's kernels need besides the target's defaults (no fused multiply-add: kf_draw.h)
FLAGS = "--fmad=false"
#: the kernels' entry points, and kf_compare's threads a block (kf_judge.cu KF_COMPARE_THREADS)
DRAW, COMPARE, COUNT_DIFF, COUNT_UNEQUAL = "kf_draw", "kf_compare", "kf_count_diff", "kf_count_unequal"
COMPARE_THREADS = 256
#: kf_stats, field for field (kf_compare.h)
STATS = np.dtype([(n, "<f8") for n in ("diff_sq", "ref_sq", "max_abs", "max_rel", "worst_excess")]
                 + [(n, "<i8") for n in ("worst", "finite", "pattern_bad", "out_bad", "out_bad_first")])


def source() -> str:
    """kf_judge.cu with its two headers inlined, for NVRTC (or the host C compiler: the same text)."""
    text = (HERE / "kf_judge.cu").read_text()
    for name in ("kf_draw.h", "kf_compare.h"):
        text = text.replace(f'#include "{name}"', (HERE / name).read_text())
    if re.search(r'#include\s+"', text):
        raise RuntimeError("kf_judge.cu includes a header source() does not inline")
    return text


def merge(partials: np.ndarray) -> dict[str, float | int]:
    """One kf_stats from kf_compare's partials (a STATS array, one per block), merged as kf_stats_merge does:
    sums added, maxima kept, the largest excess's lowest index, the lowest first non-finite output."""
    p = np.asarray(partials, dtype=STATS)
    if p.size == 0:
        raise ValueError("no partials: kf_compare ran on no block")
    best = float(p["worst_excess"].max())
    at = p["worst_excess"] == best
    bad = p["out_bad"] > 0
    return {"diff_sq": float(p["diff_sq"].sum()), "ref_sq": float(p["ref_sq"].sum()),
            "max_abs": float(p["max_abs"].max()), "max_rel": float(p["max_rel"].max()), "worst_excess": best,
            "worst": int(p["worst"][at].min()), "finite": int(p["finite"].sum()),
            "pattern_bad": int(p["pattern_bad"].sum()), "out_bad": int(p["out_bad"].sum()),
            "out_bad_first": int(p["out_bad_first"][bad].min()) if bad.any() else -1}

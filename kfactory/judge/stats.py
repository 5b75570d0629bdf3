"""Timing statistics: median, quartiles, noise and a bootstrap confidence interval of the median."""
from __future__ import annotations

import numpy as np

from kfactory.v1 import events_pb2 as pb


def summarize(samples: list[float], shape: str, nbytes: float = 0.0, ceiling_gbps: float = 0.0,
              boot: int = 1000, seed: int = 0) -> pb.ShapeTiming:
    """Summarise timing samples (seconds) of one kernel at one shape."""
    a = np.asarray(samples, dtype=np.float64)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(a, size=(boot, a.size), replace=True), axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    gbps = nbytes / med / 1e9 if med > 0 and nbytes else 0.0
    return pb.ShapeTiming(shape=shape, median_s=med, q1_s=q1, q3_s=q3, samples=int(a.size),
                          noise=float((q3 - q1) / med) if med > 0 else 0.0, ci_low_s=lo, ci_high_s=hi,
                          gbps=gbps, sol_fraction=gbps / ceiling_gbps if ceiling_gbps else 0.0)


def significant(a: pb.ShapeTiming, b: pb.ShapeTiming) -> bool:
    """True when the two medians' confidence intervals do not overlap: a difference outside the noise."""
    return a.ci_high_s < b.ci_low_s or b.ci_high_s < a.ci_low_s

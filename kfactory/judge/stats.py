"""Timing statistics: median, quartiles, noise and a distribution-free confidence interval of the median."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.stats import binom

from kfactory.v1 import events_pb2 as pb

#: the median's interval covers the true median with at least this probability (where the samples allow it)
CONFIDENCE = 0.95


@lru_cache(maxsize=4096)
def median_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the sorted samples that bound the median's interval: the order-statistic interval,
    which covers the true median with probability 1 - 2 P(B < lo + 1) for B ~ Binomial(n, 1/2) whatever the
    timings' distribution, chosen as the narrowest symmetric pair that reaches `confidence`. Under six samples
    no pair can, and the interval is the whole range (coverage 1 - 2^(1-n))."""
    tail = (1.0 - confidence) / 2
    below = int(binom.ppf(tail, n, 0.5))  # the smallest b with P(B <= b) >= tail
    if binom.cdf(below, n, 0.5) > tail:
        below -= 1  # the largest b with P(B <= b) <= tail: the interval [x(b+1), x(n-b)] in 1-based ranks
    lo = max(below, 0)
    return lo, n - 1 - lo


def summarize(samples: list[float], shape: str, nbytes: float = 0.0, ceiling_gbps: float = 0.0) -> pb.ShapeTiming:
    """Summarise timing samples (seconds) of one kernel at one shape. The median's interval is the order-statistic
    one (median_ranks): exact for any distribution and a sort's cost, where a bootstrap of thousands of samples
    cost a third of a second on the device's time."""
    a = np.sort(np.asarray(samples, dtype=np.float64))
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    lo_rank, hi_rank = median_ranks(int(a.size))
    lo, hi = float(a[lo_rank]), float(a[hi_rank])
    gbps = nbytes / med / 1e9 if med > 0 and nbytes else 0.0
    return pb.ShapeTiming(shape=shape, median_s=med, q1_s=q1, q3_s=q3, samples=int(a.size),
                          noise=float((q3 - q1) / med) if med > 0 else 0.0, ci_low_s=lo, ci_high_s=hi,
                          gbps=gbps, sol_fraction=gbps / ceiling_gbps if ceiling_gbps else 0.0)


def significant(a: pb.ShapeTiming, b: pb.ShapeTiming) -> bool:
    """True when the two medians' confidence intervals do not overlap: a difference outside the noise."""
    return a.ci_high_s < b.ci_low_s or b.ci_high_s < a.ci_low_s

"""Timing statistics: median, quartiles, noise and a distribution-free confidence interval of the median."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from kfactory.v1 import events_pb2 as pb

#: the median's interval covers the true median with at least this probability (where the samples allow it)
CONFIDENCE = 0.95


@lru_cache(maxsize=4096)
def median_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int]:
    """0-based ranks (lo, hi) of the sorted samples that bound the median's interval: the order-statistic interval,
    which covers the true median with probability 1 - 2 P(B < lo + 1) for B ~ Binomial(n, 1/2) whatever the
    timings' distribution, chosen as the narrowest symmetric pair that reaches `confidence`. Under six samples
    no pair can, and the interval is the whole range (coverage 1 - 2^(1-n))."""
    from scipy.stats import binom   # here, not at the top: scipy.stats costs 0.8 s of every importer's start

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


def combine(timings: list[pb.ShapeTiming], nbytes: float = 0.0, ceiling_gbps: float = 0.0) -> pb.ShapeTiming:
    """One kernel's timings at one shape taken in turn with other kernels (kfactory.judge.rotated) as one: the
    median, quartiles and interval bounds are the geometric means of theirs (a ratio between two kernels is then
    the mean of the timings' log ratios, in which a bias of one timing's buffers cancels), the samples their sum.
    The interval is about as wide as one of the timings', not narrowed by their number: the timings differ by more
    than their own intervals say (their buffers do), so treating them as independent draws would overstate what
    is known. Where a timing had under six samples (a slow kernel's share of the time), its interval is no more
    than its samples' range, down to nothing for one sample: then the interval spans every timing's instead. The
    mode names every way they were timed ("events+graph" where they differ); the telemetry is a throttled one's
    where any was."""
    def gmean(field: str) -> float:
        return float(np.exp(np.mean([np.log(getattr(t, field)) for t in timings])))
    med = gmean("median_s")
    gbps = nbytes / med / 1e9 if med > 0 and nbytes else 0.0
    if min(t.samples for t in timings) < 6:
        lo, hi = min(t.ci_low_s for t in timings), max(t.ci_high_s for t in timings)
    else:
        lo, hi = gmean("ci_low_s"), gmean("ci_high_s")
    out = pb.ShapeTiming(shape=timings[0].shape, median_s=med, q1_s=gmean("q1_s"), q3_s=gmean("q3_s"),
                         samples=sum(t.samples for t in timings), ci_low_s=lo, ci_high_s=hi, gbps=gbps,
                         sol_fraction=gbps / ceiling_gbps if ceiling_gbps else 0.0,
                         output_checked=all(t.output_checked for t in timings),
                         mode="+".join(sorted({t.mode for t in timings if t.mode})))
    out.noise = (out.q3_s - out.q1_s) / med if med > 0 else 0.0
    told = [t for t in timings if t.HasField("telemetry")]
    if told:
        out.telemetry.CopyFrom(next((t for t in told if t.telemetry.throttled), told[-1]).telemetry)
    return out


def latin_square_halfwidth(logs: np.ndarray, places: np.ndarray | None = None,
                           confidence: float = CONFIDENCE) -> float | None:
    """For a rotated timing of K kernels in R runs (kfactory.judge.rotated): logs[k, j] is kernel k's log median in
    run j, where it was in place places[k, j] (its buffers laid out that far down; default (k - j) mod K, the
    cyclic square of R = K runs). The runs are Latin squares (every kernel once in each run and in each place once
    per square), so kernels, runs (the host's drift between them) and places (the buffers' bias) are balanced:
    each kernel's mean log is its least-squares effect, and what the three leave over estimates the noise with
    (K-1)(R-2) degrees of freedom. The half-width (in logs) of per-kernel intervals of which two leave each other
    out just when the kernels differ at `confidence` (Student's t on the pair's difference, whose standard error
    is s sqrt(2/R)); None under three kernels (no degrees of freedom left) or for runs that are not whole squares."""
    from scipy.stats import t as student_t   # here: see median_ranks

    k, r = logs.shape
    if places is None:
        places = (np.arange(k)[:, None] - np.arange(r)[None, :]) % k
    if k < 3 or r < k or r % k:
        return None
    place_means = np.array([logs[places == p].mean() for p in range(k)])
    resid = (logs - logs.mean(axis=1, keepdims=True) - logs.mean(axis=0, keepdims=True) - place_means[places]
             + 2 * logs.mean())
    dof = (k - 1) * (r - 2)
    s = float(np.sqrt((resid ** 2).sum() / dof))
    return float(student_t.ppf(0.5 + confidence / 2, dof) * s / np.sqrt(2 * r))


def significant(a: pb.ShapeTiming, b: pb.ShapeTiming) -> bool:
    """True when the two medians' confidence intervals do not overlap: a difference outside the noise."""
    return a.ci_high_s < b.ci_low_s or b.ci_high_s < a.ci_low_s

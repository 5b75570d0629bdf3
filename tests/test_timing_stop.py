"""When a timing ends (kfactory.sandbox.child.sample_interleaved, settled) and the interval its summary gives the
median (kfactory.judge.stats): a timing whose calls vary more than the noise bound ends once its median is precise,
not at its time limit; the stop is asked on a schedule, not after every call; the interval is the order-statistic
one with its coverage."""
from __future__ import annotations

from collections import Counter

import time

import numpy as np
import pytest
from scipy.stats import binom

from kfactory.judge.stats import median_ranks, summarize
from kfactory.sandbox import child
from kfactory.sandbox.protocol import Bench


def _noisy(rng: np.random.Generator, spread: float, call_s: float = 20e-6):
    """A sampler that takes call_s of wall time per call and reports times spread +-spread around 30 us."""
    def sample(i: int) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < call_s:
            pass
        return 30e-6 * (1 + spread * (rng.random() - 0.5))
    return sample


def _bench(precision: float, min_s: float = 0.05, max_s: float = 0.6) -> Bench:
    return Bench([], min_samples=10, min_s=min_s, max_s=max_s, noise=0.03, warmup_s=0.0, precision=precision)


def test_a_noisy_timing_ends_once_its_median_is_precise():
    """Calls that vary by 20% never get under a 3% noise bound: by noise alone the timing runs to max_s; with a 1%
    precision it ends soon after min_s, its median within 1% (95%)."""
    t0 = time.perf_counter()
    samples, rounds = child.sample_interleaved({"a": _noisy(np.random.default_rng(1), 0.2)}, _bench(0.0))
    by_noise = time.perf_counter() - t0
    t0 = time.perf_counter()
    precise, _ = child.sample_interleaved({"a": _noisy(np.random.default_rng(1), 0.2)}, _bench(0.01, max_s=10.0))
    by_precision = time.perf_counter() - t0
    assert by_noise >= 0.6 and by_precision < 5.0   # at min_s and a few hundred calls more, not at its limit
    t = summarize(precise["a"], "x")
    assert (t.ci_high_s - t.ci_low_s) / 2 <= 0.01 * t.median_s
    assert child.settled(precise["a"], 0.03, 0.01) and not child.settled(precise["a"], 0.03, 0.0)


def test_a_quiet_timing_ends_by_its_noise_and_every_kernel_must_settle():
    quiet = [30e-6] * 50
    assert child.settled(quiet, 0.03)
    noisy = list(30e-6 * (1 + 0.5 * np.random.default_rng(2).random(12)))
    assert not child.settled(noisy, 0.03, 0.01)  # 12 calls cannot place a 50%-spread median within 1%
    assert not child.settled(quiet[:3], 1.0, 1.0)  # under four calls nothing is settled
    samples, _ = child.sample_interleaved({"quiet": lambda i: 30e-6, "noisy": _noisy(np.random.default_rng(3), 0.2)},
                                          _bench(0.0, min_s=0.0, max_s=0.2))
    assert len(samples["quiet"]) == len(samples["noisy"]) > 10  # the noisy one held both to the time limit


def test_settled_is_asked_on_a_schedule(monkeypatch):
    """Asked after every call, settled() (a percentile of every sample) cost more than a short kernel's call once
    thousands were in; it is asked again only after a sixteenth more rounds."""
    asked: list[int] = []
    real = child.settled

    def counting(s, noise, precision=0.0):
        asked.append(len(s))
        return real(s, noise, precision)

    monkeypatch.setattr(child, "settled", counting)
    samples, rounds = child.sample_interleaved({"a": lambda i: 30e-6 * (1 + (i % 7) / 10)},
                                               Bench([], min_samples=10, min_s=0.0, max_s=0.3, noise=0.01,
                                                     warmup_s=0.0))
    assert rounds > 10_000 and len(asked) < 200
    assert all(b >= a + max(1, a // 16) for a, b in zip(asked, asked[1:]))


@pytest.mark.parametrize("n", [6, 7, 10, 33, 100, 501, 4096])
def test_the_median_interval_is_the_narrowest_with_95_percent_coverage(n):
    lo, hi = median_ranks(n)
    assert hi == n - 1 - lo
    coverage = 1 - 2 * binom.cdf(lo, n, 0.5)     # P(x[lo] <= median <= x[hi]), 0-based ranks
    assert coverage >= 0.95
    assert 1 - 2 * binom.cdf(lo + 1, n, 0.5) < 0.95  # one rank narrower falls short


def test_under_six_samples_the_interval_is_the_range_and_summarize_reads_the_ranks():
    assert median_ranks(5) == (0, 4) and median_ranks(1) == (0, 0)
    samples = list(np.random.default_rng(4).permutation(np.arange(1.0, 101.0)))
    t = summarize(samples, "x")
    lo, hi = median_ranks(100)
    assert (t.ci_low_s, t.median_s, t.ci_high_s) == (lo + 1.0, 50.5, hi + 1.0) and t.samples == 100
    # the child's stop never calls a median precise on a narrower interval than the summary then reports
    assert all(child.median_rank_lo(n) <= median_ranks(n)[0] for n in range(4, 20_000, 7))


def test_every_kernel_is_called_in_every_place_of_a_round_and_after_every_other_equally_often():
    """Rounds take the Williams orders in turn (A B C, B C A, C A B, C B A, A C B, B A C): over any 3k rounds each
    kernel was first, second and third k times each, over any 6k rounds right after each other kernel 2k times
    within a round, and round i still times argument set i for every kernel."""
    calls: list[tuple[str, int]] = []

    def sampler(key: str):
        def sample(i: int) -> float:
            calls.append((key, i))
            return 1e-6
        return sample
    samples, rounds = child.sample_interleaved({k: sampler(k) for k in "abc"},
                                               Bench([], min_samples=30, min_s=0.0, max_s=5.0, noise=1.0,
                                                     warmup_s=0.0))
    assert rounds >= 30 and all(len(s) == rounds for s in samples.values())
    per_round = [calls[3 * r: 3 * r + 3] for r in range(rounds)]
    assert all({i for _, i in r} == {n} for n, r in enumerate(per_round))   # one round, one set index
    full = rounds - rounds % 3
    for place in range(3):
        firsts = [r[place][0] for r in per_round[:full]]
        assert {k: firsts.count(k) for k in "abc"} == {k: full // 3 for k in "abc"}
    assert [k for k, _ in per_round[1]] == ["b", "c", "a"]
    assert [k for k, _ in per_round[3]] == ["c", "b", "a"]
    cycles = rounds - rounds % 6
    after = Counter((r[j][0], r[j + 1][0]) for r in per_round[:cycles] for j in range(2))
    assert len(after) == 6 and set(after.values()) == {cycles // 3}

"""The one-pass comparison (kfactory/judge/numerics_fast.c) gives the numpy path's verdict and figures on every kind of
output the judge meets: right, off by a little, off in one element, a norm over its bound, NaN used as a
wildcard, a poison left, Inf patterns that match and that do not."""
from __future__ import annotations

import numpy as np
import pytest

from kfactory.judge import numerics as cmp
from kfactory.platform import hostthreads

ATOL, RTOL, NORM = 1e-7, 1e-4, 1e-5


def _cases(dtype):
    rng = np.random.default_rng(7)
    ref = rng.standard_normal(50_000)
    good = ref.astype(dtype)
    one_off = good.copy()
    one_off[31_337] += 1e-2
    noisy = (ref * (1 + 3e-5 * rng.standard_normal(ref.size))).astype(dtype)  # elementwise ok, norm over 1e-5
    poisoned = good.copy()
    poisoned[49_999] = np.nan
    masked = ref.copy()
    masked[::97] = -np.inf
    masked[5] = np.nan
    out_masked = masked.astype(dtype)
    wrong_mask = out_masked.copy()
    wrong_mask[97] = 0.0
    nan_wild = out_masked.copy()
    nan_wild[194] = np.nan  # NaN where the reference has -inf
    return {"good": (good, ref), "one_off": (one_off, ref), "noisy": (noisy, ref), "poisoned": (poisoned, ref),
            "masked": (out_masked, masked), "wrong_mask": (wrong_mask, masked), "nan_wild": (nan_wild, masked),
            "empty": (np.empty(0, dtype), np.empty(0))}


@pytest.mark.parametrize("chunk", [cmp.PARALLEL_CHUNK, 4096])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_pass_and_numpy_agree(dtype, chunk, monkeypatch):
    """Also in parts (chunk 4096: a case's 50,000 elements in 13 parts compared at once, each of the one-off
    element, the poison and the wrong masks in a later part than the first)."""
    monkeypatch.setattr(cmp, "PARALLEL_CHUNK", chunk)
    assert cmp._library() is not None, "the helper did not build: every comparison would take the numpy path"
    seen = set()
    for name, (out, ref) in _cases(dtype).items():
        fast = cmp.compare(out, ref, ATOL, RTOL, NORM)
        slow = cmp.compare(out, ref, ATOL, RTOL, NORM, one_pass=False)
        assert (fast.passed, fast.note, fast.worst_index) == (slow.passed, slow.note, slow.worst_index), name
        for f in ("max_abs_err", "max_rel_err", "norm_rel_err"):
            assert getattr(fast, f) == pytest.approx(getattr(slow, f), rel=1e-9), (name, f)
        seen.add((name, fast.passed))
    assert {n for n, passed in seen if passed} == {"good", "masked", "empty"}


def test_other_layouts_take_the_numpy_path():
    ref = np.linspace(-1, 1, 64)
    assert cmp._fast(ref.astype(np.float16), ref) is None  # narrower dtypes are upcast chunk by chunk there
    assert cmp._fast(ref[::2].astype(np.float32), ref[::2]) is None  # not contiguous
    assert cmp._fast(ref.astype(np.float32), ref) is not None


def test_a_comparison_in_parts_gives_the_same_figures_on_any_number_of_threads(monkeypatch):
    """The parts are merged in order: one thread or four, the figures are the same to the bit."""
    monkeypatch.setattr(cmp, "PARALLEL_CHUNK", 1000)
    figures = []
    try:
        for threads in (1, 4):
            monkeypatch.setattr(hostthreads, "threads", lambda n=threads: n)
            hostthreads.pool.cache_clear()
            for name, (out, ref) in _cases(np.float32).items():
                c = cmp.compare(out, ref, ATOL, RTOL, NORM)
                figures.append((threads, name, c.passed, c.note, c.worst_index, c.max_abs_err, c.max_rel_err,
                                c.norm_rel_err))
    finally:
        hostthreads.pool.cache_clear()
    one = [f[1:] for f in figures if f[0] == 1]
    assert one == [f[1:] for f in figures if f[0] == 4]
    assert ("one_off", False) in {(f[0], f[1]) for f in one} and ("good", True) in {(f[0], f[1]) for f in one}


@pytest.mark.parametrize("chunk", [cmp.PARALLEL_CHUNK, 5000, 4096, 50])
def test_the_worst_element_is_the_first_of_equal_excesses_across_parts(chunk, monkeypatch):
    """Two elements off by the same amount, in different parts (at 4096 and 50) or one: the first is named, as
    one pass and the numpy path name it."""
    monkeypatch.setattr(cmp, "PARALLEL_CHUNK", chunk)
    ref = np.ones(10_000)
    out = ref.astype(np.float32)
    out[[100, 5100]] = 1.5   # the same error to the bit
    fast, slow = cmp.compare(out, ref, ATOL, RTOL, NORM), cmp.compare(out, ref, ATOL, RTOL, NORM, one_pass=False)
    assert not fast.passed and fast.worst_index == slow.worst_index == 100

"""The cuda families of softmax and rmsnorm: every point renders, launch rules evaluate, points compile for sm_90a
without spills (NVRTC + nvJitLink from the wheels, no GPU needed); the rmsnorm reference and its bf16 tolerance;
bf16 through draw and compare."""
from __future__ import annotations

import math
import os
import random
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

from kfactory.judge.numerics import compare
from kfactory.judge.screening import prune
from kfactory.judge.inputs import draw, empty_outputs
from kfactory.platform.expressions import evaluate
from kfactory.problems import load_problem

BF16 = np.dtype(ml_dtypes.bfloat16)
CUDA_FAMILIES = [("softmax", "cuda_cu"), ("softmax", "cuda_ptx"), ("rmsnorm", "cuda_cu")]
#: points compiled on every run (a fixed draw); the slow test below compiles every point. 24, not 40: the 16 more
#: cost 6-8 s of the CI's two cores a family
SAMPLE = 24


def _family(problem: str, family: str):
    return load_problem(problem).families[family]


@pytest.mark.parametrize("problem,family", CUDA_FAMILIES)
def test_every_point_renders_to_a_distinct_kernel(problem, family):
    fam = _family(problem, family)
    assert fam.spec.target == "cuda"
    points = fam.points()
    assert len(points) >= 40
    sources = set()
    for p in points:
        source, flags, _ = fam.render(p)
        assert ".entry kernel(" in source if fam.spec.language == "ptx" else 'extern "C" __global__' in source
        sources.add((source, flags))
    assert len(sources) == len(points)


@pytest.mark.parametrize("problem,family", CUDA_FAMILIES)
def test_launch_rules_cover_every_row(problem, family):
    """grid x rows-per-block covers the rows, the block is a legal size, smem stays under the 48 KiB default."""
    prob = load_problem(problem)
    fam = prob.families[family]
    for p in fam.points():
        for shape in prob.shapes("all") + [dict(zip(prob.spec.symbols, (3, 12000)))]:
            names = {**p, **shape}
            grid, block = evaluate(fam.spec.launch["grid"], names), evaluate(fam.spec.launch["block"], names)
            smem = evaluate(fam.spec.launch.get("smem", "0"), names)
            assert isinstance(grid, int) and isinstance(block, int) and isinstance(smem, int)
            assert 32 <= block <= 1024 and block % 32 == 0 and 0 <= smem <= 32 * 1024
            rows_per_block = block // 32 if p.get("mapping", "warp") == "warp" else 1
            assert grid * rows_per_block >= shape["rows"] > (grid - 1) * rows_per_block
            if p.get("keep") == "smem" and smem:
                assert smem >= 4 * rows_per_block * shape["cols"]


def _compile_points(problem: str, family: str, points: list[dict], arch: str = "sm_90a") -> list[tuple]:
    """(point, message, spilled bytes) of every point that fails to compile or spills. NVRTC releases the GIL,
    so the points compile on every core at once (softmax's 6237 cuda_cu points: about 0.25 s each alone)."""
    cc = pytest.importorskip("kfactory.targets.cuda.compile")
    fam = _family(problem, family)

    def one(p: dict) -> tuple | None:
        source, flags, _ = fam.render(p)
        r = cc.compile_cuda(source, fam.spec.language, flags, fam.spec.entry, arch, None)
        spills = r.report.spill_store_bytes + r.report.spill_load_bytes + r.report.local_bytes
        return (p, r.message, spills, r) if not r.ok or spills else None

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        return [bad for bad in pool.map(one, points) if bad is not None]


@pytest.mark.parametrize("problem,family", CUDA_FAMILIES)
def test_a_sample_of_points_compiles_for_sm90a_without_spills(problem, family):
    pytest.importorskip("cuda.bindings")
    points = _family(problem, family).points()
    sample = random.Random(20).sample(points, min(SAMPLE, len(points)))
    assert [b[:3] for b in _compile_points(problem, family, sample)] == []


@pytest.mark.slow
@pytest.mark.timeout(3600)  # softmax cuda_cu: about 13 minutes on 2 cores, 2 on 16
@pytest.mark.parametrize("problem,family", CUDA_FAMILIES)
def test_every_point_compiles_for_sm90a_and_the_rare_spill_is_pruned(problem, family):
    """Every point compiles. A few may still spill where __launch_bounds__(1024) caps a thread at 64 registers
    (softmax cuda_cu: 1 of 6237 points, 4 B stored / 20 B loaded, NVRTC 12 for sm_90a): the compiler service
    prunes those with the reason, so they never reach a GPU, and they stay under 0.1% of the family."""
    pytest.importorskip("cuda.bindings")
    points = _family(problem, family).points()
    bad = _compile_points(problem, family, points)
    assert [b[:2] for b in bad if not b[3].ok] == []
    assert all(prune(b[3].report, None, load_problem(problem)).startswith("spills") for b in bad), bad
    assert len(bad) <= len(points) // 1000, bad


def test_reference_kernels_and_ptx_compile_for_sm100a():
    pytest.importorskip("cuda.bindings")
    cc = pytest.importorskip("kfactory.targets.cuda.compile")
    for name in ("softmax", "rmsnorm"):
        source, flags = load_problem(name).reference_source("cuda")
        for arch in ("sm_90a", "sm_100a"):
            r = cc.compile_cuda(source, "cuda", flags, "kernel", arch, None)
            assert r.ok and r.report.spill_store_bytes == 0, (name, arch, r.message)
    assert [b[:3] for b in _compile_points("softmax", "cuda_ptx", _family("softmax", "cuda_ptx").points()[::7],
                                           "sm_100a")] == []


# ---------------------------------------------------------------------------------------------------------------
# rmsnorm: reference and bf16 tolerance


def _inputs(hidden: int, rows: int, dist: str, seed: int = 0) -> dict:
    prob = load_problem("rmsnorm")
    return draw(prob, {"rows": rows, "hidden": hidden}, dist, seed)


def test_rmsnorm_reference_matches_the_formula():
    prob = load_problem("rmsnorm")
    ins = _inputs(4099, 7, "normal", 3)
    assert ins["x"].dtype == BF16 and ins["w"].dtype == BF16
    y = prob.reference.reference(ins, **prob.params)["y"]
    x, w = ins["x"].astype(np.float64), ins["w"].astype(np.float64)
    direct = np.array([[x[r, h] / math.sqrt(sum(x[r] ** 2) / x.shape[1] + 1e-6) * w[h] for h in range(0, 4099, 97)]
                       for r in range(7)])
    np.testing.assert_allclose(y[:, ::97], direct, rtol=1e-12)
    assert prob.params == {"eps": 1e-6} and "1e-6" in prob.spec.description
    assert prob.reference.baselines(**prob.params) == {}
    assert set(prob.reference.cuda_baselines(**prob.params)) <= {"torch", "quack"}


def _fp32_kernel(x: np.ndarray, w: np.ndarray, threads: int = 256) -> np.ndarray:
    """What an honest kernel computes: fp32 per-thread partial sums of x^2, a tree over the partials, rsqrt,
    x * rstd * w in fp32, one round to bf16."""
    xf, wf = x.astype(np.float32), w.astype(np.float32)
    rows, hidden = xf.shape
    pad = np.zeros((rows, -hidden % threads), np.float32)
    parts = np.concatenate([xf, pad], axis=1).reshape(rows, -1, threads)
    ss = np.zeros((rows, threads), np.float32)
    for k in range(parts.shape[1]):            # each thread walks its columns in order
        ss = ss + parts[:, k] * parts[:, k]
    while ss.shape[1] > 1:                      # tree over the threads
        ss = ss[:, 0::2] + ss[:, 1::2]
    rstd = (np.float32(1) / np.sqrt(ss / np.float32(hidden) + np.float32(1e-6))).astype(np.float32)
    return (xf * rstd * wf).astype(BF16)


def _bf16_accumulating_kernel(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A wrong kernel: the sum of squares runs in bf16 (every partial sum rounded to bf16)."""
    xb = x.astype(np.float32)
    ss = np.zeros(x.shape[0], np.float32)
    for h in range(x.shape[1]):
        ss = (ss + (xb[:, h] * xb[:, h]).astype(BF16).astype(np.float32)).astype(BF16).astype(np.float32)
    rstd = 1 / np.sqrt(ss / x.shape[1] + 1e-6)
    return (xb * rstd[:, None] * w.astype(np.float32)).astype(BF16)


@pytest.mark.parametrize("dist", ["normal", "uniform", "large", "tiny"])
def test_bf16_tolerance_passes_an_fp32_kernel_with_margin(dist):
    prob = load_problem("rmsnorm")
    tol = prob.spec.tolerance["bfloat16"]
    ins = _inputs(8192, 16, dist, 11)
    ref = prob.reference.reference(ins, **prob.params)["y"]
    check = compare(_fp32_kernel(ins["x"], ins["w"]), ref, tol.atol, tol.rtol, tol.norm_rel)
    assert check.passed, check.note
    # bf16 rounding: <= 2^-8 elementwise, ~2^-10 in norm; the tolerance leaves >= 2x on both
    assert check.max_rel_err <= 2.0 ** -8 * 1.01 and check.max_rel_err * 2 < tol.rtol
    assert check.norm_rel_err * 2 < tol.norm_rel


def test_bf16_tolerance_fails_a_bf16_accumulating_kernel():
    prob = load_problem("rmsnorm")
    tol = prob.spec.tolerance["bfloat16"]
    ins = _inputs(8192, 4, "normal", 12)
    ref = prob.reference.reference(ins, **prob.params)["y"]
    check = compare(_bf16_accumulating_kernel(ins["x"], ins["w"]), ref, tol.atol, tol.rtol, tol.norm_rel)
    assert not check.passed and check.norm_rel_err > 10 * tol.norm_rel


def test_bf16_draw_and_compare_round_trip():
    prob = load_problem("rmsnorm")
    shape = {"rows": 3, "hidden": 33}
    a, b = draw(prob, shape, "uniform", 5), draw(prob, shape, "uniform", 5)
    assert a["x"].dtype == BF16 and np.array_equal(a["x"].view(np.uint16), b["x"].view(np.uint16))
    assert a["x"].shape == (3, 33) and a["w"].shape == (33,)
    assert -4 <= float(a["x"].astype(np.float64).min()) and float(a["x"].astype(np.float64).max()) <= 4
    out = empty_outputs(prob, shape)["y"]
    assert out.dtype == BF16
    ref = prob.reference.reference(a, **prob.params)["y"]
    out[...] = ref.astype(BF16)                  # the correctly rounded answer passes
    tol = prob.spec.tolerance["bfloat16"]
    check = compare(out, ref, tol.atol, tol.rtol, tol.norm_rel)
    assert check.passed and 0 < check.max_rel_err <= 2.0 ** -8
    out.view(np.uint16)[1, 7] = 0x7FC0           # a NaN left behind (poison) fails
    check = compare(out, ref, tol.atol, tol.rtol, tol.norm_rel)
    assert not check.passed and "non-finite" in check.note
    out[...] = (ref * 1.02).astype(BF16)         # 2% off fails
    assert not compare(out, ref, tol.atol, tol.rtol, tol.norm_rel).passed


def test_fp32_draw_is_unchanged_by_bf16_support():
    prob = load_problem("softmax")
    x = draw(prob, {"rows": 2, "cols": 5}, "normal", 7)["x"]
    rng = np.random.default_rng(7)
    assert x.dtype == np.float32
    assert np.array_equal(x, (rng.standard_normal((2, 5), dtype=np.float32) * 1.0 + 0.0).astype(np.float32))


# ---------------------------------------------------------------------------------------------------------------
# the kernels' arithmetic, emulated


def test_online_merge_with_the_finite_sentinel_never_makes_nan():
    """softmax kernels start running maxima at -FLT_MAX: merging empty or all -inf partials stays finite."""
    neg_big = np.float32(-3.402823466e38)
    with np.errstate(over="ignore", invalid="raise"):
        def merge(a, b):
            m = np.maximum(a[0], b[0])
            return m, a[1] * np.exp2((a[0] - m) * np.float32(math.log2(math.e))) + \
                b[1] * np.exp2((b[0] - m) * np.float32(math.log2(math.e)))
        empty, masked = (neg_big, np.float32(0)), (neg_big, np.float32(np.exp(np.float32(-np.inf) - neg_big)))
        real = (np.float32(2.5), np.float32(3.0))
        assert merge(empty, masked) == (neg_big, 0)
        m, s = merge(merge(empty, real), masked)
        assert m == np.float32(2.5) and s == np.float32(3.0)

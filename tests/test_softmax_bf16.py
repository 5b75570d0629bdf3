"""softmax_bf16 (cuda only): the package loads and describes itself, every cuda_cu point renders, launch rules
cover every row, a sample of points compiles for sm_90a (and a few for sm_100a) without spills (NVRTC + nvJitLink
from the wheels, no GPU needed), the float64 reference, and the bf16 tolerance against emulated kernels.
Nothing here runs a kernel: the family has not been run on a GPU by these tests."""
from __future__ import annotations

import math
import random

import ml_dtypes
import numpy as np
import pytest

from kfactory.cli.main import main
from kfactory.judge.numerics import compare
from kfactory.judge.inputs import draw
from kfactory.platform.expressions import evaluate
from kfactory.problems import list_problems, load_problem

BF16 = np.dtype(ml_dtypes.bfloat16)
NAME = "softmax_bf16"
#: points compiled on every run (a fixed draw), beside the 16 of the spill frontier (the heaviest register rows,
#: where a spill would be); 24, not 40: the 16 more cost about 20 s of the CI's two cores
SAMPLE = 24


def _prob():
    return load_problem(NAME)


def _fam():
    return _prob().families["cuda_cu"]


def test_the_package_loads_and_describes_itself(capsys):
    assert NAME in list_problems()
    prob = _prob()
    assert prob.spec.symbols == ["rows", "cols"]
    assert [t.dtype for t in prob.spec.inputs] == ["bfloat16"] and prob.spec.outputs[0].dtype == "bfloat16"
    assert set(prob.families) == {"cuda_cu"} and set(prob.spec.tolerance) == {"bfloat16"}
    assert prob.reference.baselines() == {}
    assert set(prob.reference.cuda_baselines()) <= {"torch"}
    assert main(["problems", "describe", NAME]) == 0
    out = capsys.readouterr().out
    assert "unsigned short *x" in out and "4096x4096" in out and "16384x8192" in out and "1x50257" in out


def test_every_point_renders_to_a_distinct_kernel():
    fam = _fam()
    assert fam.spec.target == "cuda" and fam.spec.language == "cuda"
    points = fam.points()
    assert len(points) >= 1000
    sources = set()
    for p in points:
        source, flags, _ = fam.render(p)
        assert 'extern "C" __global__' in source and "cvt.rn.bf16" in source
        sources.add((source, flags))
    assert len(sources) == len(points)


def test_launch_rules_cover_every_row():
    prob = _prob()
    fam = prob.families["cuda_cu"]
    for p in fam.points():
        for shape in prob.shapes("all") + [{"rows": 3, "cols": 12000}, {"rows": 5, "cols": 16383}]:
            names = {**p, **shape}
            grid, block = evaluate(fam.spec.launch["grid"], names), evaluate(fam.spec.launch["block"], names)
            smem = evaluate(fam.spec.launch.get("smem", "0"), names)
            assert isinstance(grid, int) and isinstance(block, int) and isinstance(smem, int)
            assert 32 <= block <= 1024 and block % 32 == 0 and 0 <= smem <= 32 * 1024
            rows_per_block = block // 32 if p["mapping"] == "warp" else 1
            assert grid * rows_per_block >= shape["rows"] > (grid - 1) * rows_per_block
            if p["keep"] == "smem" and smem:
                # the kernel's own test: RPB x (cols rounded up to 8) bf16 <= the dynamic size
                assert smem >= 2 * rows_per_block * ((shape["cols"] + 7) // 8 * 8)


def _compile(points: list[dict], arch: str) -> tuple[list[tuple], int]:
    cc = pytest.importorskip("kfactory.targets.cuda.compile")
    fam = _fam()
    bad, max_regs = [], 0
    for p in points:
        source, flags, _ = fam.render(p)
        r = cc.compile_cuda(source, fam.spec.language, flags, fam.spec.entry, arch, None)
        spills = r.report.spill_store_bytes + r.report.spill_load_bytes + r.report.local_bytes
        if not r.ok or spills:
            bad.append((p, r.message, spills))
        max_regs = max(max_regs, r.report.registers)
    return bad, max_regs


def _sample(n: int, seed: int) -> list[dict]:
    points = _fam().points()
    return random.Random(seed).sample(points, min(n, len(points)))


def test_a_sample_of_points_compiles_for_sm90a_without_spills():
    pytest.importorskip("cuda.bindings")
    bad, max_regs = _compile(_sample(SAMPLE, 20), "sm_90a")
    assert bad == [] and 0 < max_regs <= 255


def test_the_heaviest_register_rows_compile_without_spills():
    """keep == regs at the largest regs x block the constraints allow (the spill frontier: with cache == stream,
    16384 and regs 64 spilled, so stream stops at 8192 and regs 32)."""
    pytest.importorskip("cuda.bindings")
    points = _fam().points()
    assert not any(p["cache"] == "stream" and (p["regs"] * p["block"] > 8192 or p["regs"] > 32) for p in points)
    heavy = [p for p in points if p["regs"] * p["block"] == 16384 or (p["cache"] == "stream" and p["regs"] == 32)]
    assert heavy
    bad, max_regs = _compile(random.Random(3).sample(heavy, min(16, len(heavy))), "sm_90a")
    assert bad == [] and max_regs <= 255


def test_a_few_points_and_the_reference_compile_for_sm100a():
    pytest.importorskip("cuda.bindings")
    cc = pytest.importorskip("kfactory.targets.cuda.compile")
    source, flags = _prob().reference_source("cuda")
    for arch in ("sm_90a", "sm_100a"):
        r = cc.compile_cuda(source, "cuda", flags, "kernel", arch, None)
        assert r.ok and r.report.spill_store_bytes == 0, (arch, r.message)
    bad, _ = _compile(_sample(6, 100), "sm_100a")
    assert bad == []


# ---------------------------------------------------------------------------------------------------------------
# the reference and the bf16 tolerance


def _inputs(rows: int, cols: int, dist: str, seed: int = 0) -> dict:
    return draw(_prob(), {"rows": rows, "cols": cols}, dist, seed)


def test_reference_matches_the_formula():
    prob = _prob()
    ins = _inputs(7, 4099, "masked", 3)
    x = ins["x"]
    assert x.dtype == BF16 and np.isneginf(x.astype(np.float64)).any()
    y = prob.reference.reference(ins)["y"]
    assert y.dtype == np.float64 and y.shape == (7, 4099)
    xd = x.astype(np.float64)
    for r in range(7):
        row = [float(v) for v in xd[r]]
        m = max(row)
        den = math.fsum(math.exp(v - m) for v in row)
        direct = [math.exp(row[c] - m) / den for c in range(0, 4099, 37)]
        np.testing.assert_allclose(y[r, ::37], direct, rtol=1e-12, atol=0)
    assert (y[np.isneginf(xd)] == 0).all()
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-12)


def _fp32_kernel(x: np.ndarray, threads: int = 256) -> np.ndarray:
    """What an honest kernel computes: fp32 per-thread partial max and sum of exp(x - max) (thread t walks columns
    t, t + threads, ...), a tree over the partials, exp(x - max) * (1 / sum) in fp32, one round to bf16."""
    xf = x.astype(np.float32)
    rows, cols = xf.shape
    pad = np.full((rows, -cols % threads), -np.inf, np.float32)
    parts = np.concatenate([xf, pad], axis=1).reshape(rows, -1, threads)
    m = xf.max(axis=1, keepdims=True)
    s = np.zeros((rows, threads), np.float32)
    with np.errstate(under="ignore"):
        for k in range(parts.shape[1]):
            s = s + np.exp(parts[:, k] - m)
        while s.shape[1] > 1:
            s = s[:, 0::2] + s[:, 1::2]
        inv = np.float32(1) / s
        return (np.exp(xf - m) * inv).astype(np.float32).astype(BF16)


def _bf16_sum_kernel(x: np.ndarray) -> np.ndarray:
    """A wrong kernel: the row sum runs in bf16 (every partial sum rounded to bf16); the rest in fp32."""
    xf = x.astype(np.float32)
    m = xf.max(axis=1)
    s = np.zeros(x.shape[0], np.float32)
    for c in range(x.shape[1]):
        s = (s + np.exp(xf[:, c] - m)).astype(BF16).astype(np.float32)
    return (np.exp(xf - m[:, None]) / s[:, None]).astype(BF16)


@pytest.mark.parametrize("dist", ["normal", "uniform", "large", "tiny", "masked"])
def test_bf16_tolerance_passes_an_fp32_kernel_with_margin(dist):
    tol = _prob().spec.tolerance["bfloat16"]
    for rows, cols in ((16, 8192), (1, 50257), (7, 33)):
        ins = _inputs(rows, cols, dist, 11)
        ref = _prob().reference.reference(ins)["y"]
        check = compare(_fp32_kernel(ins["x"]), ref, tol.atol, tol.rtol, tol.norm_rel)
        assert check.passed, (rows, cols, check.note)
        # one bf16 rounding: <= 2^-8 elementwise (and so in norm); the tolerance leaves >= 2x on both
        assert check.max_rel_err <= 2.0 ** -8 * 1.01 and check.max_rel_err * 2.5 <= tol.rtol
        assert check.norm_rel_err <= 2.0 ** -8 * 1.01 and check.norm_rel_err * 2 < tol.norm_rel


def test_masked_positions_are_exactly_zero_in_the_emulated_kernel():
    ins = _inputs(5, 1000, "masked", 4)
    y = _fp32_kernel(ins["x"]).astype(np.float64)
    masked = np.isneginf(ins["x"].astype(np.float64))
    assert masked.any() and (y[masked] == 0).all() and (y[~masked] > 0).all()


def test_bf16_tolerance_fails_a_kernel_that_sums_in_bf16():
    tol = _prob().spec.tolerance["bfloat16"]
    ins = _inputs(4, 8192, "normal", 12)
    ref = _prob().reference.reference(ins)["y"]
    check = compare(_bf16_sum_kernel(ins["x"]), ref, tol.atol, tol.rtol, tol.norm_rel)
    assert not check.passed and check.max_rel_err > 1 and check.norm_rel_err > 10 * tol.norm_rel


def test_the_tolerance_is_tight():
    """The tolerance is not loose: the correctly rounded answer passes; 2% off, or a masked position left at
    1e-20 instead of 0, fails."""
    tol = _prob().spec.tolerance["bfloat16"]
    ins = _inputs(8, 4096, "normal", 13)
    ref = _prob().reference.reference(ins)["y"]
    assert compare(ref.astype(BF16), ref, tol.atol, tol.rtol, tol.norm_rel).passed
    assert not compare((ref * 1.02).astype(BF16), ref, tol.atol, tol.rtol, tol.norm_rel).passed
    ins_m = _inputs(8, 4096, "masked", 13)
    ref_m = _prob().reference.reference(ins_m)["y"]
    leak = ref_m.astype(BF16)
    leak[ref_m == 0] = BF16.type(1e-20)          # a masked position that is not exactly 0 fails
    assert not compare(leak, ref_m, tol.atol, tol.rtol, tol.norm_rel).passed

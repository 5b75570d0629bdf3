"""The engine's remaining product problems (issue 26): matvec_f32 (decode, fp32 weights), matmul_f32,
matmul_q4_1 and matmul_q8_0 (n tokens at once: prefill, all-logits heads; fp32 weights or GGUF blocks
dequantised inside the kernel).

The references against independent computations (exact fsum loops, gguf's own dequantisation, the matvec
problems' references token by token); the tolerances against honest fp32 sums and dishonest shortcuts; the
judge on real kernels: the reference kernels and family points covering every value of the parameters that
shape the code pass, kernels with a plausible mistake (transposed operands, a wrong token stride, swapped
nibbles, a dropped offset, flushed subnormals, a dropped tile tail) are refused as wrong."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import gguf.quants as gq
import ml_dtypes
import numpy as np
import pytest
import yaml

from kfactory.judge.inputs import draw
from kfactory.judge.numerics import compare
from kfactory.platform.config import Settings
from kfactory.problems import load_problem
from kfactory.problems.check import problems_of
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb
from test_problem_matvec_q import _verdict  # the matvec tests' compile-and-verify-a-C-kernel helper

PROBLEMS = Path(__file__).resolve().parent.parent / "kfactory" / "problems"
NAMES = ("matvec_f32", "matmul_f32", "matmul_q4_1", "matmul_q8_0")
#: one small optimisation shape per problem (the real ones are timed, not needed to judge correctness), with
#: SmolLM2's longest sum (1536 = 48 blocks) so that the tolerance is tested where errors are largest
SMALL = {"matvec_f32": {"rows": 96, "cols": 1536}, "matmul_f32": {"n": 16, "rows": 96, "cols": 1536},
         "matmul_q4_1": {"n": 16, "rows": 96, "blocks": 48}, "matmul_q8_0": {"n": 16, "rows": 96, "blocks": 48}}
GGUF_TYPE = {"matmul_q4_1": gq.GGMLQuantizationType.Q4_1, "matmul_q8_0": gq.GGMLQuantizationType.Q8_0}
MATVEC = {"matmul_q4_1": "matvec_q4_1", "matmul_q8_0": "matvec_q8_0"}


# -- the packages and their references ----------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_package_checks_and_states_smollm2_shapes(name):
    """`problems check` finds nothing, and the score's shape is SmolLM2-135M's gate/up projection (the LM head
    over 16 tokens for Q8_0, the embedding's format)."""
    problem = load_problem(name)
    assert problems_of(problem) == []
    first = problem.shapes("optimize")[0]
    assert first["rows"] == (49152 if name == "matmul_q8_0" else 1536)
    assert first.get("cols", 32 * first.get("blocks", 0)) == 576


def test_matvec_f32_covers_every_decode_projection_and_the_lm_head():
    shapes = {(s["rows"], s["cols"]) for s in load_problem("matvec_f32").shapes("optimize")}
    assert shapes == {(1536, 576), (576, 576), (192, 576), (960, 576), (3072, 576), (576, 1536), (49152, 576)}


@pytest.mark.parametrize("name", ["matmul_f32", "matmul_q4_1", "matmul_q8_0"])
def test_matmul_shapes_are_prefills_of_128_and_512_tokens(name):
    shapes = load_problem(name).shapes("optimize")
    assert {s["n"] for s in shapes} == ({16, 128} if name == "matmul_q8_0" else {128, 512})
    for s in load_problem(name).shapes("verify"):   # a transposed y would go unnoticed at n == rows
        assert s["n"] != s["rows"]


def _fsum_products(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """w [rows, K] times x [K], each row's products summed exactly (math.fsum) and rounded once."""
    return np.array([math.fsum(float(a) * float(b) for a, b in zip(row, x)) for row in w])


@pytest.mark.parametrize("dist", ["normal", "large", "tiny", "offset"])
def test_matvec_f32_reference_is_the_exact_sum(dist):
    problem = load_problem("matvec_f32")
    x = draw(problem, {"rows": 9, "cols": 577}, dist, seed=3)
    want = _fsum_products(x["w"], x["x"])
    np.testing.assert_allclose(problem.reference.reference(x)["y"], want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("dist", ["normal", "tiny", "offset"])
def test_matmul_f32_reference_is_the_exact_sum_per_token(dist):
    problem = load_problem("matmul_f32")
    x = draw(problem, {"n": 5, "rows": 7, "cols": 95}, dist, seed=4)
    y = problem.reference.reference(x)["y"]
    assert y.shape == (5, 7)
    for t in range(5):
        np.testing.assert_allclose(y[t], _fsum_products(x["w"], x["x"][t]), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name", sorted(GGUF_TYPE))
def test_matmul_reference_agrees_with_gguf_and_with_matvec_per_token(name):
    """gguf.quants' dequantisation (float32, exact for these blocks: test_problem_matvec_q) times x in float64,
    across the reference's chunk boundary (4096 rows); and each token's row is the matvec problem's reference."""
    problem, matvec = load_problem(name), load_problem(MATVEC[name])
    for shape in ({"n": 3, "rows": 4099, "blocks": 2}, {"n": 5, "rows": 7, "blocks": 48}):
        for dist in problem.spec.distributions:
            x = draw(problem, shape, dist, seed=5)
            y = problem.reference.reference(x)["y"]
            vals = gq.dequantize(x["w"].reshape(shape["rows"], -1), GGUF_TYPE[name])
            want = x["x"].reshape(shape["n"], -1).astype(np.float64) @ vals.astype(np.float64).T
            np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-300, err_msg=dist)
            for t in (0, shape["n"] - 1):
                got = matvec.reference.reference({"w": x["w"], "x": x["x"][t]})["y"]
                np.testing.assert_allclose(y[t], got, rtol=1e-12, atol=1e-300)


def test_drawn_inputs_hold_what_the_distributions_claim():
    """tiny: most fp32 weights subnormal (what flush-to-zero breaks); every token's x differs; y of order 1 to
    100 in every distribution (one atol serves all)."""
    problem = load_problem("matmul_f32")
    shape = {"n": 4, "rows": 64, "cols": 576}
    w = draw(problem, shape, "tiny", 1)["w"]
    assert (np.abs(w) < np.finfo(np.float32).tiny).mean() > 0.6 and (w != 0).mean() > 0.99
    for name in NAMES:
        p = load_problem(name)
        shape = SMALL[name]
        for dist in p.spec.distributions:
            inputs = draw(p, shape, dist, 2)
            rms = float(np.sqrt(np.mean(p.reference.reference(inputs)["y"] ** 2)))
            assert 0.1 < rms < 300, (name, dist, rms)
            if "n" in shape:
                xs = inputs["x"].reshape(shape["n"], -1)
                assert not np.array_equal(xs[0], xs[1])


@pytest.mark.parametrize("name,shape,nbytes,flops", [
    ("matvec_f32", {"rows": 1536, "cols": 576}, 4 * 1536 * 576 + 4 * 576 + 4 * 1536, 2 * 1536 * 576),
    ("matmul_f32", {"n": 128, "rows": 1536, "cols": 576},
     4 * 1536 * 576 + 4 * 128 * 576 + 4 * 128 * 1536, 2 * 128 * 1536 * 576),
    ("matmul_q4_1", {"n": 128, "rows": 1536, "blocks": 18},
     20 * 1536 * 18 + 4 * 128 * 576 + 4 * 128 * 1536, 2 * 128 * 1536 * 576 + 2 * 1536 * 576),
    ("matmul_q8_0", {"n": 16, "rows": 49152, "blocks": 18},
     34 * 49152 * 18 + 4 * 16 * 576 + 4 * 16 * 49152, 2 * 16 * 49152 * 576 + 49152 * 576),
])
def test_cost_counts_each_operand_once(name, shape, nbytes, flops):
    assert load_problem(name).cost(shape) == (nbytes, flops)


# -- the tolerance: honest fp32 passes with a margin, shortcuts fail ----------------------------------------

def _fp32_sequential(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y = w @ x with one fp32 accumulator per row, columns in order (the reference kernel's sum)."""
    acc = np.zeros(w.shape[0], np.float32)
    for c in range(w.shape[1]):
        acc += w[:, c] * x[c]
    return acc


@pytest.mark.parametrize("dist", ["normal", "large", "tiny", "offset"])
def test_tolerance_passes_a_sequential_fp32_sum_with_a_margin(dist):
    problem = load_problem("matvec_f32")
    tol = problem.spec.tolerance["float32"]
    x = draw(problem, {"rows": 256, "cols": 1536}, dist, 8)
    check = compare(_fp32_sequential(x["w"], x["x"]), problem.reference.reference(x)["y"], tol.atol, tol.rtol,
                    tol.norm_rel)
    assert check.passed and check.norm_rel_err < tol.norm_rel / 4, check


@pytest.mark.parametrize("shortcut", ["bf16 weights", "fp16 weights", "fp16 accumulator"])
def test_tolerance_refuses_reduced_precision(shortcut):
    problem = load_problem("matvec_f32")
    tol = problem.spec.tolerance["float32"]
    x = draw(problem, {"rows": 256, "cols": 576}, "normal", 9)
    w = x["w"]
    if shortcut == "bf16 weights":
        y = _fp32_sequential(w.astype(ml_dtypes.bfloat16).astype(np.float32), x["x"])
    elif shortcut == "fp16 weights":
        y = _fp32_sequential(w.astype(np.float16).astype(np.float32), x["x"])
    else:
        acc = np.zeros(w.shape[0], np.float16)
        for c in range(w.shape[1]):
            acc = (acc + (w[:, c] * x["x"][c]).astype(np.float16)).astype(np.float16)
        y = acc.astype(np.float32)
    check = compare(y, problem.reference.reference(x)["y"], tol.atol, tol.rtol, tol.norm_rel)
    assert not check.passed and check.norm_rel_err > 10 * tol.norm_rel, (shortcut, check.norm_rel_err)


# -- the judge on real kernels ----------------------------------------------------------------------------

def _package(root: Path, name: str, optimize: dict) -> Path:
    """A copy of the built-in package `name` whose only optimisation shape is `optimize`."""
    out = root / name
    shutil.copytree(PROBLEMS / name, out, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((out / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = [optimize]
    (out / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The cpu target with short runner timeouts; verification needs no measured ceilings."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("matmul-data"), runner_timeout_s=20.0, threads=2)
    return get_target("cpu", settings)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """Each problem with one small optimisation shape, so that verification covers every verify shape and
    distribution in about a second."""
    root = tmp_path_factory.mktemp("small")
    return {name: load_problem(_package(root, name, SMALL[name])) for name in NAMES}


def _reference_c(name: str) -> str:
    return (PROBLEMS / name / "reference_cpu.c").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_reference_kernel_passes_verification(cpu, small, name):
    v = _verdict(cpu, small[name], _reference_c(name))
    assert v.passed, v.message
    assert len(v.checks) >= 6 * len(small[name].spec.distributions)


#: plausible mistakes, each a one-line edit of the reference kernel: (problem, what is wrong, old, new); every
#: edit stays inside the buffers, so the judge sees a wrong result, not a crash
WRONG = [
    ("matvec_f32", "w read transposed (column-major)", "const float *wr = w + r * cols;",
     "const float *wr = w + r;"),
    ("matvec_f32", "the last columns dropped (a vector loop without its tail)", "c < cols; c++",
     "c < cols / 8 * 8; c++"),
    ("matvec_f32", "subnormal weights read as zero (denormals-are-zero)", "s += wr[c] * x[c];",
     "s += (wr[c] > -1.17549435e-38f && wr[c] < 1.17549435e-38f ? 0.0f : wr[c]) * x[c];"),
    ("matmul_f32", "y written transposed (y[r, t])", "y[t * rows + r] = s;", "y[r * n + t] = s;"),
    ("matmul_f32", "x read with the wrong token stride (x taken as cols x n)", "s += xt[c] * wr[c];",
     "s += x[c * n + t] * wr[c];"),
    ("matmul_f32", "w read transposed (w taken as cols x rows)", "s += xt[c] * wr[c];",
     "s += xt[c] * w[c * rows + r];"),
    ("matmul_q4_1", "x read with a token stride of blocks floats, not 32 blocks",
     "const float *xt = x + t * blocks * 32;", "const float *xt = x + t * blocks;"),
    ("matmul_q4_1", "nibbles swapped: the high nibble taken as element j",
     "(float)(blk[4 + j] & 15) + m) * xb[j]", "(float)(blk[4 + j] >> 4) + m) * xb[j]"),
    ("matmul_q4_1", "the offset m dropped", "d * (float)(blk[4 + j] & 15) + m", "d * (float)(blk[4 + j] & 15)"),
    ("matmul_q4_1", "y written transposed (y[r, t])", "y[t * rows + r] = s;", "y[r * n + t] = s;"),
    ("matmul_q8_0", "codes read as unsigned bytes", "const int8_t *q = (const int8_t *)(blk + 2);",
     "const uint8_t *q = blk + 2;"),
    ("matmul_q8_0", "the scale read in the wrong byte order", "(uint32_t)p[0] | (uint32_t)p[1] << 8",
     "(uint32_t)p[1] | (uint32_t)p[0] << 8"),
    ("matmul_q8_0", "x read with a token stride of blocks floats, not 32 blocks",
     "const float *xt = x + t * blocks * 32;", "const float *xt = x + t * blocks;"),
]


@pytest.mark.parametrize("name,why,old,new", WRONG, ids=[w[1] for w in WRONG])
def test_a_kernel_with_a_plausible_mistake_is_refused(cpu, small, name, why, old, new):
    source = _reference_c(name)
    assert source.count(old) == 1, why
    v = _verdict(cpu, small[name], source.replace(old, new))
    assert not v.passed and v.reason == pb.WRONG_RESULT, (why, v.reason, v.message)


def _family_points(problem) -> list[dict]:
    """About ten points spread evenly over the family's space, plus the first point with each value of every
    parameter the spread missed (each verification is a compile and a runner)."""
    family = problem.families["cpu_c"]
    points = family.points()
    chosen = points[::max(1, len(points) // 10)]
    for param, values in family.spec.params.items():
        for value in values:
            if param != "flags" and not any(p[param] == value for p in chosen):
                chosen.append(next(p for p in points if p[param] == value))
    return chosen


@pytest.mark.parametrize("name", NAMES)
def test_family_points_compile_and_verify(cpu, small, name):
    problem = small[name]
    family = problem.families["cpu_c"]
    points = _family_points(problem)
    for param, values in family.spec.params.items():
        if param != "flags":
            assert {p[param] for p in points} == set(values), param
    for point in points:
        source, flags, _ = family.render(point)
        v = _verdict(cpu, problem, source, flags)
        assert v.passed, (point, v.message)


#: a family point with one tail loop removed from its rendered source: the ragged verify shapes must catch it
TAILS = [
    ("matvec_f32", {"isa": "avx2", "group": 4, "accs": 2, "threads": 1},
     "for (; c < cols; c++) {", "for (; c < 0; c++) {"),
    ("matmul_f32", {"isa": "avx2", "form": "dot", "tile_rows": 4, "tile_tokens": 3, "threads": 1},
     "for (; t < n; t++) dot_4_1(", "for (; t < 0; t++) dot_4_1("),
    ("matmul_q4_1", {"isa": "avx2", "dequant": "panel", "form": "bcast", "tile_rows": 16, "tile_tokens": 6,
                     "threads": 1}, "for (int64_t r = panels * TR; r < rows; r++)",
     "for (int64_t r = panels * TR; r < panels * TR; r++)"),
    ("matmul_q8_0", {"isa": "avx2", "dequant": "inline", "form": "dot", "tile_rows": 2, "tile_tokens": 4,
                     "threads": 1}, "for (; t < n; t++) dqi_2_1(", "for (; t < 0; t++) dqi_2_1("),
]


@pytest.mark.parametrize("name,point,old,new", TAILS, ids=[t[0] for t in TAILS])
def test_a_family_point_without_a_tail_loop_is_refused(cpu, small, name, point, old, new):
    problem = small[name]
    family = problem.families["cpu_c"]
    full = next(p for p in family.points() if all(p[k] == v for k, v in point.items()))
    source, flags, _ = family.render(full)
    assert _verdict(cpu, problem, source, flags).passed
    assert source.count(old) >= 1, old   # every copy: matvec_f32 has one per row-group function
    v = _verdict(cpu, problem, source.replace(old, new), flags)
    assert not v.passed and v.reason == pb.WRONG_RESULT, (v.reason, v.message)

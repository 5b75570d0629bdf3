"""Matrix-vector products on GGUF blocks (matvec_q4_1, matvec_q8_0): the uint8 dtype, the ggml_q4_1 and ggml_q8_0
draws checked against gguf.quants, the spec's refusals, the references against an independent dequantisation, and
the judge on real kernels: the reference kernels and family points pass, kernels with a plausible layout mistake
are refused as wrong."""
from __future__ import annotations

import shutil
from pathlib import Path

import gguf.quants as gq
import numpy as np
import pytest
import yaml

from kfactory.export._runtime_selftest import _kf_draw
from kfactory.judge.checks import InputPool
from kfactory.judge.inputs import draw, ggml_blocks
from kfactory.judge.verify import verify
from kfactory.platform.config import Settings
from kfactory.problems import ProblemError, load_problem
from kfactory.problems.check import problems_of
from kfactory.problems.spec import Distribution
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb

PROBLEMS = Path(__file__).resolve().parent.parent / "kfactory" / "problems"
GGUF_TYPE = {"matvec_q4_1": gq.GGMLQuantizationType.Q4_1, "matvec_q8_0": gq.GGMLQuantizationType.Q8_0}
BLOCK = {"matvec_q4_1": 20, "matvec_q8_0": 34}
FP16_MIN_NORMAL = 2.0 ** -14


def _scales(w: np.ndarray, offset: int = 0) -> np.ndarray:
    """The fp16 at byte `offset` of every block, as float64."""
    return np.ascontiguousarray(w[..., offset:offset + 2]).view("<f2").astype(np.float64)[..., 0]


@pytest.mark.parametrize("name", sorted(GGUF_TYPE))
def test_drawn_blocks_dequantise_as_gguf_reads_them(name):
    """Every distribution's blocks, read by gguf.quants, equal the reference's float64 dequantisation (gguf
    computes in fp32, where d * q + m is exact but for one rounding: the float64 value rounded to fp32)."""
    problem = load_problem(name)
    shape = {"rows": 33, "blocks": 7}
    for dist in problem.spec.distributions:
        w = draw(problem, shape, dist, seed=11)["w"]
        assert w.dtype == np.uint8 and w.shape == (33, 7, BLOCK[name])
        theirs = gq.dequantize(w.reshape(33, -1), GGUF_TYPE[name])
        ours = problem.reference.dequantise(w).reshape(33, -1)
        assert theirs.shape == ours.shape == (33, 7 * 32)
        np.testing.assert_array_equal(theirs, ours.astype(np.float32), err_msg=dist)


def test_q4_1_layout_byte_j_holds_elements_j_and_j_plus_16():
    """A hand-made block (d 0.5, m -1, element c coded c % 16): gguf and the reference agree on the layout."""
    q = np.arange(32) % 16
    block = np.concatenate([np.array([0.5, -1.0], "<f2").view(np.uint8),
                            (q[:16] | (q[16:] << 4)).astype(np.uint8)])
    want = 0.5 * q - 1.0
    np.testing.assert_array_equal(gq.dequantize(block[None], gq.GGMLQuantizationType.Q4_1)[0], want)
    np.testing.assert_array_equal(load_problem("matvec_q4_1").reference.dequantise(block[None])[0], want)


@pytest.mark.parametrize("kind", ["ggml_q4_1", "ggml_q8_0"])
def test_realistic_blocks_represent_normal_weights(kind):
    """Blocks quantising normal(0, 0.02) weights: their values have std 0.02 (within 3%) and mean ~0, the scales
    are those of real quantisers (Q4_1: d ~ range / 15, m the block's minimum; Q8_0: max |code| is 127)."""
    size = 20 if kind == "ggml_q4_1" else 34
    w = ggml_blocks(np.random.default_rng(3), Distribution(kind=kind, std=0.02), (2000, size))
    name = "matvec_q4_1" if kind == "ggml_q4_1" else "matvec_q8_0"
    vals = load_problem(name).reference.dequantise(w)
    assert abs(vals.std() / 0.02 - 1) < 0.03 and abs(vals.mean()) < 1e-3
    if kind == "ggml_q4_1":
        np.testing.assert_allclose(vals.min(axis=1), _scales(w, 2), rtol=1e-3)   # code 0 sits at m
        codes = np.concatenate([w[:, 4:] & 15, w[:, 4:] >> 4], axis=1)
        assert (codes.max(axis=1) == 15).all()
    else:
        assert (np.abs(w[:, 2:].view(np.int8)).max(axis=1) == 127).all()


def test_nasty_distributions_hold_the_edge_cases_they_claim():
    """tiny: subnormal fp16 scales; large: scales in the thousands; special: d = 0, all-15 codes, negative d."""
    problem = load_problem("matvec_q4_1")
    shape = {"rows": 64, "blocks": 18}
    d_tiny = _scales(draw(problem, shape, "tiny", 1)["w"])
    assert (np.abs(d_tiny) < FP16_MIN_NORMAL).mean() > 0.9 and (d_tiny != 0).all()
    assert np.median(_scales(draw(problem, shape, "large", 1)["w"])) > 1000
    w = draw(problem, shape, "special", 1)["w"]
    d = _scales(w)
    assert (d == 0).any() and (d < 0).any() and (w[..., 4:] == 0xFF).all(axis=-1).any()
    assert (w[..., 4:] == 0).all(axis=-1).any()
    q8 = load_problem("matvec_q8_0")
    w8 = draw(q8, shape, "special", 1)["w"]
    assert (w8[..., 2:].view(np.int8) == -128).all(axis=-1).any()
    assert (np.abs(_scales(draw(q8, shape, "tiny", 1)["w"])) < FP16_MIN_NORMAL).all()


@pytest.mark.parametrize("kind,size", [("ggml_q4_1", 20), ("ggml_q8_0", 34)])
def test_the_exported_selftest_draws_the_same_bytes(kind, size):
    for d in (Distribution(kind=kind, std=0.02), Distribution(kind=kind, std=2e-5, special_fraction=0.4)):
        ours = ggml_blocks(np.random.default_rng(7), d, (9, 5, size))
        exported = _kf_draw(np.random.default_rng(7), d.model_dump(), (9, 5, size), "uint8")
        np.testing.assert_array_equal(ours, exported)
        assert not np.array_equal(ours, ggml_blocks(np.random.default_rng(8), d, (9, 5, size)))


# -- the spec's refusals ----------------------------------------------------------------------------------------

def _package(tmp_path: Path, name: str, edit) -> Path:
    """A copy of the built-in package `name`, named `name`_copy (it judges differently: a built-in's name is for
    packages that judge as it does), with problem.yaml changed by `edit(spec_dict)`."""
    root = tmp_path / name
    shutil.copytree(PROBLEMS / name, root, ignore=shutil.ignore_patterns("__pycache__"))
    spec = yaml.safe_load((root / "problem.yaml").read_text())
    spec["name"] = f"{name}_copy"
    edit(spec)
    (root / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return root


REFUSALS = [
    (lambda s: s["distributions"]["normal"].update(x={"kind": "ggml_q4_1"}), "distributions.normal.x",
     "kind ggml_q4_1 draws GGUF blocks into a uint8 tensor, but 'x' is float32"),
    (lambda s: s["inputs"][0].update(shape=["rows", "blocks", 34]), "distributions.normal.w",
     "needs the last axis of 'w' to be the block's 20 bytes"),
    (lambda s: s["distributions"]["normal"]["w"].update(kind="ggml_q8_0"), "distributions.normal.w",
     "the block's 34 bytes"),
    (lambda s: s["inputs"][0].update(shape=["rows", "blocks"]) or s.update(symbols=["rows", "blocks"]),
     "distributions.normal.w", "not 'blocks'"),
    (lambda s: s["outputs"][0].update(dtype="uint8"), "output 'y'", "dtype uint8 is for inputs"),
    (lambda s: s["distributions"]["normal"].update(w={"kind": "normal", "std": 1.0}), "distributions.normal.w",
     "'w' is uint8: draw it as GGUF blocks"),
    (lambda s: s["distributions"]["normal"].update(w={"kind": "uniform", "low": -1.0, "high": 1.0}),
     "distributions.normal.w", "0 <= low < high <= 256"),
    (lambda s: s["distributions"]["normal"].update(w={"kind": "constant", "value": float("inf")}),
     "distributions.normal.w", "a constant must be an integer 0..255"),
    (lambda s: s["distributions"]["normal"]["w"].update(neg_inf_fraction=0.1), "distributions.normal.w",
     "neg_inf_fraction, transform and factor do not apply"),
    (lambda s: s["distributions"]["normal"]["x"].update(special_fraction=0.1), "distributions.normal.x",
     "special_fraction applies to the ggml_q4_1 and ggml_q8_0 kinds"),
]


@pytest.mark.parametrize("edit,field,what", REFUSALS)
def test_spec_refuses_blocks_that_cannot_be_drawn(tmp_path, edit, field, what):
    with pytest.raises(ProblemError) as e:
        load_problem(_package(tmp_path, "matvec_q4_1", edit))
    assert field in str(e.value) and what in str(e.value), str(e.value)


def test_uint8_bytes_drawn_uniformly_are_accepted(tmp_path):
    """A uint8 input may also be plain bytes: uniform over [0, 256) covers every value."""
    root = _package(tmp_path, "matvec_q4_1", lambda s: s["distributions"]["normal"].update(
        w={"kind": "uniform", "low": 0.0, "high": 256.0}))
    w = draw(load_problem(root), {"rows": 300, "blocks": 5}, "normal", 2)["w"]
    assert w.dtype == np.uint8 and w.min() == 0 and w.max() == 255


# -- the packages and their references ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(GGUF_TYPE))
def test_package_checks_and_reference_agrees_with_gguf(name):
    """`problems check` finds nothing; the float64 reference equals gguf's dequantisation (float32, exact here
    as shown above) times x in float64, across the reference's chunk boundary (4096 rows)."""
    problem = load_problem(name)
    assert problems_of(problem) == []
    for shape in ({"rows": 4099, "blocks": 3}, {"rows": 7, "blocks": 48}):
        for dist in problem.spec.distributions:
            x = draw(problem, shape, dist, seed=5)
            vals = gq.dequantize(x["w"].reshape(shape["rows"], -1), GGUF_TYPE[name]).astype(np.float64)
            want = vals @ x["x"].reshape(-1).astype(np.float64)
            np.testing.assert_allclose(problem.reference.reference(x)["y"], want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name,per_byte", [("matvec_q4_1", 20), ("matvec_q8_0", 34)])
def test_cost_counts_the_blocks_x_and_y(name, per_byte):
    nbytes, flops = load_problem(name).cost({"rows": 1536, "blocks": 18})
    assert nbytes == per_byte * 1536 * 18 + 4 * 32 * 18 + 4 * 1536
    assert flops == (4 if per_byte == 20 else 3) * 32 * 1536 * 18


# -- the judge on real kernels ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    """The cpu target with short runner timeouts; verification needs no measured ceilings."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("matvec-data"), runner_timeout_s=10.0, threads=2)
    return get_target("cpu", settings)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """Both problems with one small optimisation shape (SmolLM2's 18 blocks, 64 rows), so that verification
    covers every verify shape and distribution in a second."""
    root = tmp_path_factory.mktemp("small")
    return {name: load_problem(_package(root, name, lambda s: s["shapes"].update(
        optimize=[{"rows": 64, "blocks": 18}]))) for name in GGUF_TYPE}


def _verdict(target, problem, source: str, flags: str = "-O2 -fopenmp"):
    res = target.compile(source, "c", flags, "kernel")
    assert res.ok, res.message
    session = target.session(problem, 1)
    try:
        session.load_artifact("k", res.artifact, "kernel")
        return verify(session, "k", problem, InputPool(problem, 1))
    finally:
        session.close()


def _reference_c(name: str) -> str:
    return (PROBLEMS / name / "reference_cpu.c").read_text()


#: plausible mistakes, each a one-line edit of the reference kernel: (problem, what is wrong, old, new)
WRONG = [
    ("matvec_q4_1", "nibbles swapped: the high nibble taken as element j",
     "(float)(blk[4 + j] & 15) + m) * xb[j]", "(float)(blk[4 + j] >> 4) + m) * xb[j]"),
    ("matvec_q4_1", "nibbles interleaved: byte j as elements 2j, 2j + 1 (not j, j + 16)",
     "* xb[j + 16]", "* xb[(2 * j + 1) % 32]"),
    ("matvec_q4_1", "the offset m dropped", "d * (float)(blk[4 + j] & 15) + m", "d * (float)(blk[4 + j] & 15)"),
    ("matvec_q4_1", "subnormal fp16 scales flushed to zero",
     "float v = (float)mant * 5.9604644775390625e-8f;", "float v = 0.0f * (float)mant;"),
    ("matvec_q8_0", "codes read as unsigned bytes", "const int8_t *q = (const int8_t *)(blk + 2);",
     "const uint8_t *q = blk + 2;"),
    ("matvec_q8_0", "the scale read from the wrong byte order",
     "(uint32_t)p[0] | (uint32_t)p[1] << 8", "(uint32_t)p[1] | (uint32_t)p[0] << 8"),
]


@pytest.mark.parametrize("name", sorted(GGUF_TYPE))
def test_reference_kernel_passes_verification(cpu, small, name):
    v = _verdict(cpu, small[name], _reference_c(name))
    assert v.passed, v.message
    assert len(v.checks) >= 6 * len(small[name].spec.distributions)


@pytest.mark.parametrize("name,why,old,new", WRONG, ids=[w[1] for w in WRONG])
def test_a_kernel_with_a_layout_mistake_is_refused(cpu, small, name, why, old, new):
    source = _reference_c(name)
    assert source.count(old) == 1, why
    v = _verdict(cpu, small[name], source.replace(old, new))
    assert not v.passed and v.reason == pb.WRONG_RESULT, (why, v.reason, v.message)


def _family_points(problem) -> list[dict]:
    """About ten points spread evenly over the family's space (each verification is a compile and a runner)."""
    points = problem.families["cpu_c"].points()
    return points[::max(1, len(points) // 10)]


@pytest.mark.parametrize("name", sorted(GGUF_TYPE))
def test_family_points_compile_and_verify(cpu, small, name):
    problem = small[name]
    family = problem.families["cpu_c"]
    points = _family_points(problem)
    for param in ("isa", "group", "accs", "threads"):   # every value of the parameters that shape the code
        assert {p[param] for p in points} == set(family.spec.params[param]), param
    for point in points:
        source, flags, _ = family.render(point)
        v = _verdict(cpu, problem, source, flags)
        assert v.passed, (point, v.message)

"""The judge's device-side drawing and comparison, held to their host twins without a GPU (issue 23).

kf_judge.cu (with kf_draw.h and kf_compare.h) is built here with the system C compiler: the same element functions
the device runs, in plain loops. Its draws must equal kfactory.judge.counter_rng's bit for bit, its per-block
partials must merge to the figures kfactory.judge.numerics computes on the host, and NVRTC must build it for
Hopper and Blackwell. tests/test_cuda_runtime.py runs the same kernels on a GPU where one is present.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from cuda_fake import host_build, judge_host

from kfactory.judge import counter_rng as twin
from kfactory.judge import numerics
from kfactory.problems import load_problem
from kfactory.problems.spec import register_bfloat16
from kfactory.targets.cuda import judge_kernels as jk

# Philox4x32-10 known answers (Random123's kat_vectors: counter, key, output)
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory) -> ctypes.CDLL:
    """kf_judge.cu built for this host, as the tests' twin of the device build."""
    return judge_host(tmp_path_factory.mktemp("judge") / "kf_judge.so")


def test_philox_known_answers():
    for counter, (k0, k1), want in KAT:
        got = twin.philox(np.array([counter], dtype=np.uint32), k0 | (k1 << 32))
        assert tuple(int(w) for w in got[0]) == want


def test_the_twins_log_and_cosine_agree_with_the_math_library():
    """The polynomials are accurate, not just reproducible: within a few ulp of numpy's log and cos."""
    u = np.concatenate([np.linspace(2.0 ** -53, 1.0, 200_001), [2.0 ** -53, 0.5, 1.0]])
    assert np.max(np.abs(twin.log_unit(u) - np.log(u)) / np.maximum(np.abs(np.log(u)), 1e-300)) < 1e-15
    assert twin.log_unit(np.array([1.0]))[0] == 0.0
    v = np.linspace(0.0, 1.0, 400_001, endpoint=False)
    assert np.max(np.abs(twin.cos2pi(v) - np.cos(2 * np.pi * v))) < 2e-15


@pytest.mark.parametrize("kind,a,b,dtype,neg_inf,cols", [
    ("normal", 0.0, 1.0, "float32", 0.0, 1000),
    ("normal", 0.0, 40.0, "float32", 0.1, 33),
    ("normal", 1.0, 0.25, "bfloat16", 0.0, 4099),
    ("uniform", -8.0, 8.0, "float32", 0.0, 1),
    ("uniform", -4.0, 4.0, "bfloat16", 0.3, 7),
    ("constant", 2.5, 0.0, "float32", 0.5, 64),
])
def test_the_host_build_draws_what_the_twin_draws(host_lib, kind, a, b, dtype, neg_inf, cols):
    n, tensor = 200_000 - 200_000 % cols, 1
    register_bfloat16()
    for seed in (0, 12345, 2 ** 63 - 25):
        out = np.empty(n, dtype=np.dtype(dtype))
        host_lib.kf_draw_host(out.ctypes.data, twin.DTYPES[dtype], n, cols, seed, tensor, twin.KINDS[kind], a, b,
                              neg_inf)
        d = _dist(kind, a, b, neg_inf)
        want = twin.elements(d, dtype, cols, tensor, seed, np.arange(n, dtype=np.uint64))
        assert out.view(np.uint8).tobytes() == want.view(np.uint8).tobytes(), (kind, dtype, seed)


def test_draws_have_their_distribution():
    idx = np.arange(1_000_000, dtype=np.uint64)
    z = twin.values(idx, 0, 7, "normal", 0.0, 1.0)
    assert abs(z.mean()) < 0.005 and abs(z.std() - 1) < 0.005
    assert abs(np.mean(z ** 4) - 3) < 0.05 and 4.5 < np.abs(z).max() < 7   # normal tails, not a clipped sum
    u = twin.values(idx, 0, 7, "uniform", -2.0, 6.0)
    assert -2.0 <= u.min() < -1.99 and 5.99 < u.max() < 6.0 and abs(u.mean() - 2.0) < 0.01
    # another seed, tensor or element index (the high word too) is another value
    assert not np.array_equal(z[:100], twin.values(idx[:100], 0, 8, "normal", 0.0, 1.0))
    assert not np.array_equal(z[:100], twin.values(idx[:100], 1, 7, "normal", 0.0, 1.0))
    high = twin.values(idx[:100] + np.uint64(1 << 32), 0, 7, "normal", 0.0, 1.0)
    assert not np.array_equal(z[:100], high)


def test_the_mask_keeps_a_finite_column_in_every_row():
    cols, rows = 9, 20_000
    d = _dist("normal", 0.0, 2.0, 0.6)
    x = twin.elements(d, "float32", cols, 0, 3, np.arange(rows * cols, dtype=np.uint64)).reshape(rows, cols)
    masked = np.isneginf(x)
    assert np.isfinite(x).any(axis=1).all() and not np.isnan(x).any()
    assert abs(masked.mean() - 0.6 * (cols - 1) / cols) < 0.01


def test_a_row_is_reproduced_alone():
    problem = load_problem("softmax")
    shape = {"rows": 7, "cols": 33}
    whole = twin.draw(problem, shape, "masked", 99)["x"]
    assert whole.shape == (7, 33) and np.isneginf(whole).any()
    assert np.array_equal(twin.draw(problem, shape, "masked", 99, rows=slice(5, 6))["x"], whole[5:6])
    rms = load_problem("rmsnorm")   # a row of x comes with the whole weight vector it is normalised by
    full, row = (twin.draw(rms, {"rows": 7, "hidden": 33}, "normal", 3, rows=r) for r in (None, slice(4, 5)))
    assert np.array_equal(row["x"], full["x"][4:5]) and np.array_equal(row["w"], full["w"])


def test_a_device_label_draws_with_the_twin_everywhere():
    """A check judged on a GPU is labelled device:DIST; the host's draw of that label (a regression input's
    replay on any target) is the twin's, not numpy's generator's."""
    from kfactory.judge import inputs
    problem = load_problem("softmax")
    shape = {"rows": 3, "cols": 1000}
    via_label = inputs.draw(problem, shape, twin.PREFIX + "uniform", 42)["x"]
    assert np.array_equal(via_label, twin.draw(problem, shape, "uniform", 42)["x"])
    assert not np.array_equal(via_label, inputs.draw(problem, shape, "uniform", 42)["x"])


def test_memory_keeps_a_device_drawn_failure_as_a_regression_input(tmp_path):
    """A kernel that passed before, found wrong on a GPU-drawn set: memory keeps the input under its device:DIST
    label (the verifier's replay draws it with the twin); a memoisation probe's label stays out."""
    from evidence_chain import links

    from kfactory.bus import events as ev
    from kfactory.services.memory.archive import Archive
    from kfactory.v1 import events_pb2 as pb
    archive = Archive(tmp_path / "archive.sqlite")
    cand = pb.Candidate(id="d" * 64, problem="softmax", target="cuda", family="cuda_cu", origin="template:cuda_cu",
                        params_json='{"vec": 4}', point_id="p1")
    for event in links("c1", cand):
        archive.record(event)
    for cid, label in (("c2", "memo:first"), ("c3", twin.PREFIX + "normal")):
        check = pb.Check(shape="4096x4096", distribution=label, seed=99, max_abs_err=1.0, passed=False)
        archive.record(ev.make_event(cid, "verifier", cand.id, rejected=pb.Rejected(
            candidate=cand, stage="verifier", reason=pb.WRONG_RESULT, message="wrong", checks=[check])))
    kept = archive.regressions("softmax")
    assert [(r.distribution, r.seed, r.campaign_id) for r in kept] == [(twin.PREFIX + "normal", 99, "c3")]
    archive.close()


def test_which_distributions_the_device_draws():
    for name in ("softmax", "rmsnorm"):
        p = load_problem(name)
        assert all(twin.device_drawable(p, d) is None for d in p.spec.distributions), name
    rms = load_problem("rmsnorm")
    got = twin.draw(rms, {"rows": 3, "hidden": 33}, "normal", 5)
    assert got["x"].dtype == np.dtype("bfloat16") and got["w"].shape == (33,)
    for name in ("matvec_q4_1", "matvec_q8_0"):   # GGUF blocks are drawn on the host
        p = load_problem(name)
        assert any("ggml" in (twin.device_drawable(p, d) or "") for d in p.spec.distributions), name


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compare_partials_merge_to_the_judges_figures(host_lib, dtype):
    register_bfloat16()
    rng = np.random.default_rng(4)
    n = 70_001
    ref = rng.standard_normal(n) * 3.0
    out = (ref * (1 + rng.standard_normal(n) * 1e-3)).astype(np.dtype(dtype))
    ref[[10, 20, 30]] = [np.inf, -np.inf, np.nan]
    out[[10, 20, 30]] = [np.inf, -np.inf, np.nan]
    cases = {"clean": (out, ref)}
    tie = out.copy()
    tie[[500, 40_000]] = (ref[[500, 40_000]] + 1.0).astype(tie.dtype)   # two equal excesses: the first counts
    tie[40_000] = tie[500] - np.asarray(ref[500] - ref[40_000]).astype(tie.dtype)
    cases["tie"] = (tie, ref)
    bad = out.copy()
    bad[[60_000, 7]] = np.nan                                             # non-finite where the reference is not
    cases["bad"] = (bad, ref)
    pattern = out.copy()
    pattern[20] = 0.0                                                     # the reference's -inf not matched
    cases["pattern"] = (pattern, ref)
    atol, rtol = 1e-5, 1e-3
    for name, (o, r) in cases.items():
        for blocks in (1, 3, 37):
            partials = np.zeros(blocks, dtype=jk.STATS)
            host_lib.kf_compare_host(o.ctypes.data, twin.DTYPES[dtype], r.ctypes.data, n, atol, rtol, blocks,
                                     partials.ctypes.data)
            got = jk.merge(partials)
            want = _careful_figures(o, r, atol, rtol)
            for key in ("max_abs", "max_rel", "worst_excess", "worst", "finite", "pattern_bad", "out_bad",
                        "out_bad_first"):
                assert got[key] == want[key], (name, blocks, key, got[key], want[key])
            assert got["diff_sq"] == pytest.approx(want["diff_sq"], rel=1e-12)
            assert got["ref_sq"] == pytest.approx(want["ref_sq"], rel=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_runs_are_compared_by_value_as_the_host_compares_them(host_lib, dtype):
    """kf_count_unequal (the device's same-answer-twice count) equals numerics.differing_elements: a NaN equals a
    NaN whatever its payload, -0 equals 0, and any other change of value counts once."""
    register_bfloat16()
    a = np.random.default_rng(5).standard_normal(10_003).astype(np.dtype(dtype))
    a[[3, 4]] = [np.nan, 0.0]
    b = a.copy()
    bits = b.view(np.uint32 if dtype == "float32" else np.uint16)
    bits[3] |= 1                                  # another NaN
    b[4] = -0.0                                   # the same value, another sign bit
    b[[100, 9_000]] = b[[100, 9_000]] * 2 + 1     # two real differences
    count = np.zeros(1, dtype=np.uint64)
    host_lib.kf_count_unequal_host(a.ctypes.data, b.ctypes.data, twin.DTYPES[dtype], a.size, count.ctypes.data)
    assert int(count[0]) == numerics.differing_elements(a, b) == 2
    assert np.count_nonzero(a.view(np.uint8) != b.view(np.uint8)) > 2   # byte for byte they differ more


def test_the_judges_kernels_build_for_hopper_and_blackwell(tmp_path):
    from kfactory.targets.cuda.compile import compile_cuda
    from kfactory.targets.cuda.toolchain import CudaToolchainMissing
    for arch in ("sm_90a", "sm_100a"):
        try:
            res = compile_cuda(jk.source(), "cuda", jk.FLAGS, jk.DRAW, arch, None)
        except CudaToolchainMissing as e:
            pytest.skip(f"no CUDA toolchain wheels: {e}")
        assert res.ok, res.log[-2000:]
        assert jk.COMPARE.encode() in res.artifact and jk.DRAW.encode() in res.artifact


@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_problem_f64_reference_kernels_match_their_numpy_reference(tmp_path, name):
    """A problem's float64 device reference (spec reference_f64), built for the host, computes reference.py's
    outputs on the verify shapes and every distribution (the device-drawn inputs), to 1e-13 of each row's
    scale; -inf inputs give exactly 0."""
    problem = load_problem(name)
    source, _, _ = problem.reference_f64("cuda")
    fn = host_build(source, tmp_path / "ref.so").reference_f64_host
    for shape in problem.shapes("verify"):
        for dist in problem.spec.distributions:
            inputs = twin.draw(problem, shape, dist, 17)
            want = problem.reference.reference(dict(inputs), **problem.params)
            out = {t.name: np.zeros(problem.tensor_shape(t, shape)) for t in problem.spec.outputs}
            symbols = [ctypes.c_longlong(shape[s]) for s in problem.spec.symbols]
            params = [ctypes.c_double(v) for v in problem.params.values()]
            fn(*[ctypes.c_void_p(inputs[t.name].ctypes.data) for t in problem.spec.inputs],
               *[ctypes.c_void_p(out[t.name].ctypes.data) for t in problem.spec.outputs], *symbols, *params)
            for t in problem.spec.outputs:
                got, ref = out[t.name], want[t.name]
                scale = np.max(np.abs(ref), axis=-1, keepdims=True)
                assert np.all(np.abs(got - ref) <= 1e-13 * scale), (name, shape, dist)
                assert np.array_equal(got == 0, ref == 0)


@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_problem_f64_reference_kernels_build_for_hopper(name):
    from kfactory.targets.cuda.compile import compile_cuda
    from kfactory.targets.cuda.toolchain import CudaToolchainMissing
    source, flags, launch = load_problem(name).reference_f64("cuda")
    try:
        res = compile_cuda(source, "cuda", flags, "reference_f64", "sm_90a", None)
    except CudaToolchainMissing as e:
        pytest.skip(f"no CUDA toolchain wheels: {e}")
    assert res.ok, res.log[-2000:]
    assert set(launch) == {"grid", "block", "smem"}


def _careful_figures(out: np.ndarray, ref: np.ndarray, atol: float, rtol: float) -> dict:
    """The one-pass helper's figures (numerics_fast.c's careful loop), as the host judge computes them."""
    o = out.astype(np.float64) if out.dtype != np.float32 else out
    lib = numerics._library()
    assert lib is not None, "the judge's one-pass helper did not build"
    st = numerics._Stats()
    fn = lib.kf_compare_f32 if o.dtype == np.float32 else lib.kf_compare_f64
    ptr = ctypes.c_float if o.dtype == np.float32 else ctypes.c_double
    fn(o.ctypes.data_as(ctypes.POINTER(ptr)), ref.ctypes.data_as(ctypes.POINTER(ctypes.c_double)), o.size, atol,
       rtol, ctypes.byref(st))
    return {field[0]: getattr(st, field[0]) for field in numerics._Stats._fields_}


def _dist(kind: str, a: float, b: float, neg_inf: float):
    from kfactory.problems.spec import Distribution
    fields = {"normal": {"mean": a, "std": b}, "uniform": {"low": a, "high": b}, "constant": {"value": a}}[kind]
    return Distribution(kind=kind, neg_inf_fraction=neg_inf, **fields)

"""The engine's GEMM prefill (EngineDesign.prefill = "gemm", kfactory/engines/c/matmul.c) on tiny-llama: it verifies
for both weight formats and both layouts, on 1 and 2 threads; prompt lengths chosen to hit every tail of its
blocking (a 16-token tile cut to 9..15 tokens, one cut to at most 8, a chunk left to the tiled kernels, panels of 6
rows past a matrix's last row) verify too; a variant that breaks the GEMM's second token vector fails exactly
where the GEMM runs; the field keeps the ids of designs that existed before it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from kfactory.engines.build import build
from kfactory.engines.codegen import defines, generate
from kfactory.engines.design import DesignError, EngineDesign
from kfactory.engines.verify import TOLERANCE, TINY_GREEDY_PROMPTS, Plan, Verifier

#: the GEMM over q4_1 and f32 weights, each prepacked and in the file's order; one on 2 threads
DESIGNS = [
    EngineDesign(),
    EngineDesign(prepack=False, threads=2),
    EngineDesign(weights="f32"),
    EngineDesign(weights="f32", prepack=False, fuse_qkv=False, fuse_gate_up=False),
]
TILED = EngineDesign(prefill="tiled")
#: prompt lengths, each prefilled with every position's logits (tiny-llama: rows 32, 64, 128, 256, 300, none a
#: multiple of 6 but 300). 11: below the GEMM's 12 tokens (the tiled kernels); 12: one tile of 16, 4 tokens
#: padding; 25: a full tile and one of 9; 101: a chunk of 64 (4 full tiles), then 37 (2 full tiles and 5 tokens:
#: the one-vector kernel); 203: three chunks of 64 and a last chunk of 11 on the tiled kernels
TAIL_LENGTHS = (11, 12, 25, 101, 203)
#: a test-only variant: every tile through the one-vector kernel, so a tile's tokens 8..15 are never computed
#: (a pair of full tiles, on AVX-512, is computed, then cleared and overwritten by the broken kernel's first tile)
BROKEN_SECOND_VECTOR = ("if (!pair) gemm_kernel(panel, xt, cols, nt > 8 ? 2 : 1, out[0]);",
                        "pair = 0;\n        memset(out[0], 0, sizeof out[0]);\n"
                        "        gemm_kernel(panel, xt, cols, 1, out[0]);")
#: a test-only variant: the matmul scratch filled with NaN at creation (fresh memory may hold any bits), which a
#: kernel that reads scratch it did not write turns into NaN logits
POISON_ANCHOR = "  e->xs = (float *)malloc(matmul_scratch_floats(KF_CHUNK, threads) * 4);\n"
POISON = POISON_ANCHOR + ("  if (e->xs) for (size_t i_ = 0; i_ < matmul_scratch_floats(KF_CHUNK, threads); i_++) "
                          "e->xs[i_] = NAN;\n")
SCALAR_FLAGS = ("-mno-avx2", "-mno-fma", "-mno-f16c")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="module")
def verifier(root):
    return Verifier("tiny-llama", cache_dir=root / "models", reference_dir=root / "reference")


@pytest.fixture(scope="module")
def tails(root, verifier):
    """A verifier whose plan is TAIL_LENGTHS and one short greedy run (the same model and reference cache)."""
    plan = Plan(TAIL_LENGTHS, 4, 16, TINY_GREEDY_PROMPTS[:1])
    return Verifier("tiny-llama", cache_dir=root / "models", reference_dir=root / "reference", plan=plan)


@pytest.fixture(scope="module")
def libs(verifier, tmp_path_factory):
    """The designs, the broken variant and the GEMM design compiled without AVX2, built two at a time."""
    out = tmp_path_factory.mktemp("so")
    config = verifier.model.config
    sources = {d.design_id(): (generate(d, config), ()) for d in DESIGNS}
    src = generate(DESIGNS[0], config)
    old, new = BROKEN_SECOND_VECTOR
    assert src.count(old) == 1, "the broken variant's anchor is not in the generated source"
    sources["broken"] = (src.replace(old, new), ())
    sources["scalar"] = (src, SCALAR_FLAGS)
    for design in (DESIGNS[0], TILED):
        src = generate(design, config)
        assert src.count(POISON_ANCHOR) == 1, "the poisoned variant's anchor is not in the generated source"
        sources[f"poisoned-{design.prefill}"] = (src.replace(POISON_ANCHOR, POISON), ())
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(sources, pool.map(lambda k: build(sources[k][0], out, sources[k][1]), sources)))
    for key, res in results.items():
        assert res.ok, f"{key} did not build:\n{res.log}"
    return {key: res.path for key, res in results.items()}


@pytest.mark.parametrize("design", DESIGNS, ids=[d.design_id() for d in DESIGNS])
def test_gemm_design_passes_verification(verifier, libs, design):
    verdict = verifier.verify(design, libs[design.design_id()])
    assert verdict.passed, verdict.summary()
    assert [c.steps for c in verdict.checks] == [1, 4, 7, 4, 100, 4, 244, 4, 64, 64, 64]
    for c in verdict.checks:
        assert c.max_err < TOLERANCE / 4, c       # fp32 rounding: measured ~3e-6, the tiled kernels' figure


@pytest.mark.parametrize("key", [DESIGNS[0].design_id(), DESIGNS[1].design_id(), DESIGNS[3].design_id(),
                                 "scalar"])
def test_every_tail_of_the_blocking_verifies(tails, libs, key):
    design = DESIGNS[0] if key == "scalar" else next(d for d in DESIGNS if d.design_id() == key)
    verdict = tails.verify(design, libs[key])
    assert verdict.passed, verdict.summary()
    assert [c.name for c in verdict.checks if c.name.startswith("prefill")] == [f"prefill_{n}" for n in TAIL_LENGTHS]
    assert max(c.max_err for c in verdict.checks) < TOLERANCE / 4


def test_a_broken_gemm_fails_where_the_gemm_runs(tails, libs):
    verdict = tails.verify(DESIGNS[0], libs["broken"])
    assert not verdict.passed and verdict.fault is None
    # 11 tokens run the tiled kernels: untouched by the break
    assert verdict.check("prefill_11").passed
    # 12 tokens are one tile: its tokens 0..7 come from the first vector, token 8 is the first one lost
    first = verdict.check("prefill_12")
    assert not first.passed and first.first_failing_step == 8 and first.max_err > 100 * TOLERANCE
    # 25 tokens: a full tile (tokens 8..15 lost) and one of 9 (token 24 lost): token 8 fails first
    assert verdict.check("prefill_25").first_failing_step == 8
    # 101 tokens: the first chunk's full tiles lose their second halves, from token 8 on
    assert verdict.check("prefill_101").first_failing_step == 8


def test_prefill_field_keeps_ids_and_refuses_bad_values(verifier):
    # the default (gemm) is left out of the hash: the ids recorded before the field existed still name them
    assert EngineDesign().design_id() == "q4_1-fqgn-t1-head-pp-108b65c0ab"
    tiled = EngineDesign(prefill="tiled")
    assert tiled.design_id().startswith("q4_1-fqgn-t1-head-pp-tiled-")
    assert tiled.design_id() != EngineDesign().design_id()
    assert EngineDesign.from_dict(tiled.as_dict()) == tiled
    assert EngineDesign.from_dict({"weights": "f32"}).prefill == "gemm"
    with pytest.raises(DesignError, match="prefill 'blas' is not one of gemm, tiled"):
        EngineDesign(prefill="blas")
    config = verifier.model.config
    assert defines(EngineDesign(), config)["KF_PREFILL_GEMM"] == "1"
    assert defines(tiled, config)["KF_PREFILL_GEMM"] == "0"


@pytest.mark.parametrize("prefill", ["gemm", "tiled"])
def test_no_kernel_reads_scratch_it_did_not_write(tails, libs, prefill):
    # the tiled kernels once took a Q8_0 matrix's "m * block sum" (m = 0) from block sums never taken for it:
    # tiny-llama's ffn_down is Q8_0 with more blocks per row than the Q4_1 products that fill the sums
    verdict = tails.verify(DESIGNS[0] if prefill == "gemm" else TILED, libs[f"poisoned-{prefill}"])
    assert verdict.passed, verdict.summary()

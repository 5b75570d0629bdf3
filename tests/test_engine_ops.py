"""Searched op kernels linked into an engine (kfactory/engines/ops.py) on tiny-llama: a kernel of the matvec
problems' ABI replaces the engine's own decode matvec and the engine still matches the float64 reference token
for token; a kernel that dequantises wrongly makes the engine fail verification; flags off the cpu whitelist are
refused before any compiler runs; a campaign given kernels pairs the design that links them with the same design
on the engine's own kernels, and its best.json is enough to rebuild the winner."""
from __future__ import annotations

import json

import pytest

from kfactory.engines.campaign import Campaign, load_best
from kfactory.engines.design import BUILTIN, DesignError, EngineDesign
from kfactory.engines.ops import OpKernel, OpKernelError, build_engine, kernels_of, units_for
from kfactory.engines.verify import Verifier

# A plain kernel of each problem's ABI, written here as a user would hand one in. Its static helpers are named
# like the engine's own (`dot`, `f16`): the kernel is its own translation unit, so they do not collide.
Q4_1 = r"""
#include <stdint.h>
#include <string.h>
static float f16(const uint8_t *p) {
  uint16_t h; memcpy(&h, p, 2);
  uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023, bits;
  if (e == 0) { float v = (float)m / 16777216.0f; return s ? -v : v; }
  bits = e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112) << 23) | (m << 13);
  float f; memcpy(&f, &bits, 4); return f;
}
static float dot(const uint8_t *b, const float *x) {
  float d = f16(b), m = f16(b + 2), s = 0.0f;
  for (int j = 0; j < 16; j++) {
    s += (d * (float)(b[4 + j] & 15) + m) * x[j];
    s += (d * (float)(b[4 + j] >> 4) + m) * x[j + 16];
  }
  return s;
}
void kernel(const uint8_t *w, const float *x, float *y, int64_t rows, int64_t blocks) {
  for (int64_t r = 0; r < rows; r++) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; b++) acc += dot(w + (r * blocks + b) * 20, x + 32 * b);
    y[r] = acc;
  }
}
"""
Q8_0 = Q4_1.split("static float dot")[0] + r"""
static float dot(const uint8_t *b, const float *x) {
  float d = f16(b), s = 0.0f;
  for (int j = 0; j < 32; j++) s += d * (float)(int8_t)b[2 + j] * x[j];
  return s;
}
void kernel(const uint8_t *w, const float *x, float *y, int64_t rows, int64_t blocks) {
  for (int64_t r = 0; r < rows; r++) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; b++) acc += dot(w + (r * blocks + b) * 34, x + 32 * b);
    y[r] = acc;
  }
}
"""
ID4, ID8 = "a4" * 32, "b8" * 32


def kernels(q4_source: str = Q4_1) -> dict[str, OpKernel]:
    return {"matvec_q4_1": OpKernel("matvec_q4_1", ID4, q4_source, "-O2"),
            "matvec_q8_0": OpKernel("matvec_q8_0", ID8, Q8_0, "-O2")}


SEARCHED = EngineDesign(prepack=False, matvec_q4_1=ID4, matvec_q8_0=ID8)


def test_a_design_names_its_kernels_and_refuses_what_they_cannot_read():
    # the engine's own kernels keep the ids designs had before the kernel fields existed
    assert EngineDesign().design_id() == "q4_1-fqgn-t1-head-pp-108b65c0ab"
    assert SEARCHED.searched_kernels() == {"matvec_q4_1": ID4, "matvec_q8_0": ID8}
    assert "-m4-m8-" in SEARCHED.design_id() and SEARCHED.design_id() != EngineDesign(prepack=False).design_id()
    # prepacked, the matrices a searched kernel reads stay in rows and the others are packed
    mixed = EngineDesign(matvec_q8_0=ID8)
    assert (mixed.layout_of("Q8_0"), mixed.layout_of("Q4_1"), SEARCHED.layout_of("Q4_1")) == ("rows", "pack4", "rows")
    with pytest.raises(DesignError, match="weights 'q4_1'"):
        EngineDesign(weights="f32", prepack=False, matvec_q8_0=ID8)
    with pytest.raises(DesignError, match="candidate id"):
        EngineDesign(prepack=False, matvec_q4_1="../../etc")
    assert EngineDesign.from_dict(SEARCHED.as_dict()) == SEARCHED


def test_flags_off_the_whitelist_and_unknown_ops_are_refused_before_a_compiler_runs():
    with pytest.raises(OpKernelError, match="-wrapper"):
        OpKernel("matvec_q4_1", ID4, Q4_1, "-O2 -wrapper /bin/sh").unit()
    with pytest.raises(OpKernelError, match="not an op"):
        OpKernel("softmax", ID4, Q4_1, "-O2").unit()
    with pytest.raises(OpKernelError, match="no identifier 'kernel'"):
        OpKernel("matvec_q4_1", ID4, Q4_1.replace("void kernel", "void entry"), "-O2").unit()
    with pytest.raises(OpKernelError, match="sandbox rule"):
        OpKernel("matvec_q4_1", ID4, "#include <stdio.h>\n" + Q4_1, "-O2").unit()
    # a design naming a kernel that was not handed over is refused, not built with the engine's own
    with pytest.raises(OpKernelError, match="not among the kernels"):
        units_for(SEARCHED, {"matvec_q4_1": kernels()["matvec_q4_1"]})


def test_an_engine_with_searched_kernels_matches_the_reference(root, verifier):
    lib = build_engine(SEARCHED, verifier.model.config, kernels(), root / "engines")
    assert lib.ok, lib.log
    verdict = verifier.verify(SEARCHED, lib.path)
    assert verdict.passed, verdict.first_failure
    assert max(c.max_err for c in verdict.checks) <= 1e-4


@pytest.mark.parametrize("design", [EngineDesign(matvec_q8_0=ID8), EngineDesign(matvec_q4_1=ID4)],
                         ids=["q8_0-rows-q4_1-pack4", "q4_1-rows-q8_0-pack4"])
def test_a_prepacked_engine_with_one_searched_kernel_keeps_that_formats_rows_and_verifies(root, verifier, design):
    from kfactory.engines.prepare import prepare

    layouts = {(t.format, t.layout) for t in prepare(verifier.model, design) if t.rows > 1}
    searched = "Q8_0" if design.matvec_q8_0 != BUILTIN else "Q4_1"
    assert {lay for fmt, lay in layouts if fmt == searched} == {"rows"}
    assert {lay for fmt, lay in layouts if fmt != searched and fmt != "F32"} == {"pack4"}
    lib = build_engine(design, verifier.model.config, kernels(), root / "engines")
    assert lib.ok, lib.log
    verdict = verifier.verify(design, lib.path)
    assert verdict.passed, verdict.first_failure


def test_a_kernels_other_globals_are_made_local_so_they_cannot_interpose(root, verifier):
    # a global helper with the name of an engine entry point: linked as it is, it would be a duplicate
    # definition; made local, the engine keeps its own and still verifies
    hijack = Q4_1 + "int kf_position(void *p) { (void)p; return 12345; }\n"
    lib = build_engine(SEARCHED, verifier.model.config, kernels(hijack), root / "engines")
    assert lib.ok, lib.log
    verdict = verifier.verify(SEARCHED, lib.path)
    assert verdict.passed, verdict.first_failure


def test_a_kernel_that_dequantises_wrongly_fails_the_engine(root, verifier):
    # the nibbles swapped: element j read from the high nibble, j + 16 from the low one
    swapped = Q4_1.replace("b[4 + j] & 15", "B_HI").replace("b[4 + j] >> 4", "b[4 + j] & 15") \
                  .replace("B_HI", "b[4 + j] >> 4")
    assert swapped != Q4_1
    lib = build_engine(SEARCHED, verifier.model.config, kernels(swapped), root / "engines")
    assert lib.ok, lib.log
    verdict = verifier.verify(SEARCHED, lib.path)
    assert not verdict.passed
    # decode steps use the kernel (prefill of several tokens does not): the first failure is a decode step
    assert verdict.first_failure is not None and verdict.first_failure.max_err > 1e-4


def test_a_campaign_pairs_searched_kernels_with_the_engines_own_and_best_json_rebuilds(root, verifier):
    # no jump: the order under test is the neighbourhood's, whatever the kernels' timings say
    campaign = Campaign("tiny-llama", 3, data_dir=root, verifier=verifier, kernels=kernels(), jump=0.0)
    pool = campaign.designs()
    # every q4_1 design with each set of the kernels; an f32 design links none (a kernel reads Q4_1/Q8_0 blocks)
    assert EngineDesign(prepack=False, fuse_norm=False, matvec_q8_0=ID8) in pool
    assert EngineDesign(kv_layout="token_major", matvec_q4_1=ID4, matvec_q8_0=ID8) in pool
    assert not any(d.searched_kernels() for d in pool if d.weights == "f32")
    record = campaign.run()
    # the search tries each searched kernel first, alone, against the engine's own
    assert [EngineDesign.from_dict(r["design"]) for r in record["results"]] == [
        EngineDesign(), EngineDesign(matvec_q4_1=ID4), EngineDesign(matvec_q8_0=ID8)]
    assert [r["verdict"] for r in record["results"]] == ["verified"] * 3
    assert record["kernels"]["matvec_q4_1"]["source"] == Q4_1
    # each kernel's effect rests on a pair that differs in that kernel only
    for field, cid in (("matvec_q4_1", ID4), ("matvec_q8_0", ID8)):
        effect = record["effects"][field]
        assert effect["baseline"] == BUILTIN and effect["values"][json.dumps(cid)]["pairs"] == 1
    best = load_best("tiny-llama", root)
    design = EngineDesign.from_dict(best["design"])
    assert set(best["kernels"]) == set(design.searched_kernels())
    # best.json alone rebuilds the winner: the same object as the campaign built (a cache hit)
    again = build_engine(design, verifier.model.config, kernels_of(best), root / "engines")
    winner = next(r for r in record["results"] if r["design_id"] == best["design_id"])
    assert again.cached and str(again.path) == winner["library"]


class OnlySearched(Campaign):
    """A campaign of the one design that links both kernels (so it is the winner an export takes)."""

    def designs(self) -> list[EngineDesign]:
        return [SEARCHED]


def test_an_engine_with_searched_kernels_exports_and_runs_without_kfactory(tmp_path, monkeypatch):
    import subprocess
    import sys

    from test_engine_export import CHILD, NAME, PROMPT

    from kfactory.cli.main import main
    from kfactory.models import Reference

    data = tmp_path / "data"
    verifier = Verifier("tiny-llama", cache_dir=data / "models", reference_dir=data / "engines" / "reference")
    record = OnlySearched("tiny-llama", 1, data_dir=data, verifier=verifier, kernels=kernels()).run()
    assert record["best"]["design_id"] == SEARCHED.design_id()
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    out = tmp_path / "export"
    assert main(["export", "tiny-llama", "--format", "python", "--name", NAME, "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    # each kernel compiled on its own and localised, then linked: the manifest's steps, the Makefile's rules
    assert [s[0] for s in manifest["build"]["steps"]] == ["{cc}", "objcopy", "{cc}", "objcopy", "{cc}"]
    assert (out / f"{NAME}_op0.c").is_file() and f"{NAME}_op1.o:" in (out / "Makefile").read_text()
    proc = subprocess.run([sys.executable, "-I", "-c", CHILD, str(out), PROMPT, "16", str(tmp_path / "l.npy")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    eos = verifier.model.tokenizer.eos_id
    assert got["tokens"] == Reference.from_model(verifier.model).generate(got["ids"], 16, stop=[eos]).tokens
    # the library exports the engine's ABI only: the kernels' entries are hidden
    nm = subprocess.run(["nm", "-D", "--defined-only", str(out / f"lib{NAME}.so")], capture_output=True, text=True)
    assert not [ln for ln in nm.stdout.splitlines() if "kf_op_" in ln]
    make = subprocess.run(["make", "-C", str(out), f"{NAME}_example"], capture_output=True, text=True, timeout=600)
    assert make.returncode == 0, make.stderr

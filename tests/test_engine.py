"""Generated inference engines (kfactory/engines) on tiny-llama: several designs generated, built and verified
against the float64 reference; engines broken on purpose (RoPE on the wrong pairs, the wrong head grouping) fail
the check they break, at the step they break it; an engine that segfaults or hangs is a typed fault and the
parent carries on."""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
from structlog.testing import capture_logs

import kfactory.engines.build as engine_build
from kfactory.engines.build import build, compiler
from kfactory.engines.codegen import generate
from kfactory.engines.design import DesignError, EngineDesign, q4_decodes_offered, space
from kfactory.engines.prepare import arena, pack16, prepare
from kfactory.engines.runner import EngineCrashed, EngineRunner, EngineTimeout, HarnessError
from kfactory.engines.verify import TOLERANCE, Verifier
from kfactory.models.quant import blocks
from kfactory.platform.config import Settings
from kfactory.targets import get_target
from kfactory.targets.cpu.ceiling import probe_library

VNNI = "vnni" in q4_decodes_offered()

#: together: q4_1 and f32 weights, fused and separate matvecs and norms, 1 and 2 threads, both KV layouts,
#: prepacked and GGUF-ordered weights, and every op on one thread of two (op_threads) as well as on both
DESIGNS = [
    EngineDesign(),
    EngineDesign(weights="q4_1", fuse_qkv=False, fuse_gate_up=False, fuse_norm=False, threads=2,
                 kv_layout="token_major", prepack=False, op_threads="qkv=1,attn=1"),
    EngineDesign(weights="f32", threads=2, prepack=False, op_threads="o=1,gate_up=1,down=1,head=1"),
    EngineDesign(weights="f32", fuse_qkv=False, fuse_gate_up=False, fuse_norm=False, kv_layout="token_major"),
    # the table decode of Q4_1 (with AVX-512; elsewhere the same 256-bit kernel as the default's)
    EngineDesign(q4_decode="table"),
    # the integer decodes over PACK16 (AVX512-VNNI only: their build refuses other processors), on 2 threads
    # (tiny-llama's products fall below KF_PAR_MIN: test_vnni24_groups_split_over_threads lowers it, on 3)
    *([EngineDesign(q4_decode="vnni", threads=2, fuse_qkv=False),
       EngineDesign(q4_decode="vnni24", threads=2, wait="bounded", fuse_gate_up=False)] if VNNI else []),
    # a decode step in one parallel region (team "step"), separate matvecs and norms, one op on one thread
    EngineDesign(fuse_qkv=False, fuse_gate_up=False, fuse_norm=False, threads=2, wait="bounded",
                 kv_layout="token_major", op_threads="attn=1", team="step"),
    *([EngineDesign(q4_decode="vnni24", threads=2, wait="bounded", team="step")] if VNNI else []),
]

#: test-only variants: a text replacement in the generated source, which must match exactly once
BROKEN = {
    # NeoX-style halves instead of GGUF's adjacent pairs
    "rope_pairs": ("#define KF_PAIR(i) (2 * (i))\n#define KF_MATE(i) (2 * (i) + 1)",
                   "#define KF_PAIR(i) (i)\n#define KF_MATE(i) ((i) + KF_HEAD_DIM / 2)"),
    # query head h on kv head h % kv_heads instead of h / group
    "head_grouping": ("#define KF_KV_OF(h) ((h) / KF_GROUP)", "#define KF_KV_OF(h) ((h) % KF_KV_HEADS)"),
}

#: 3 threads over tiny-llama's 2 key/value heads: a decode step's attention splits each head's context in 3 parts
#: and merges them (forward.c's attention). Tiny-llama's products all fall below the bound for running in
#: parallel, so the variants lower it to 0; "split_unnormalised" also leaves out the merge's division by the
#: parts' rescaled sums of exp.
SPLIT_DESIGN = EngineDesign(threads=3, wait="bounded")
SPLIT = {
    "split": [("#define KF_PAR_MIN 32768.0", "#define KF_PAR_MIN 0.0")],
    "split_unnormalised": [("#define KF_PAR_MIN 32768.0", "#define KF_PAR_MIN 0.0"),
                           ("    out[d] = o / l;", "    out[d] = o;")],
}

#: vnni24 on 3 threads with every product in parallel: each thread's share of a matrix's 16-row groups in two
#: streams, shares of odd length (an odd group alone) and the head's last group partial (tiny-llama's 300 rows)
VNNI24_SPLIT_DESIGN = EngineDesign(q4_decode="vnni24", threads=3, wait="bounded")
VNNI24_SPLIT = {"vnni24_split": [("#define KF_PAR_MIN 32768.0", "#define KF_PAR_MIN 0.0")]} if VNNI else {}

#: an engine library of the right ABI whose calls fault: a segfault in prefill, an endless decode step
FAULTY = r"""
#include <stdint.h>
#include <stddef.h>
static int dummy;
void *kf_engine_new(const void *t, int n, const void *c, int ctx, int th) { return &dummy; }
int kf_prefill(void *e, const int32_t *tok, int n, float *l, int all) { return *(volatile int *)NULL; }
int kf_decode_step(void *e, int32_t tok, float *l) { for (volatile int i = 0;; i++) {} return 0; }
void kf_reset(void *e) {}
int kf_position(void *e) { return 0; }
void kf_engine_free(void *e) {}
int kf_abi_version(void) { return 1; }
const char *kf_design_id(void) { return "faulty"; }
const char *kf_last_error(void) { return ""; }
"""


SCALAR_FLAGS = ("-mno-avx2", "-mno-fma", "-mno-f16c")


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    return Verifier("tiny-llama", cache_dir=root / "models", reference_dir=root / "reference")


@pytest.fixture(scope="module")
def libs(verifier, tmp_path_factory):
    """Every library the tests run, built two at a time: the designs, the broken variants, the faulty one."""
    out = tmp_path_factory.mktemp("so")
    config = verifier.model.config
    sources = {d.design_id(): generate(d, config) for d in DESIGNS}
    variants = {**{name: (DESIGNS[0], [edit]) for name, edit in BROKEN.items()},
                **{name: (SPLIT_DESIGN, edits) for name, edits in SPLIT.items()},
                **{name: (VNNI24_SPLIT_DESIGN, edits) for name, edits in VNNI24_SPLIT.items()}}
    for name, (design, edits) in variants.items():
        src = generate(design, config)
        for old, new in edits:
            assert src.count(old) == 1, f"the {name} variant's anchor {old!r} is not in the generated source"
            src = src.replace(old, new)
        sources[name] = src
    sources["faulty"] = FAULTY
    flags = {key: () for key in sources}
    # the portable path: the first design compiled without AVX2, FMA and F16C (no intrinsics at all)
    sources["scalar"], flags["scalar"] = sources[DESIGNS[0].design_id()], SCALAR_FLAGS
    # the 256-bit decode kernels: on a host with AVX-512 the default build takes the 512-bit ones instead
    sources["avx2"], flags["avx2"] = sources[DESIGNS[0].design_id()], ("-mno-avx512f",)
    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(sources, pool.map(lambda k: build(sources[k], out, flags[k]), sources)))
    for key, res in results.items():
        assert res.ok, f"{key} did not build:\n{res.log}"
    return {key: res.path for key, res in results.items()}


@pytest.mark.parametrize("design", DESIGNS, ids=[d.design_id() for d in DESIGNS])
def test_design_passes_verification(verifier, libs, design):
    verdict = verifier.verify(design, libs[design.design_id()])
    assert verdict.passed, verdict.summary()
    names = [c.name for c in verdict.checks]
    assert names == ["prefill_1", "decode_after_1", "prefill_7", "decode_after_7", "prefill_100",
                     "decode_after_100", "prefill_244", "long_context_244", "greedy_0", "greedy_1", "greedy_2"]
    # every position of every prompt, 4 steps after each, 64 greedy tokens per prompt
    assert [c.steps for c in verdict.checks] == [1, 4, 7, 4, 100, 4, 244, 4, 64, 64, 64]
    for c in verdict.checks:
        assert c.max_err < TOLERANCE / 4, c       # fp32 rounding: measured 1e-7..4e-6, far below the tolerance
    for i in range(3):
        assert verdict.check(f"greedy_{i}").detail == "64 tokens identical"


@pytest.mark.parametrize("build_name", ["scalar", "avx2"])
def test_portable_paths_pass_verification(verifier, libs, build_name):
    verdict = verifier.verify(DESIGNS[0], libs[build_name])
    assert verdict.passed, verdict.summary()
    assert max(c.max_err for c in verdict.checks) < TOLERANCE / 4


def test_rope_on_the_wrong_pairs_fails(verifier, libs):
    verdict = verifier.verify(DESIGNS[0], libs["rope_pairs"])
    assert not verdict.passed and verdict.fault is None
    # position 0 rotates by angle 0, so any pairing is right there: the first wrong step is position 1
    assert verdict.check("prefill_1").passed
    first = verdict.first_failure
    assert first is not None and (first.name, first.first_failing_step) == ("decode_after_1", 0)
    assert first.max_err > 100 * TOLERANCE
    assert verdict.check("prefill_7").first_failing_step == 1


def test_wrong_head_grouping_fails(verifier, libs):
    verdict = verifier.verify(DESIGNS[0], libs["head_grouping"])
    assert not verdict.passed and verdict.fault is None
    # query head 1 reads key/value head 1 instead of 0: wrong from the first token
    first = verdict.first_failure
    assert first is not None and (first.name, first.first_failing_step) == ("prefill_1", 0)
    assert first.max_err > 100 * TOLERANCE
    assert not any(verdict.check(f"greedy_{i}").passed for i in range(3))


def test_split_decode_attention_passes(verifier, libs):
    verdict = verifier.verify(SPLIT_DESIGN, libs["split"])
    assert verdict.passed, verdict.summary()
    assert max(c.max_err for c in verdict.checks) < TOLERANCE / 4


@pytest.mark.skipif(not VNNI, reason="the integer decode needs AVX512-VNNI")
def test_vnni24_groups_split_over_threads(verifier, libs):
    verdict = verifier.verify(VNNI24_SPLIT_DESIGN, libs["vnni24_split"])
    assert verdict.passed, verdict.summary()
    assert max(c.max_err for c in verdict.checks) < TOLERANCE / 4
    assert all(verdict.check(f"greedy_{i}").detail == "64 tokens identical" for i in range(3))


def test_split_attention_without_its_normaliser_fails(verifier, libs):
    verdict = verifier.verify(SPLIT_DESIGN, libs["split_unnormalised"])
    assert not verdict.passed and verdict.fault is None
    # prefill attends without splitting and decode splits from 64 positions (KF_SPLIT_MIN): the steps after 1
    # and 7 tokens pass, and the first step after 100 is wrong
    assert all(verdict.check(name).passed for name in ("prefill_1", "decode_after_1", "prefill_7", "decode_after_7",
                                                       "prefill_100"))
    first = verdict.first_failure
    assert first is not None and (first.name, first.first_failing_step) == ("decode_after_100", 0)
    assert first.max_err > 100 * TOLERANCE


def test_segfault_is_a_typed_fault_and_the_parent_survives(verifier, libs):
    verdict = verifier.verify(DESIGNS[0], libs["faulty"])
    assert not verdict.passed
    assert verdict.fault_kind == "crashed" and "SIGSEGV" in (verdict.fault or "")
    assert verdict.checks[-1].name == "prefill_1" and not verdict.checks[-1].passed
    # this process is intact: the next engine verifies as before
    assert verifier.verify(DESIGNS[0], libs[DESIGNS[0].design_id()]).passed


def test_hang_is_a_timeout(verifier, libs):
    runner = EngineRunner(str(verifier.package.directory), DESIGNS[0], libs["faulty"], 16,
                          cache_dir=verifier.cache_dir, timeout_s=1.0)
    with runner:
        with pytest.raises(EngineTimeout, match="no answer within 1.0 s"):
            runner.decode(3)
        assert runner.proc is None                       # killed, not left running
        with pytest.raises(EngineCrashed):
            runner.start()
            runner.prefill([1, 2])


def test_paired_bursts_time_the_engine_between_read_probes(verifier, libs, tmp_path):
    """EngineRunner.paired: the read probe (the cpu target's, compiled here) before and after every burst at each
    thread count asked for, the bursts' steps timed, the engine left reset; what it cannot do is a HarnessError
    that says why (the child closed, as after any harness error; started again, it serves)."""
    probe = probe_library(get_target("cpu", Settings(data_dir=tmp_path, threads=2)))
    design = DESIGNS[0]
    with EngineRunner(str(verifier.package.directory), design, libs[design.design_id()], 16,
                      cache_dir=verifier.cache_dir) as runner:
        before = runner.prefill([1, 2, 3])
        runner.reset()
        figures = runner.paired(4, 3, 2, probe, 1 << 20, [1, 2])
        assert len(figures.reads_gbps) == 4 and all(len(r) == 2 and min(r) > 0 for r in figures.reads_gbps)
        assert [len(b) for b in figures.step_s] == [2, 2, 2] and min(min(b) for b in figures.step_s) > 0
        assert figures.read_around(1) == max(*figures.reads_gbps[1], *figures.reads_gbps[2])
        assert [figures.burst_context(b) for b in range(3)] == [4, 6, 8]
        assert np.array_equal(runner.prefill([1, 2, 3]), before)
        for args, says in [((8, 3, 4, probe, 1 << 20, [1]), "paired needs 20 positions; the engine holds 16"),
                           ((4, 1, 2, tmp_path / "missing.so", 1 << 20, [1]), "read probe .*missing.so"),
                           ((4, 0, 2, probe, 1 << 20, [1]), "at least 1 \\(got 4, 0, 2, \\[1\\]\\)")]:
            with pytest.raises(HarnessError, match=says):
                runner.paired(*args)
            runner.start()
            assert np.array_equal(runner.prefill([1, 2, 3]), before)


def test_compile_failure_is_a_result(tmp_path):
    res = build("int kf_engine_new(void) { return }\n", tmp_path)
    assert not res.ok and res.path is None and "error" in res.log


def test_a_damaged_cached_object_is_built_again(tmp_path, monkeypatch):
    """The build cache serves an object only while it is the one built: cut short, or cached before its digest
    was kept, it is compiled again (not loaded, where it would crash every engine that links it)."""
    monkeypatch.delenv("KFACTORY_ENGINE_OBJECT_CACHE", raising=False)   # the data directory's own cache alone
    source = "int kf_answer(void) { return 42; }\n"
    first = build(source, tmp_path)
    assert first.ok and not first.cached
    whole = first.path.read_bytes()
    again = build(source, tmp_path)
    assert again.cached and again.path == first.path
    first.path.write_bytes(whole[:1000])
    rebuilt = build(source, tmp_path)
    assert rebuilt.ok and not rebuilt.cached and rebuilt.path.read_bytes() == whole
    first.path.with_name(first.path.name + ".sha256").unlink()
    assert not build(source, tmp_path).cached
    assert build(source, tmp_path).cached


def test_data_directories_share_the_objects_of_the_hosts_cache(tmp_path, monkeypatch):
    """With Settings.engine_object_cache set, a build leaves its object there too, and another cache directory
    takes a copy instead of compiling (a compiler that fails everything proves it did not run); a damaged shared
    object is not copied but built again, and mended in the shared cache."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("KFACTORY_ENGINE_OBJECT_CACHE", str(shared))
    source = "int kf_answer(void) { return 41 + 1; }\n"
    first = build(source, tmp_path / "a")
    mine = shared / engine_build.native_tag(compiler())   # a directory per processor, as -march=native sees it
    assert first.ok and not first.cached and (mine / first.path.name).read_bytes() == first.path.read_bytes()
    assert (mine / first.path.name).stat().st_mode & 0o777 == 0o755   # other users of the host may load it
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho no compiler here >&2\nexit 1\n")
    cc.chmod(0o755)
    real = compiler()
    identity, native = engine_build._compiler_identity(real), engine_build.native_tag(real)
    monkeypatch.setenv("CC", str(cc))
    # the key and the shared directory name the compiler and its -march=native: the real one's, so that the fake
    # one's builds look where the real one's are
    monkeypatch.setattr(engine_build, "_compiler_identity", lambda c: identity)
    monkeypatch.setattr(engine_build, "native_tag", lambda c: native)
    copied = build(source, tmp_path / "b")
    assert copied.ok and copied.cached and copied.path.read_bytes() == first.path.read_bytes()
    assert copied.path.parent == tmp_path / "b" and (tmp_path / "b" / f"{copied.path.stem}.c").read_text() == source
    (mine / first.path.name).write_bytes(first.path.read_bytes()[:1000])
    assert not build(source, tmp_path / "c").ok   # damaged: not copied, so the (failing) compiler ran
    monkeypatch.setenv("CC", real)
    rebuilt = build(source, tmp_path / "d")
    assert rebuilt.ok and not rebuilt.cached
    assert (mine / first.path.name).read_bytes() == first.path.read_bytes()
    monkeypatch.delenv("KFACTORY_ENGINE_OBJECT_CACHE")
    assert not build(source, tmp_path / "e").cached   # unset: each directory builds its own


def test_a_shared_cache_others_may_write_to_is_not_used(tmp_path, monkeypatch):
    """An object someone else could plant in the shared cache would run as this user: a directory writable by
    its group or others is not used (the build goes on, with its data directory's cache alone), and the log says
    why and what to do. A copy into the shared cache that fails costs the build nothing either."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o775)
    shared.chmod(0o775)
    monkeypatch.setenv("KFACTORY_ENGINE_OBJECT_CACHE", str(shared))
    monkeypatch.setattr(engine_build, "_refuse_once", functools.lru_cache(engine_build._refuse_once.__wrapped__))
    with capture_logs() as logged:
        res = build("int kf_planted(void) { return 7; }\n", tmp_path / "a")
    mine = shared / engine_build.native_tag(compiler())
    assert res.ok and not res.cached and list(shared.iterdir()) == []   # nothing made in a refused directory
    assert any("writable by no one else (mode 775)" in e["event"] for e in logged), logged
    shared.chmod(0o755)
    mine.mkdir()
    mine.chmod(0o777)   # the processor's directory is asked too
    with capture_logs() as logged:
        assert not build("int kf_planted(void) { return 7; }\n", tmp_path / "a2").cached
    assert list(mine.iterdir()) == [] and any("(mode 777)" in e["event"] for e in logged), logged
    mine.chmod(0o755)
    # where the copy's digest would go stands a directory (a permission would not stop root): the copy fails
    (mine / f"{res.path.name}.sha256").mkdir()
    with capture_logs() as logged:
        again = build("int kf_planted(void) { return 7; }\n", tmp_path / "b")
    assert again.ok and not again.cached and again.path.name == res.path.name
    assert not (mine / res.path.name).exists()
    assert any(e["event"] == "an engine object could not be left in the shared cache" for e in logged), logged


def test_vnni_design_refuses_to_build_without_vnni(verifier, tmp_path):
    """The integer decode's build names what the processor lacks instead of running another kernel."""
    res = build(generate(EngineDesign(q4_decode="vnni"), verifier.model.config), tmp_path, ("-mno-avx512vnni",))
    assert not res.ok and "q4_decode vnni needs AVX512-VNNI" in res.log


def test_pack16_holds_the_q8_0_rows_blocks():
    """PACK16's Q8_0 bytes read back by the layout's rule give every row's scale and codes (stored + 128) in
    place, the padding rows zeros (scale 0, codes 128: a zero weight)."""
    rng = np.random.default_rng(6)
    rows, nb = 21, 2
    raw = rng.integers(0, 256, size=(rows, nb * 34), dtype=np.uint8)
    halves = rng.standard_normal((rows, nb)).astype(np.float16)
    raw.reshape(rows, nb, 34)[..., :2] = halves.view(np.uint8).reshape(rows, nb, 2)
    packed = pack16(raw, "Q8_0")
    assert packed.shape == (2, nb, 544)
    want = blocks(raw, "Q8_0")
    for r in range(32):
        g, i = divmod(r, 16)
        for b in range(nb):
            blk = packed[g, b]
            d = blk[:32].view(np.float16)[i]
            codes = blk[32:].reshape(8, 16, 4)[:, i, :].reshape(32).astype(np.int16) - 128   # element 4c + k
            if r >= rows:
                assert d == 0 and not codes.any()
                continue
            assert d == want["d"][r, b] and (codes == want["qs"][r, b]).all()


def test_pack16_holds_the_rows_blocks():
    """PACK16's bytes (prepare.pack16) read back by the layout's rule give every Q4_1 row's codes, scales and
    mins in place, the padding rows zeros."""
    rng = np.random.default_rng(5)
    rows, nb = 37, 3
    raw = rng.integers(0, 256, size=(rows, nb * 20), dtype=np.uint8)
    halves = rng.standard_normal((rows, nb, 2)).astype(np.float16)
    raw.reshape(rows, nb, 20)[..., :4] = halves.view(np.uint8).reshape(rows, nb, 4)
    packed = pack16(raw)
    assert packed.shape == (3, nb, 320)
    want = blocks(raw, "Q4_1")
    q = np.concatenate([want["qs"] & 15, want["qs"] >> 4], axis=-1)      # (rows, nb, 32) codes
    for r in range(48):
        g, i = divmod(r, 16)
        for b in range(nb):
            blk = packed[g, b]
            d, m = blk[:32].view(np.float16)[i], blk[32:64].view(np.float16)[i]
            lanes = blk[64:].reshape(4, 16, 4)[:, i, :]                     # [c][k]
            codes = np.stack([lanes & 15, lanes >> 4], axis=1).reshape(32)   # element 8c + 4 half + k
            if r >= rows:
                assert d == m == 0 and not codes.any()
                continue
            assert (d, m) == (want["d"][r, b], want["m"][r, b])
            assert (codes == q[r, b]).all()


def test_design_values_and_space():
    d = EngineDesign(threads=2, kv_layout="token_major")
    assert EngineDesign.from_dict(d.as_dict()) == d and d.design_id() == EngineDesign.from_dict(d.as_dict()).design_id()
    assert d.design_id() != EngineDesign().design_id()
    with pytest.raises(DesignError, match="q4_1, f32"):
        EngineDesign(weights="q8")
    with pytest.raises(DesignError, match="head_major, token_major"):
        EngineDesign(kv_layout="paged")
    with pytest.raises(DesignError, match="unknown design field.*fields: weights"):
        EngineDesign.from_dict({"wieghts": "f32"})
    with pytest.raises(DesignError, match="threads"):
        EngineDesign(threads=0)
    with pytest.raises(DesignError, match="spin applies to threads > 1"):
        EngineDesign(spin=True)
    with pytest.raises(DesignError, match="passive, bounded"):
        EngineDesign(threads=2, wait="busy")
    with pytest.raises(DesignError, match="applies to threads > 1 without spin"):
        EngineDesign(wait="bounded")
    with pytest.raises(DesignError, match="applies to threads > 1 without spin"):
        EngineDesign(threads=2, spin=True, wait="bounded")
    with pytest.raises(DesignError, match="op_threads applies to threads > 1"):
        EngineDesign(op_threads="attn=1")
    with pytest.raises(DesignError, match="write it as 'attn=1,o=1'"):
        EngineDesign(threads=2, op_threads="o=1,attn=1")
    with pytest.raises(DesignError, match=r"N must lie in 1\.\.1"):
        EngineDesign(threads=2, op_threads="attn=2")
    with pytest.raises(DesignError, match="op one of qkv, attn, o, gate_up, down, head"):
        EngineDesign(threads=2, op_threads="mlp=1")
    with pytest.raises(DesignError, match="names 'o' twice"):
        EngineDesign(threads=2, op_threads="o=1,o=1")
    split = EngineDesign(threads=4, op_threads="attn=1,head=2")
    assert split.op_thread_map() == {"attn": 1, "head": 2} and "-opa1h2-" in split.design_id()
    # moved to fewer threads, an entry at or above the new count goes: the op then runs on all of them
    assert split.at_threads(2).op_threads == "attn=1" and split.at_threads(1) == EngineDesign()
    points = space(2, avx512=False)
    # weights x 3 fusions x kv layouts x prepack, times (1 thread, and 2 threads sleeping, spinning or spinning
    # bounded, each with every op on both threads or one of the 7 op_threads choices), every 2-thread design
    # sharing a step in one region ("op" is there to compare against, not searched)
    assert len(points) == len(set(points)) == 2 * 2 * 2 * 2 * 2 * 2 * (1 + 3 * 8)
    assert {p.team for p in points if p.threads > 1} == {"step"}
    assert {p.team for p in points if p.threads == 1} == {"op"}
    assert len({p.design_id() for p in points}) == len(points)
    # with AVX-512 the prepacked Q4_1 quarter of them also comes with the table decode
    wide = space(2, avx512=True, vnni=False)
    assert len(wide) == len(set(wide)) == len(points) * 5 // 4 and set(points) < set(wide)
    assert {p for p in wide if p.q4_decode == "table"} == {replace(p, q4_decode="table") for p in points
                                                          if p.weights == "q4_1" and p.prepack}
    assert EngineDesign(q4_decode="table").design_id() == "q4_1-fqgn-t1-head-pp-table-0b40cc978e"
    # and with AVX512-VNNI, the integer decodes too; without AVX-512 neither, whatever vnni says
    widest = space(2, avx512=True, vnni=True)
    assert len(widest) == len(set(widest)) == len(points) * 7 // 4 and set(wide) < set(widest)
    for dec in ("vnni", "vnni24"):
        assert {p for p in widest if p.q4_decode == dec} == {replace(p, q4_decode=dec) for p in points
                                                            if p.weights == "q4_1" and p.prepack}
    assert space(2, avx512=False, vnni=True) == points
    assert EngineDesign(q4_decode="vnni").design_id().startswith("q4_1-fqgn-t1-head-pp-vnni-")
    with pytest.raises(DesignError, match="convert, table, vnni, vnni24"):
        EngineDesign(q4_decode="lut")
    for unpacked in ({"weights": "f32"}, {"prepack": False}, {"matvec_q4_1": "ab" * 8}):
        for dec in ("table", "vnni", "vnni24"):
            with pytest.raises(DesignError, match=f"q4_decode '{dec}' applies to weights 'q4_1' prepacked"):
                EngineDesign(q4_decode=dec, **unpacked)
    for dec in ("vnni", "vnni24"):
        with pytest.raises(DesignError, match=f"q4_decode '{dec}' needs prefill 'gemm', not 'tiled'"):
            EngineDesign(q4_decode=dec, prefill="tiled")
    # the integer decode's matrices are PACK16, the LM head's Q8_0 too, unless a searched kernel reads them
    vnni = EngineDesign(q4_decode="vnni")
    assert (vnni.layout_of("Q4_1"), vnni.layout_of("Q8_0"), EngineDesign().layout_of("Q8_0")) == \
        ("pack16", "pack16", "pack4")
    assert replace(vnni, matvec_q8_0="ab" * 6).layout_of("Q8_0") == "rows"
    # and the roofline counts integer work for exactly the formats in PACK16 (4 byte digits of x a weight)
    assert vnni.decode_int8() == {"q4_1": 4, "q8_0": 4} and EngineDesign().decode_int8() == {}
    assert replace(vnni, matvec_q8_0="ab" * 6).decode_int8() == {"q4_1": 4}
    # vnni24: the same layouts, 3 digits
    vnni24 = replace(vnni, q4_decode="vnni24")
    assert (vnni24.layout_of("Q4_1"), vnni24.layout_of("Q8_0")) == ("pack16", "pack16")
    assert vnni24.decode_int8() == {"q4_1": 3, "q8_0": 3}
    # the wait at its default stays out of the id: designs keep the ids they had before the field existed
    assert EngineDesign(threads=2).design_id() == "q4_1-fqgn-t2-head-pp-a42bba545e"
    bounded = EngineDesign(threads=2, wait="bounded")
    assert bounded.design_id().startswith("q4_1-fqgn-t2b-head-pp-")
    # what the engine's child runs under: libgomp's bounded spin, set explicitly; sleeping; spinning
    assert bounded.omp_env() == {"OMP_WAIT_POLICY": None, "GOMP_SPINCOUNT": "300000"}
    assert EngineDesign(threads=2).omp_env() == {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": None}
    assert EngineDesign(threads=2, spin=True).omp_env()["OMP_WAIT_POLICY"] == "active"
    # a design moved to one thread keeps nothing that waits; back on two it is the design it names
    assert bounded.at_threads(1) == EngineDesign() and bounded.at_threads(2) == bounded
    # a step in one region: threads > 1 only, named in the id, dropped on one thread
    step = replace(bounded, team="step")
    assert step.design_id().startswith("q4_1-fqgn-t2b-step-head-pp-") and step.at_threads(1) == EngineDesign()
    assert step.at_threads(3).team == "step"
    with pytest.raises(DesignError, match="team 'step' applies to threads > 1"):
        EngineDesign(team="step")
    with pytest.raises(DesignError, match="team 'steps' is not one of op, step"):
        EngineDesign(threads=2, team="steps")


@pytest.mark.parametrize("design", [EngineDesign(), EngineDesign(weights="f32", fuse_qkv=False, prepack=False)],
                         ids=["q4_1-pack", "f32-rows"])
def test_arena_holds_every_tensor_in_the_order_a_step_reads_them(verifier, design):
    """prepare.arena: the same tensors as prepare's (names, formats, layouts, bytes), one after another in one
    buffer at 64-byte boundaries, in the forward's order: each block's norm, attention matrices, norm and feed-forward
    matrices, then the final norm and the LM head."""
    model = verifier.model
    separate, packed = prepare(model, design), arena(model, design)
    assert [(t.name, t.format, t.layout, t.rows, t.cols) for t in packed] == \
        [(t.name, t.format, t.layout, t.rows, t.cols) for t in separate]
    assert all(np.array_equal(a.data.view(np.uint8), b.data.view(np.uint8)) for a, b in zip(packed, separate))
    starts = [t.data.ctypes.data for t in packed]
    assert all(s % 64 == 0 for s in starts) and starts == sorted(starts)
    assert all(b - a == -(-t.data.nbytes // 64) * 64 for a, b, t in zip(starts, starts[1:], packed))
    names = [t.name for t in packed]
    first = "blk.0.attn_q.weight" if not design.fuse_qkv else "blk.0.attn_qkv.weight"
    assert names[:3] == ["blk.0.attn_norm.weight", first, "blk.0.attn_k.weight" if not design.fuse_qkv
                         else "blk.0.attn_output.weight"]
    assert names[-2:] == ["output_norm.weight", "token_embd.weight"]

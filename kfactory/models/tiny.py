"""A tiny random-weights Llama written as a real GGUF file (through the `gguf` package's writer), so fast tests
and engine smoke runs go through the same loader, tokenizer and reference as the real model.

Its tokenizer is a byte-level BPE trained (with the `tokenizers` package) on a few English sentences: the 3
control tokens SmolLM2 starts with, the 256 byte tokens and merges up to the declared vocabulary size.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from kfactory.models.gguf_model import LlamaConfig
from kfactory.models.quant import quantize

#: the default tiny architecture (the same family as SmolLM2-135M: grouped heads, tied embeddings)
TINY = LlamaConfig(blocks=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, rope_base=10000.0,
                   rms_eps=1e-5, vocab=300, tied_embeddings=True, context_length=256)

#: the storage format of each kind of tensor: both quantised formats appear in matrix products
FORMATS = {"token_embd": "Q8_0", "output": "Q8_0", "ffn_down": "Q8_0", "attn_q": "Q4_1", "attn_k": "Q4_1",
           "attn_v": "Q4_1", "attn_output": "Q4_1", "ffn_gate": "Q4_1", "ffn_up": "Q4_1"}

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "In 2024 the small model said: hello, world! It is 7 o'clock, 2024-12-24.",
    "The cat sat on the mat, and the dog ate the bone by the door.",
    "What is the capital of France? The capital of France is Paris.",
    "Kernels run on the device; the host waits for them to finish.",
]

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def train_tokenizer(vocab: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of a byte-level BPE with `vocab` tokens, trained on CORPUS."""
    # here, not at the module's top: every engine child resolves tiny-llama's weights through this module, and
    # only the first, writing the file, trains a tokenizer
    from tokenizers import Tokenizer as HFTokenizer, models, pre_tokenizers, trainers

    hf = HFTokenizer(models.BPE())
    # trained without splitting digits, so the merges include digit pairs ("20", "24") that the file's "smollm"
    # pre-tokenizer (digits one by one) never lets apply: a tokenizer built without that split encodes numbers
    # differently, and the tests see it
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(CORPUS * 8, trainer)
    model = json.loads(hf.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))) or len(by_id) != vocab:
        raise ValueError(f"trained {len(by_id)} tokens, wanted ids 0..{vocab - 1}: enlarge the corpus")
    tokens = [t for t, _ in by_id]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges, [3 if t in SPECIALS else 1 for t in tokens]


def random_weights(config: LlamaConfig, seed: int) -> dict[str, np.ndarray]:
    """Float32 weights of every tensor, drawn so activations stay O(1) through the blocks (rows of W scaled by
    1/sqrt(fan-in), norm gains near 1). The embedding is small beside what the blocks add: with a large tied
    embedding the residual stream stays close to the input token's row and greedy generation repeats one
    token forever; at these scales (seed 0) it wanders over the vocabulary with a clear top-1 margin."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in config.expected_shapes().items():
        if len(shape) == 1:
            out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "token_embd.weight":
            out[name] = 0.3 * rng.standard_normal(shape)
        elif name == "output.weight":
            out[name] = rng.standard_normal(shape)
        else:
            out[name] = rng.standard_normal(shape) * (2.0 / np.sqrt(shape[1]))
    return {k: v.astype(np.float32) for k, v in out.items()}


def _kind(name: str) -> str:
    return name.split(".")[-2]


def write_tiny_gguf(path: Path | str, config: LlamaConfig = TINY, seed: int = 0,
                    formats: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    """Write a random-weights Llama of `config` to `path` (atomically: a reader never sees half a file).

    Returns the float32 weights before quantisation, by GGUF name, so a test can compare what it loads with
    what was written. Matrices are stored in `formats` (default FORMATS), vectors in F32."""
    formats = {**FORMATS, **(formats or {})}
    path = Path(path)
    tokens, merges, types = train_tokenizer(config.vocab)
    weights = random_weights(config, seed)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:16]}.", suffix=".tmp")
    os.close(fd)
    try:
        w = GGUFWriter(tmp, "llama")
        w.add_name(f"tiny-llama seed {seed}")
        w.add_context_length(config.context_length)
        w.add_embedding_length(config.hidden)
        w.add_block_count(config.blocks)
        w.add_feed_forward_length(config.ffn)
        w.add_head_count(config.heads)
        w.add_head_count_kv(config.kv_heads)
        w.add_rope_freq_base(config.rope_base)
        w.add_layer_norm_rms_eps(config.rms_eps)
        w.add_rope_dimension_count(config.head_dim)
        w.add_vocab_size(config.vocab)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)
        for name, value in weights.items():
            qtype = formats.get(_kind(name), "F32") if value.ndim == 2 else "F32"
            if qtype == "F32":
                w.add_tensor(name, value)
            else:
                w.add_tensor(name, quantize(value, qtype), raw_dtype=GGMLQuantizationType[qtype])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return weights

"""Torch eager through Hugging Face transformers, on the same weights: a `LlamaForCausalLM` in fp32 with eager
attention, built from the model's LlamaConfig and its dequantised GGUF tensors (what a user who converts the
file back to a transformers checkpoint runs).

GGUF's llama converter (llama.cpp's convert_hf_to_gguf.py, `permute(weights, n_head, n_head_kv)`) reorders the
rows of each q and k head so that RoPE rotates adjacent pairs (x[2i], x[2i+1]), llama.cpp's layout; transformers
rotates the two halves of a head (`rotate_half`: x[i] with x[i + d/2]). Loading into transformers therefore
undoes that permutation for attn_q (per query head) and attn_k (per key/value head): `unpermute`.

torch and transformers are imported only when an engine is built, so this module imports anywhere; where they
are missing, `load` raises NotImportable (the child turns it into a result with the reason).
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, Sequence

import numpy as np

from kfactory.engines.baselines.result import NotImportable
from kfactory.engines.baselines.roofline import Formats
from kfactory.models import GGUFModel, LlamaConfig, load_model

NAME = "torch-eager"
DEFAULT_STEPS = 32


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face row order -> GGUF's (the converter's permute): each head's rows (2, d/2) become (d/2, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF row order -> Hugging Face's: the inverse of `permute` (each head's rows (d/2, 2) back to (2, d/2))."""
    return np.ascontiguousarray(
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def hf_names(c: LlamaConfig) -> dict[str, tuple[str, int | None]]:
    """transformers parameter name -> (GGUF tensor name, heads to unpermute by or None)."""
    names: dict[str, tuple[str, int | None]] = {
        "model.embed_tokens.weight": ("token_embd.weight", None), "model.norm.weight": ("output_norm.weight", None)}
    if not c.tied_embeddings:
        names["lm_head.weight"] = ("output.weight", None)
    for i in range(c.blocks):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        names.update({
            hf + "input_layernorm.weight": (gg + "attn_norm.weight", None),
            hf + "self_attn.q_proj.weight": (gg + "attn_q.weight", c.heads),
            hf + "self_attn.k_proj.weight": (gg + "attn_k.weight", c.kv_heads),
            hf + "self_attn.v_proj.weight": (gg + "attn_v.weight", None),
            hf + "self_attn.o_proj.weight": (gg + "attn_output.weight", None),
            hf + "post_attention_layernorm.weight": (gg + "ffn_norm.weight", None),
            hf + "mlp.gate_proj.weight": (gg + "ffn_gate.weight", None),
            hf + "mlp.up_proj.weight": (gg + "ffn_up.weight", None),
            hf + "mlp.down_proj.weight": (gg + "ffn_down.weight", None)})
    return names


def _import_torch():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise NotImportable(f"torch and transformers are not importable by {sys.executable} ({e}); install "
                            "them (pip install torch transformers) or name an interpreter that has them") from e
    return torch, transformers


def build_hf(model: GGUFModel, threads: int) -> Any:
    """A transformers LlamaForCausalLM (fp32, eager attention, eval mode) holding the file's dequantised weights.
    Tensors are dequantised and copied in one at a time, so loading holds one spare tensor, not a second model."""
    torch, transformers = _import_torch()
    torch.set_num_threads(threads)
    c = model.config
    cfg = transformers.LlamaConfig(
        vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=c.ffn, num_hidden_layers=c.blocks,
        num_attention_heads=c.heads, num_key_value_heads=c.kv_heads, head_dim=c.head_dim,
        max_position_embeddings=c.context_length, rms_norm_eps=c.rms_eps, tie_word_embeddings=c.tied_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_base}, attention_bias=False, mlp_bias=False,
        hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "eager"
    hf = transformers.LlamaForCausalLM(cfg).to(torch.float32).eval()
    params = dict(hf.named_parameters())
    names = hf_names(c)
    missing = sorted(set(params) - set(names) - ({"lm_head.weight"} if c.tied_embeddings else set()))
    if missing:
        raise RuntimeError(f"transformers' LlamaForCausalLM has parameters this loader does not fill: {missing[:5]}")
    with torch.no_grad():
        for hf_name, (gguf_name, heads) in names.items():
            w = model.tensor(gguf_name).dequantize().astype(np.float32)
            params[hf_name].copy_(torch.from_numpy(unpermute(w, heads) if heads else w))
    if c.tied_embeddings and hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr():
        hf.lm_head.weight = hf.model.embed_tokens.weight            # tie, in case this version did not
    return hf


class TorchEager:
    """The transformers model behind the baselines' Engine protocol: batch 1, a DynamicCache, the logits of the
    last position only (logits_to_keep=1, as generation does)."""
    name = NAME
    weights_format = "f32"
    formats = Formats.uniform("f32")

    def __init__(self, model: GGUFModel, threads: int):
        self.torch, _ = _import_torch()
        self.config = model.config
        self.hf = build_hf(model, threads)
        self.past: Any = None
        # transformers 5 renamed past_key_values to cache (the old name warns on every call)
        self.cache_kw = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"

    def reset(self, capacity: int) -> None:
        self.past = None                                           # a DynamicCache grows as it goes

    def _run(self, tokens: Sequence[int], keep: int = 1):
        torch = self.torch
        with torch.inference_mode():
            out = self.hf(input_ids=torch.tensor([list(tokens)], dtype=torch.long), use_cache=True,
                          logits_to_keep=keep, **{self.cache_kw: self.past})
        self.past = getattr(out, self.cache_kw)
        return out.logits[0]

    def prefill(self, tokens: Sequence[int]) -> int:
        return int(self._run(tokens)[-1].argmax())

    def decode(self, token: int) -> int:
        return int(self._run([token])[-1].argmax())

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits (n, vocab) of every position of `tokens` from an empty cache (for checking against Reference)."""
        self.reset(len(tokens))
        return self._run(tokens, keep=0).float().numpy().astype(np.float64)


def load(model_name: str, threads: int) -> TorchEager:
    _import_torch()                                  # not importable: say so before opening the model
    return TorchEager(load_model(model_name).open(), threads)

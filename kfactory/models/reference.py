"""The float64 reference forward of the Llama family: the judge's truth for every engine.

Written for clarity, not speed: every op is a small function over float64 numpy arrays (the op problems of the
next step take their references from here), the forward is those ops in order, and the KV cache is two plain
arrays. Conventions, which an engine must match:

- weights are the dequantised tensors (GGUF names, numpy shapes (out, in): y = W @ x), converted to float64;
- RMSNorm: x / sqrt(mean(x^2) + eps) * w;
- RoPE on adjacent pairs (x[2i], x[2i+1]) of each head, angle pos * base^(-2i/head_dim): GGUF's llama layout
  (its converter permutes HF's q/k rows so that pairs are adjacent; llama.cpp's "normal" rope mode);
- grouped attention: query head h reads key/value head h // (heads / kv_heads); scores scaled by
  1/sqrt(head_dim); causal (a token sees itself and earlier positions);
- feed-forward: W_down (silu(W_gate x) * W_up x);
- logits: the final RMSNorm then the LM head (the embedding when tied);
- greedy generation takes np.argmax (the lowest id among equal maxima).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from kfactory.models.gguf_model import LlamaConfig, ModelError, check_shapes


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Rotary embedding of x (tokens, heads, head_dim) at `positions` (tokens,), adjacent-pair layout."""
    dim = x.shape[-1]
    inv_freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)          # (dim/2,)
    angle = positions.astype(np.float64)[:, None, None] * inv_freq              # (tokens, 1, dim/2)
    cos, sin = np.cos(angle), np.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray) -> np.ndarray:
    """Causal grouped-query attention. q (n, heads, d) at q_positions; k, v (kv_heads, T, d) for positions
    0..T-1. Returns (n, heads * d), heads in order."""
    n, heads, d = q.shape
    kv_heads, total, _ = k.shape
    group = heads // kv_heads
    qg = q.transpose(1, 0, 2).reshape(kv_heads, group, n, d)                    # head h = kv * group + g
    scores = qg @ k[:, None].swapaxes(-1, -2) / np.sqrt(d)                     # (kv, group, n, T)
    future = np.arange(total)[None, :] > q_positions[:, None]                   # (n, T)
    scores = np.where(future, -np.inf, scores)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ v[:, None]                                                        # (kv, group, n, d)
    return out.reshape(heads, n, d).transpose(1, 0, 2).reshape(n, heads * d)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


@dataclass
class KVCache:
    """Keys (after RoPE) and values of every block for positions 0..length-1: k, v are
    (blocks, kv_heads, capacity, head_dim) float64; rows past `length` are unused."""
    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


@dataclass
class Generation:
    """What greedy generation produced: the new tokens, and (when kept) the logits each was chosen from
    (row 0 from the prompt's last position, row i from decoding token i-1)."""
    tokens: list[int]
    logits: np.ndarray | None = field(default=None, repr=False)


class Reference:
    """The float64 forward of one model: `prefill` (a chunk of tokens, appended to a cache), `decode`
    (one token), `generate` (greedy).

    The cache is the caller's: prefill of tokens[:n] then decode of tokens[n] gives the same logits as a
    prefill of tokens[:n+1] (to rounding), which the tests check."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, np.ndarray]):
        check_shapes(config, {name: tuple(w.shape) for name, w in weights.items()})
        self.config = config
        self.w = {name: np.asarray(weights[name], dtype=np.float64) for name in config.expected_shapes()}
        self.lm_head = self.w["token_embd.weight" if config.tied_embeddings else "output.weight"]

    @classmethod
    def from_model(cls, model) -> "Reference":
        """From an opened GGUF model (kfactory.models.GGUFModel): its config and dequantised weights."""
        return cls(model.config, model.weights(np.float64))

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty cache for up to `capacity` positions (default: the model's context length)."""
        c = self.config
        shape = (c.blocks, c.kv_heads, capacity or c.context_length, c.head_dim)
        return KVCache(np.zeros(shape), np.zeros(shape))

    def prefill(self, tokens: Sequence[int], cache: KVCache | None = None) -> tuple[np.ndarray, KVCache]:
        """Run `tokens` at positions cache.length.. (a new cache when None); returns logits (n, vocab) for
        every position and the cache, extended in place."""
        c = self.config
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("prefill needs a non-empty 1-D sequence of token ids")
        if ids.min() < 0 or ids.max() >= c.vocab:
            raise ValueError(f"token ids must lie in [0, {c.vocab})")
        cache = cache if cache is not None else self.new_cache(max(len(ids), c.context_length))
        start, n = cache.length, len(ids)
        if start + n > cache.capacity:
            raise ModelError(f"the cache holds {cache.capacity} positions; {start} + {n} do not fit")
        positions = np.arange(start, start + n)
        x = self.w["token_embd.weight"][ids]                                     # (n, hidden)
        for i in range(c.blocks):
            x = self._block(i, x, positions, cache)
        cache.length = start + n
        x = rms_norm(x, self.w["output_norm.weight"], c.rms_eps)
        return x @ self.lm_head.T, cache

    def _block(self, i: int, x: np.ndarray, positions: np.ndarray, cache: KVCache) -> np.ndarray:
        c, w, p = self.config, self.w, f"blk.{i}."
        n, end = len(positions), positions[-1] + 1
        h = rms_norm(x, w[p + "attn_norm.weight"], c.rms_eps)
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, c.heads, c.head_dim), positions, c.rope_base)
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, c.kv_heads, c.head_dim), positions, c.rope_base)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, c.kv_heads, c.head_dim)
        cache.k[i, :, positions[0]:end] = k.transpose(1, 0, 2)                    # (kv, n, d)
        cache.v[i, :, positions[0]:end] = v.transpose(1, 0, 2)
        a = attention(q, cache.k[i, :, :end], cache.v[i, :, :end], positions)
        x = x + a @ w[p + "attn_output.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], c.rms_eps)
        g = silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        return x + g @ w[p + "ffn_down.weight"].T

    def decode(self, token: int, cache: KVCache) -> np.ndarray:
        """Logits (vocab,) for one token at position cache.length; the cache grows by one."""
        logits, _ = self.prefill([token], cache)
        return logits[0]

    def generate(self, prompt: Sequence[int], max_new_tokens: int, stop: Sequence[int] = (),
                 keep_logits: bool = False) -> Generation:
        """Greedy generation: prefill the prompt, then decode the argmax token until `max_new_tokens` or a
        token in `stop` (which is kept as the last token)."""
        cache = self.new_cache(len(prompt) + max_new_tokens)
        logits = self.prefill(prompt, cache)[0][-1]
        tokens: list[int] = []
        kept: list[np.ndarray] = []
        while len(tokens) < max_new_tokens:
            kept.append(logits)
            tokens.append(int(np.argmax(logits)))
            if tokens[-1] in stop or len(tokens) == max_new_tokens:
                break
            logits = self.decode(tokens[-1], cache)
        return Generation(tokens, np.stack(kept) if keep_logits and kept else None)

"""decode_attention_gqa: the float64 reference and the numpy baseline (one decode step of grouped-query
attention over a head-major KV cache, as kfactory.models.reference.attention for the last position)."""
from __future__ import annotations

import numpy as np


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """o[h] = softmax(K[h // G] q[h] / sqrt(D)) V[h // G] per query head h, G = H / KV, in float64."""
    q = inputs["q"].astype(np.float64)                    # (H, D)
    k = inputs["k"].astype(np.float64)                    # (KV, ctx, D)
    v = inputs["v"].astype(np.float64)
    heads, dim = q.shape
    kv_heads = k.shape[0]
    if heads % kv_heads:
        raise ValueError(f"H = {heads} is not a multiple of KV = {kv_heads}: every kv head serves H / KV query heads")
    qg = q.reshape(kv_heads, heads // kv_heads, dim)     # query head h = kvh * G + g
    s = np.einsum("kgd,kpd->kgp", qg, k) / np.sqrt(dim)   # (KV, G, ctx)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return {"o": np.einsum("kgp,kpd->kgd", p, v).reshape(heads, dim)}


def numpy_attention(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], threads: int) -> None:
    """What a careful numpy user writes: batched matmuls per kv head over its group of query heads."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    heads, dim = q.shape
    kv_heads = k.shape[0]
    qg = q.reshape(kv_heads, heads // kv_heads, dim)
    s = np.matmul(qg, k.transpose(0, 2, 1))               # (KV, G, ctx)
    s *= np.float32(1.0 / np.sqrt(dim))
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    np.matmul(s, v, out=outputs["o"].reshape(kv_heads, heads // kv_heads, dim))


def baselines() -> dict:
    """Baselines available here: name -> fn(inputs, outputs, threads) writing outputs."""
    return {"numpy": numpy_attention}

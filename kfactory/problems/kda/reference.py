"""kda (Kimi Delta Attention): the float64 reference of the recurrence and the baselines.

Layout as FLA's (batch, time, head, channel): q, k [B, T, H, K]; v [B, T, HV, V]; g [B, T, HV, K] (log-space
decay per key channel); beta [B, T, HV]; h0 and ht [B, HV, K, V]; o [B, T, HV, V]. Value head hv reads q/k head
hv // (HV // H). The problem normalises q and k inside the kernel (FLA's use_qk_l2norm_in_kernel=True, as Kimi
Linear calls it) and uses scale = K ** -0.5; `recurrence` takes both as options.

Baselines (cpu): "numpy", the same recurrence in float32 numpy; "torch", the recurrence as a torch user writes it
(only where torch is importable). On a GPU (`cuda_baselines`): FLA's fused_recurrent_kda and chunk_kda when
fla-core is importable (bf16 inputs only: kda_bf16 declares them), and the torch recurrence on the device.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: the epsilon inside FLA's in-kernel L2 normalisation: x / sqrt(sum(x^2) + EPS)
EPS = 1e-6
#: this problem's kernels normalise q and k themselves
L2NORM_QK = True


def l2norm(x: np.ndarray) -> np.ndarray:
    """x / sqrt(sum(x^2) + EPS) over the last axis, in x's precision."""
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + EPS)


def _heads(x: np.ndarray, hv: int) -> np.ndarray:
    """q or k [B, T, H, K] repeated to the value heads [B, T, HV, K] (head hv reads hv // G)."""
    return np.repeat(x, hv // x.shape[2], axis=2) if x.shape[2] != hv else x


def recurrence(q, k, v, g, beta, h0=None, scale: float | None = None, l2norm_qk: bool = False,
               dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """(o [B, T, HV, V], final state [B, HV, K, V]) of the KDA recurrence computed in `dtype`:
    S = diag(exp g_t) S; r = v_t - S^T k_t; S += beta_t k_t r^T; o_t = S^T (scale q_t)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"value heads {HV} must be a multiple of the q/k heads {H}")
    scale = K ** -0.5 if scale is None else scale
    q, k = q.astype(dtype), k.astype(dtype)
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    q, k = _heads(q, HV) * scale, _heads(k, HV)
    decay = np.exp(g.astype(dtype))
    v, beta = v.astype(dtype), beta.astype(dtype)
    S = np.zeros((B, HV, K, V), dtype) if h0 is None else h0.astype(dtype).copy()
    o = np.empty((B, T, HV, V), dtype)
    for t in range(T):
        S *= decay[:, t, :, :, None]
        r = v[:, t] - (k[:, t, :, None, :] @ S)[:, :, 0]
        S += (beta[:, t, :, None, None] * k[:, t, :, :, None]) * r[:, :, None, :]
        o[:, t] = (q[:, t, :, None, :] @ S)[:, :, 0]
    return o, S


def chunked(q, k, v, g, beta, h0=None, scale: float | None = None, l2norm_qk: bool = False,
            chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The same (o, final state) by the chunked (WY) form that fast kernels use, in float64: within a chunk,
    with G the inclusive cumulative sum of g, L[i, j] = sum_d k_i k_j exp(G_i - G_j) (j < i),
    delta = (I + diag(beta) L)^-1 diag(beta) (V - (K exp G) S0), o = (q exp G) S0 + Aqk delta with
    Aqk[i, j] = sum_d q_i k_j exp(G_i - G_j) (j <= i), S = diag(exp G_last) S0 + (K exp(G_last - G))^T delta.
    Every exponent is a difference G_i - G_j with j <= i (never positive), so nothing overflows for any gate.
    The algorithm the chunked kernels implement, checked against `recurrence` in tests/test_kda.py."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    q, k = q.astype(np.float64), k.astype(np.float64)
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    q, k = _heads(q, HV) * scale, _heads(k, HV)
    S = np.zeros((B, HV, K, V)) if h0 is None else h0.astype(np.float64).copy()
    o = np.empty((B, T, HV, V))
    for lo in range(0, T, chunk):
        hi = min(T, lo + chunk)
        # [B, HV, C, .] slices of the chunk
        qc, kc = (x[:, lo:hi].transpose(0, 2, 1, 3) for x in (q, k))
        vc = v[:, lo:hi].astype(np.float64).transpose(0, 2, 1, 3)
        bc = beta[:, lo:hi].astype(np.float64).transpose(0, 2, 1)
        G = np.cumsum(g[:, lo:hi].astype(np.float64), axis=1).transpose(0, 2, 1, 3)
        o[:, lo:hi], S = _chunk_step(qc, kc, vc, bc, G, S)
    return o, S


def _chunk_step(qc, kc, vc, bc, G, S0):
    """(o [B, C, HV, V], state after the chunk) of one chunk; every array is [B, HV, C, .]."""
    C = qc.shape[2]
    below = np.tril(np.ones((C, C), bool), -1)
    decay = np.exp(np.where((below | np.eye(C, dtype=bool))[..., None],
                            G[:, :, :, None, :] - G[:, :, None, :, :], -np.inf))   # [B, HV, C, C, K]
    L = np.einsum("bhid,bhjd,bhijd->bhij", kc, kc, decay) * below
    Aqk = np.einsum("bhid,bhjd,bhijd->bhij", qc, kc, decay)
    A = np.eye(C) + bc[..., :, None] * L
    eG = np.exp(G)
    rhs = bc[..., None] * (vc - (kc * eG) @ S0)
    delta = np.linalg.solve(A, rhs)
    o = (qc * eG) @ S0 + Aqk @ delta
    last = G[:, :, -1:, :]
    S = np.exp(last[:, :, 0, :])[..., None] * S0 + (kc * np.exp(last - G)).transpose(0, 1, 3, 2) @ delta
    return o.transpose(0, 2, 1, 3), S


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The problem's outputs in float64: o and the final state ht."""
    o, ht = recurrence(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["h0"],
                       l2norm_qk=L2NORM_QK)
    return {"o": o, "ht": ht}


def numpy_kda(inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray], threads: int) -> None:
    """The recurrence in float32 numpy (vectorised over batch and heads), written into the outputs."""
    o, ht = recurrence(inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"], inputs["h0"],
                       l2norm_qk=L2NORM_QK, dtype=np.float32)
    outputs["o"][...] = o
    outputs["ht"][...] = ht


def torch_recurrence(torch, q, k, v, g, beta, h0, scale=None, l2norm_qk=True):
    """(o, final state) of the recurrence in torch float32 on q's device, as a competent torch user writes it:
    batched over (batch x value head) with bmm for S^T k, S^T q and the rank-1 update, the state updated in
    place; o is returned in float32 (callers cast to v's dtype)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if l2norm_qk:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + EPS)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + EPS)
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    # [T, B*HV, ...] so that each step reads contiguous slices
    q = (q * scale).transpose(0, 1).reshape(T, B * HV, 1, K).contiguous()
    k = k.transpose(0, 1).reshape(T, B * HV, K).contiguous()
    decay = g.exp().transpose(0, 1).reshape(T, B * HV, K, 1).contiguous()
    bk = (beta[..., None] * k.reshape(T, B, HV, K).transpose(0, 1)).transpose(0, 1).reshape(T, B * HV, K, 1)
    v = v.transpose(0, 1).reshape(T, B * HV, 1, V).contiguous()
    S = h0.float().reshape(B * HV, K, V).clone()
    o = torch.empty(T, B * HV, 1, V, dtype=torch.float32, device=q.device)
    for t in range(T):
        S.mul_(decay[t])
        r = v[t] - torch.bmm(k[t].unsqueeze(1), S)
        S.baddbmm_(bk[t].contiguous(), r)
        torch.bmm(q[t], S, out=o[t])
    return o.reshape(T, B, HV, V).transpose(0, 1), S.reshape(B, HV, K, V)


def _torch_kda():
    try:
        import torch
    except ImportError:
        return None
    cache: dict = {}

    def run(inputs, outputs, threads):
        if cache.get("threads") != threads:
            torch.set_num_threads(threads)
            cache["threads"] = threads
        with torch.inference_mode():
            x = {n: torch.from_numpy(a) for n, a in inputs.items()}
            o, ht = torch_recurrence(torch, x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"],
                                     l2norm_qk=L2NORM_QK)
            torch.from_numpy(outputs["o"]).copy_(o)
            torch.from_numpy(outputs["ht"]).copy_(ht)

    return run


def baselines() -> dict:
    """Baselines available here: name -> fn(inputs, outputs, threads) writing outputs."""
    found = {"numpy": numpy_kda}
    torch_fn = _torch_kda()
    if torch_fn is not None:
        found["torch"] = torch_fn
    return found


def _fla_kda():
    """FLA's kernels {name: fn} where fla-core imports; {} otherwise (no GPU, no Triton, no fla)."""
    try:
        from fla.ops.kda import chunk_kda, fused_recurrent_kda
    except Exception:  # noqa: BLE001 (ImportError, or Triton failing to initialise without a driver)
        return {}
    return {"fla_recurrent": fused_recurrent_kda, "fla_chunk": chunk_kda}


def cuda_baselines() -> dict:
    """On a GPU: name -> fn(ins, outs) over dicts of torch CUDA tensors, writing outs["o"] and outs["ht"]:
    FLA's fused_recurrent_kda and chunk_kda where importable (called with the problem's options: scale
    K^-0.5, initial state, final state out, in-kernel q/k L2 norm), and the torch recurrence."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    found: dict[str, Callable[..., None]] = {}
    for name, fn in _fla_kda().items():   # FLA's chunk kernels refuse fp32 q/k/v: kda_bf16 declares these
        def run(ins, outs, fn=fn):
            o, ht = fn(q=ins["q"], k=ins["k"], v=ins["v"], g=ins["g"], beta=ins["beta"],
                       initial_state=ins["h0"], output_final_state=True, use_qk_l2norm_in_kernel=L2NORM_QK)
            outs["o"].copy_(o)
            outs["ht"].copy_(ht)
        found[name] = run

    def run_torch(ins, outs):
        o, ht = torch_recurrence(torch, ins["q"], ins["k"], ins["v"], ins["g"], ins["beta"], ins["h0"],
                                 l2norm_qk=L2NORM_QK)
        outs["o"].copy_(o)
        outs["ht"].copy_(ht)
    found["torch"] = run_torch
    return found

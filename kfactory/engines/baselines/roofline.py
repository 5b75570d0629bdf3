"""The roofline of one token: bytes read and flops of a Llama forward, and the host ceilings they are set against.

An engine's roofline time per token is the larger of its bounds: the bytes it must read over the host's measured
read bandwidth, the flops it must do over the host's measured peak fp32 rate, and, for an engine whose decode
takes its quantised products in integers (`Formats.decode_int8`: `q4_decode: vnni`), those products over
the host's measured int8 dot-product rate (`peak_int8_gops`): such an engine neither dequantises nor multiplies
its weights in fp32, so the fp32 count would bound work it does not do (at one thread the vnni engine measured
100.3% of that bound). A forward reads its weights and
KV cache and writes a few KB, so the bound is set by the cpu target's read-only probe (`read_bandwidth_gbps`); the
copy probe's figure (`mem_bandwidth_gbps`, bytes read + written) is lower on a host whose stores cost a
read-for-ownership, and a fraction of it would flatter the engine, so it is reported beside, never instead
(`token_roofline`). Its fraction of the roofline
is that time over the time it measured (1.0 would be the speed of light; a decode step is memory bound, a 512-token
prefill compute bound).

What is counted, per token:

- bytes: every block matrix once in its storage format (Q4_1: 20 bytes a block of 32 weights; Q8_0: 34; f32: 4
  a weight), one embedding row, the LM head over the whole vocabulary in its format (tied: the embedding's), the
  norms, and the KV cache of the positions attended (keys and values of every block). Activations are left out:
  a few KB a token that stay in cache.
- flops: 2 per weight of each matrix product (multiply + add, the way the peak probe counts an FMA), plus
  dequantisation (`DEQUANT_FLOPS`), attention (`attention_flops`) and the small element-wise ops (norms, RoPE,
  SiLU, residuals).
- int8 ops (an integer decode only): each quantised weight times each of x's byte digits, 2 ops a product
  (`INT8_OPS_PER_DIGIT`, the way the int8 probe counts them); such a product leaves fp32 only its per-block
  scales (`INT_BLOCK_FLOPS`). Matrices in a float format stay fp32 work. The bound takes the larger of the fp32
  and int8 times, not their sum: on some cores the two run on different ports.

A prefill of n tokens reads the weights once for all n tokens and dequantises each weight once, computes the LM
head for its last position only (all a generating engine needs), and attends causally (position i sees i + 1
positions); its figures are totals over the n tokens divided by n. The bound is a lower bound on time: it counts
the least work a correct engine must do, never an engine's own overheads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kfactory.models.gguf_model import LlamaConfig

#: elements per quantised block (Q4_1 and Q8_0 both)
BLOCK = 32
#: storage bytes per weight: the block formats' bytes over their 32 elements
BYTES_PER_WEIGHT: dict[str, float] = {
    "f64": 8.0, "f32": 4.0, "f16": 2.0,
    "q8_0": 34 / BLOCK,   # f16 scale + 32 int8
    "q4_1": 20 / BLOCK,   # f16 scale + f16 min + 16 bytes of nibbles
}
#: floating-point ops to turn one stored element into a float: Q4_1 is d * q + m (a multiply and an add, one FMA,
#: counted 2 like the peak probe's FMAs), Q8_0 is d * q (one multiply). Unpacking nibbles and converting integers
#: or halves to float are integer/conversion instructions, not flops, so f16/f32/f64 cost nothing.
DEQUANT_FLOPS: dict[str, int] = {"f64": 0, "f32": 0, "f16": 0, "q8_0": 1, "q4_1": 2}

#: an integer product's ops per weight and byte digit of x: the byte product and its add (the int8 probe's count)
INT8_OPS_PER_DIGIT = 2
#: fp32 flops an integer product leaves per row and block of 32: Q4_1 d * S + m * sum(x) (a multiply and an FMA),
#: Q8_0 d * S (a multiply)
INT_BLOCK_FLOPS: dict[str, int] = {"q4_1": 3, "q8_0": 1}

#: per attention score besides the two dot products: the 1/sqrt(d) scale, subtracting the running max, exp,
#: adding to the denominator, normalising (exp counted as one op)
SOFTMAX_FLOPS_PER_SCORE = 5
#: RMSNorm per element: square, accumulate, scale by 1/rms, multiply by the weight
RMS_FLOPS_PER_ELEMENT = 4
#: RoPE per element: each of a pair's two outputs is two products and one add
ROPE_FLOPS_PER_ELEMENT = 3
#: SiLU(g) * u per element: exp(-g), 1 + e, g / (1 + e), times u
SWIGLU_FLOPS_PER_ELEMENT = 4


#: the seven matrices of a block, by the suffix of their GGUF names
MATRIX_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class Formats:
    """The storage format of each kind of tensor an engine reads (keys of BYTES_PER_WEIGHT). `matrices` is one
    format for all seven block matrices, or a dict giving each kind of MATRIX_KINDS its own (a file may keep
    ffn_down in Q8_0 beside Q4_1). `decode_int8`: {quantised format: byte digits of x} for the formats whose
    matrices (and LM head) a decode step multiplies in int8 dot products, each weight by each digit (4 for
    `q4_decode: vnni`); the other formats' products are fp32. A prefill is costed in fp32 either way (the
    engine's GEMM dequantises its panels)."""
    matrices: str | dict[str, str]
    embedding: str
    lm_head: str
    norms: str
    kv_cache: str
    decode_int8: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.matrices, dict) and set(self.matrices) != set(MATRIX_KINDS):
            raise ValueError(f"per-kind matrix formats must name exactly {MATRIX_KINDS}, not {sorted(self.matrices)}")
        given = [self.embedding, self.lm_head, self.norms, self.kv_cache]
        given += list(self.matrices.values()) if isinstance(self.matrices, dict) else [self.matrices]
        unknown = [f for f in given if f not in BYTES_PER_WEIGHT]
        if unknown:
            raise ValueError(f"unknown formats {unknown}; known: {sorted(BYTES_PER_WEIGHT)}")
        bad = {k: v for k, v in self.decode_int8.items()
               if k not in INT_BLOCK_FLOPS or not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"decode_int8 maps a quantised format ({sorted(INT_BLOCK_FLOPS)}) to its byte digits "
                             f"(1 or more), not {bad}")

    def matrix(self, kind: str) -> str:
        """The format of one kind of block matrix."""
        return self.matrices[kind] if isinstance(self.matrices, dict) else self.matrices

    @property
    def label(self) -> str:
        """The block matrices' format in a word ('q4_1', or 'q4_1+q8_0' where kinds differ)."""
        return "+".join(sorted({self.matrix(k) for k in MATRIX_KINDS}))

    @classmethod
    def uniform(cls, fmt: str) -> "Formats":
        """Every tensor and the cache in one format (an engine that dequantises everything up front)."""
        return cls(fmt, fmt, fmt, fmt, fmt)

    @classmethod
    def from_gguf(cls, formats: dict[str, str], config: LlamaConfig, kv_cache: str,
                  decode_int8: dict[str, int] | None = None) -> "Formats":
        """The formats a GGUF file stores (GGUFModel.formats(): tensor name -> 'Q4_1', 'F32', ...), for an
        engine that computes on the blocks as stored. Each kind of matrix must have one format in every block."""
        per_kind = {}
        for kind in MATRIX_KINDS:
            found = {formats[f"blk.{i}.{kind}.weight"].lower() for i in range(config.blocks)}
            if len(found) != 1:
                raise ValueError(f"{kind} differs between blocks ({sorted(found)}); the roofline takes one a kind")
            per_kind[kind] = found.pop()
        same = set(per_kind.values())
        head = "token_embd.weight" if config.tied_embeddings else "output.weight"
        return cls(matrices=same.pop() if len(same) == 1 else per_kind,
                   embedding=formats["token_embd.weight"].lower(), lm_head=formats[head].lower(),
                   norms=formats["output_norm.weight"].lower(), kv_cache=kv_cache,
                   decode_int8=dict(decode_int8 or {}))

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Cost:
    """Bytes read, fp32 flops and int8 ops of one token (`parts` breaks them down by where they come from)."""
    bytes: float
    flops: float
    parts: dict[str, float]
    int8_ops: float = 0.0


def matrix_weights(c: LlamaConfig) -> dict[str, int]:
    """Weights of each of a block's seven matrices: q, o (hidden x heads*head_dim), k, v
    (hidden x kv_heads*head_dim), gate, up, down (hidden x ffn)."""
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    return {"attn_q": c.hidden * q, "attn_k": c.hidden * kv, "attn_v": c.hidden * kv, "attn_output": c.hidden * q,
            "ffn_gate": c.hidden * c.ffn, "ffn_up": c.hidden * c.ffn, "ffn_down": c.hidden * c.ffn}


def block_matrix_weights(c: LlamaConfig) -> int:
    """Weights of one block's seven matrices together."""
    return sum(matrix_weights(c).values())


def attention_flops(c: LlamaConfig, positions: float) -> float:
    """One query token attending to `positions` keys, every block and head: q.k (2 * head_dim a score), the
    softmax (SOFTMAX_FLOPS_PER_SCORE), p.v (2 * head_dim a score)."""
    return c.blocks * c.heads * positions * (4 * c.head_dim + SOFTMAX_FLOPS_PER_SCORE)


def elementwise_flops(c: LlamaConfig) -> int:
    """One token's element-wise work in every block (two RMSNorms, RoPE of q and k, SwiGLU, two residual adds);
    the final norm is counted with the LM head, where it is needed."""
    per_block = (2 * RMS_FLOPS_PER_ELEMENT * c.hidden + ROPE_FLOPS_PER_ELEMENT * (c.heads + c.kv_heads) * c.head_dim
                 + SWIGLU_FLOPS_PER_ELEMENT * c.ffn + 2 * c.hidden)
    return c.blocks * per_block


def kv_bytes(c: LlamaConfig, f: Formats, positions: float) -> float:
    """Keys and values of `positions` positions in every block's cache."""
    return 2 * c.blocks * c.kv_heads * c.head_dim * positions * BYTES_PER_WEIGHT[f.kv_cache]


def _weights(c: LlamaConfig, f: Formats) -> tuple[dict[str, float], dict[str, float]]:
    """(bytes, dequantisation flops) of reading every block matrix, the LM head and the norms once."""
    per_kind = matrix_weights(c)
    head = c.vocab * c.hidden
    norms = (2 * c.blocks + 1) * c.hidden
    size = {"matrices": c.blocks * sum(n * BYTES_PER_WEIGHT[f.matrix(k)] for k, n in per_kind.items()),
            "lm_head": head * BYTES_PER_WEIGHT[f.lm_head], "norms": norms * BYTES_PER_WEIGHT[f.norms]}
    deq = {"matrices": float(c.blocks * sum(n * DEQUANT_FLOPS[f.matrix(k)] for k, n in per_kind.items())),
           "lm_head": float(head * DEQUANT_FLOPS[f.lm_head])}
    return size, deq


def _decode_products(c: LlamaConfig, f: Formats) -> dict[str, float]:
    """One decode step's products over every block matrix and the LM head: fp32 product and dequantisation
    flops of those taken in fp32, int8 ops and the per-block scales' flops of those taken in integers (a
    format in `decode_int8`)."""
    tensors = [(f.matrix(k), c.blocks * n) for k, n in matrix_weights(c).items()]
    tensors.append((f.lm_head, c.vocab * c.hidden))
    out = dict.fromkeys(("flops_matmul", "flops_dequant", "int8_ops_matmul", "flops_int_scales"), 0.0)
    for fmt, n in tensors:
        if fmt in f.decode_int8:
            out["int8_ops_matmul"] += n * INT8_OPS_PER_DIGIT * f.decode_int8[fmt]
            out["flops_int_scales"] += n / BLOCK * INT_BLOCK_FLOPS[fmt]
        else:
            out["flops_matmul"] += 2.0 * n
            out["flops_dequant"] += float(n * DEQUANT_FLOPS[fmt])
    return out


def decode_cost(c: LlamaConfig, f: Formats, positions: float) -> Cost:
    """One decode step of a token that attends to `positions` positions (the cache including itself)."""
    size, _ = _weights(c, f)
    row = c.hidden * BYTES_PER_WEIGHT[f.embedding]
    products = _decode_products(c, f)
    products["flops_dequant"] += c.hidden * DEQUANT_FLOPS[f.embedding]
    attn = attention_flops(c, positions)
    other = elementwise_flops(c) + RMS_FLOPS_PER_ELEMENT * c.hidden
    parts = {"bytes_weights": sum(size.values()), "bytes_embedding_row": row,
             "bytes_kv_cache": kv_bytes(c, f, positions), **products,
             "flops_attention": attn, "flops_elementwise": float(other)}
    flops = products["flops_matmul"] + products["flops_dequant"] + products["flops_int_scales"] + attn + other
    return Cost(bytes=parts["bytes_weights"] + row + parts["bytes_kv_cache"], flops=flops, parts=parts,
                int8_ops=products["int8_ops_matmul"])


def prefill_cost(c: LlamaConfig, f: Formats, n: int) -> Cost:
    """Per token of a prefill of `n` tokens into an empty cache: totals over the n tokens divided by n."""
    if n < 1:
        raise ValueError("a prefill has at least one token")
    size, deq = _weights(c, f)
    rows = n * c.hidden * BYTES_PER_WEIGHT[f.embedding]
    # the LM head for the last position only; every block matrix applied to all n tokens
    matmul = 2.0 * (n * c.blocks * block_matrix_weights(c) + c.vocab * c.hidden)
    dequant = deq["matrices"] + deq["lm_head"] + n * c.hidden * DEQUANT_FLOPS[f.embedding]
    attn = attention_flops(c, n * (n + 1) / 2)          # position i attends to i + 1 positions
    other = n * elementwise_flops(c) + RMS_FLOPS_PER_ELEMENT * c.hidden
    cache = kv_bytes(c, f, n)                            # each key and value read once (a tiled engine)
    parts = {"bytes_weights": sum(size.values()) / n, "bytes_embedding_row": rows / n, "bytes_kv_cache": cache / n,
             "flops_matmul": matmul / n, "flops_dequant": dequant / n, "flops_attention": attn / n,
             "flops_elementwise": other / n}
    return Cost(bytes=(sum(size.values()) + rows + cache) / n, flops=(matmul + dequant + attn + other) / n,
                parts=parts)


def bounds(cost: Cost, mem_bandwidth_gbps: float, peak_gflops: float,
           peak_int8_gops: float = 0.0) -> dict[str, float] | None:
    """The bounds in seconds, {"memory_s": bytes / bandwidth, "compute_s": flops / peak}, and for a cost with
    int8 ops "compute_int8_s": int8 ops / the int8 peak; None when a ceiling the cost needs is unknown (0: not
    measured)."""
    if mem_bandwidth_gbps <= 0 or peak_gflops <= 0 or (cost.int8_ops and peak_int8_gops <= 0):
        return None
    out = {"memory_s": cost.bytes / (mem_bandwidth_gbps * 1e9), "compute_s": cost.flops / (peak_gflops * 1e9)}
    if cost.int8_ops:
        out["compute_int8_s"] = cost.int8_ops / (peak_int8_gops * 1e9)
    return out


def roofline_seconds_per_token(cost: Cost, mem_bandwidth_gbps: float, peak_gflops: float,
                               peak_int8_gops: float = 0.0) -> float | None:
    """The largest bound (`bounds`) in seconds; None when a ceiling is unknown (0: not measured)."""
    b = bounds(cost, mem_bandwidth_gbps, peak_gflops, peak_int8_gops)
    return None if b is None else max(b.values())


def fraction(roofline_s: float | None, measured_s: float | None) -> float | None:
    """The roofline time over the measured time (1.0 = at the roofline); None when either is unknown."""
    if roofline_s is None or not measured_s or measured_s <= 0:
        return None
    return roofline_s / measured_s


#: the ceilings' names: the read-only stream that bounds a forward, the copy stream reported beside it, the fp32
#: and int8 peaks
READ_GBPS, COPY_GBPS, PEAK_GFLOPS, PEAK_INT8_GOPS = (
    "read_bandwidth_gbps", "mem_bandwidth_gbps", "peak_gflops", "peak_int8_gops")


def token_roofline(cost: Cost, ceilings: dict[str, float], measured_s: float | None) -> dict:
    """One token's roofline against the host's ceilings: its bytes, flops and int8 ops, the bounds in seconds
    against the read bandwidth ("memory_s"), the fp32 peak ("compute_s") and, for int8 work, the int8 peak
    ("compute_int8_s"), "roofline_s" (the largest), "bound" ("memory", "compute" or "compute_int8"), "fraction"
    (roofline_s over measured_s), and the same against the copy bandwidth ("roofline_copy_s", "fraction_copy").
    A figure is None where a ceiling is unknown (absent or 0)."""
    peak, peak_int8 = ceilings.get(PEAK_GFLOPS, 0.0), ceilings.get(PEAK_INT8_GOPS, 0.0)
    b = bounds(cost, ceilings.get(READ_GBPS, 0.0), peak, peak_int8)
    time = max(b.values()) if b else None
    copy_time = roofline_seconds_per_token(cost, ceilings.get(COPY_GBPS, 0.0), peak, peak_int8)
    # every bound kept: which one binds says whether a figure rests on the bandwidth or a peak
    return {"bytes": cost.bytes, "flops": cost.flops, "int8_ops": cost.int8_ops, "roofline_s": time, **(b or {}),
            "bound": None if b is None else max(b, key=lambda k: b[k]).removesuffix("_s"),
            "fraction": fraction(time, measured_s),
            "roofline_copy_s": copy_time, "fraction_copy": fraction(copy_time, measured_s)}


def host_ceilings(threads: int, settings=None) -> dict[str, float]:
    """This host's measured {"read_bandwidth_gbps", "mem_bandwidth_gbps" (copy), "peak_gflops", "peak_int8_gops"}
    at `threads` threads, through the cpu target (kfactory.targets.cpu.ceiling: C probes in a sandboxed runner,
    cached per host and thread count in <data_dir>/ceilings.json). 0.0 where they could not be measured."""
    from kfactory.platform.config import Settings
    from kfactory.targets import get_target
    base = settings if settings is not None else Settings()
    dev = get_target("cpu", base.model_copy(update={"threads": threads})).device()
    return {READ_GBPS: float(dev.read_bandwidth_gbps), COPY_GBPS: float(dev.mem_bandwidth_gbps),
            PEAK_GFLOPS: float(dev.peak_gflops), PEAK_INT8_GOPS: float(dev.peak_int8_gops)}

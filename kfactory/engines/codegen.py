"""Generate one C source for an engine design and a model architecture.

The source is the design's and the architecture's constants (`#define`s: dimensions compiled in, so every loop
bound is known to the compiler) followed by the engine's C files (kfactory/engines/c/: common.c, matmul.c,
forward.c, team.c) in that order; the defines select the code each choice needs (the weight formats' kernels, fused or
separate matvecs and norms, the KV cache's indexing). One self-contained file, compiled as is (build.py).

The ABI (version 1; docs/engines.md says the same, with the tensor layouts):

    typedef struct { const char *name; int32_t format, layout, rows, cols; const void *data; } kf_tensor;
        format: 0 F32, 1 Q4_1, 2 Q8_0; layout: 0 ROWS (GGUF row order and blocks), 1 PACK4 (4 rows
        interleaved), 2 PACK16 (Q4_1 and Q8_0 under the integer decode: 16 rows interleaved)
    typedef struct { int32_t blocks, hidden, heads, kv_heads, head_dim, ffn, vocab; float rope_base, rms_eps; }
        kf_config;
    void *kf_engine_new(const kf_tensor *tensors, int n_tensors, const kf_config *cfg, int ctx_capacity,
                        int threads);      NULL on failure (kf_last_error() says why); tensors' data must outlive it
    int   kf_prefill(void *e, const int32_t *tokens, int n, float *logits, int all_logits);
                                           runs tokens at positions kf_position()..; logits: the last token's
                                           (vocab floats), or every token's (n x vocab) when all_logits != 0
    int   kf_decode_step(void *e, int32_t token, float *logits);      one token: vocab floats
    void  kf_reset(void *e);               forget the context (position 0)
    int   kf_position(void *e);            positions held in the KV cache
    void  kf_engine_free(void *e);
    int   kf_abi_version(void);            1
    const char *kf_design_id(void);        the EngineDesign.design_id() it was generated for
    const char *kf_last_error(void);       the last failure's message (this thread)

Return codes: 0 ok; -1 bad arguments; -2 a token id outside [0, vocab); -3 the context capacity would be
exceeded (nothing is run then). Tensor names are the GGUF ones (`token_embd.weight`, `output_norm.weight`,
`blk.N.attn_norm.weight`, ...), plus `blk.N.attn_qkv.weight` (rows of Q, K, V concatenated) for fuse_qkv and
`blk.N.ffn_gate_up.weight` (gate rows, then up rows) for fuse_gate_up; norms are F32 with rows = 1.
"""
from __future__ import annotations

from pathlib import Path

from kfactory.engines.design import BUILTIN, OPS, VNNI_DIGITS, EngineDesign
from kfactory.models.gguf_model import LlamaConfig

C_DIR = Path(__file__).parent / "c"
#: the template files, in the order they are concatenated (each uses only what the earlier ones define)
C_FILES = ("common.c", "matmul.c", "forward.c", "team.c")
ABI_VERSION = 1


class CodegenError(ValueError):
    """The architecture cannot be served by the generated engine (the message says which dimension)."""


def check_config(config: LlamaConfig) -> None:
    """Refuse an architecture the kernels do not handle: every matrix's columns must be whole 32-blocks, the
    heads must group evenly and the head dimension must hold rotary pairs."""
    for name in ("hidden", "ffn"):
        if getattr(config, name) % 32:
            raise CodegenError(f"{name} = {getattr(config, name)} is not a multiple of 32 (the block size)")
    if (config.heads * config.head_dim) % 32:
        raise CodegenError(f"heads * head_dim = {config.heads * config.head_dim} is not a multiple of 32")
    if config.heads % config.kv_heads:
        raise CodegenError(f"{config.heads} query heads do not group over {config.kv_heads} key/value heads")
    if config.head_dim % 2:
        raise CodegenError(f"head_dim = {config.head_dim} is odd: RoPE rotates pairs")


def defines(design: EngineDesign, config: LlamaConfig) -> dict[str, str]:
    """The constants the C files are generated with, by name."""
    flag = {True: "1", False: "0"}
    op_threads = design.op_thread_map()
    return {
        "KF_BLOCKS": str(config.blocks), "KF_HIDDEN": str(config.hidden), "KF_HEADS": str(config.heads),
        "KF_KV_HEADS": str(config.kv_heads), "KF_HEAD_DIM": str(config.head_dim), "KF_FFN": str(config.ffn),
        "KF_VOCAB": str(config.vocab),
        "KF_WEIGHTS_F32": flag[design.weights == "f32"],
        "KF_FUSE_QKV": flag[design.fuse_qkv], "KF_FUSE_GATE_UP": flag[design.fuse_gate_up],
        "KF_FUSE_NORM": flag[design.fuse_norm], "KF_KV_HEAD_MAJOR": flag[design.kv_layout == "head_major"],
        "KF_PREPACK": flag[design.prepack], "KF_DESIGN_ID": f'"{design.design_id()}"',
        # prefill (12+ tokens) as a GEMM over dequantised panels, or the decode kernels over tiles of 4 tokens
        "KF_PREFILL_GEMM": flag[design.prefill == "gemm"],
        # with AVX-512, a decode step's Q4_1 matvec by lookup table (q4group1_lut) or by conversion (q4group1_512)
        "KF_Q4_TABLE": flag[design.q4_decode == "table"],
        # or in integers over PACK16 with AVX512-VNNI (q4group16_vnni; the Q8_0 head too, q8group16_vnni)
        "KF_Q4_VNNI": flag[design.q4_decode in VNNI_DIGITS],
        # x's byte digits in the integer products: 4 (vnni, 29 bits) or 3 (vnni24, 24 bits)
        "KF_VNNI_DIGITS": str(VNNI_DIGITS.get(design.q4_decode, 4)),
        # a searched kernel is its own translation unit (kfactory/engines/ops.py), linked in under this name
        "KF_OP_MATVEC_Q4_1": flag[design.matvec_q4_1 != BUILTIN],
        "KF_OP_MATVEC_Q8_0": flag[design.matvec_q8_0 != BUILTIN],
        # threads of single ops (op_threads), 0 where the op takes the engine's
        **{f"KF_T_{op.upper()}": str(op_threads.get(op, 0)) for op in OPS},
        # a decode step in one parallel region, the threads meeting at barriers (team.c), or a region an op
        "KF_TEAM_STEP": flag[design.team == "step"],
    }


def generate(design: EngineDesign, config: LlamaConfig) -> str:
    """The engine's C source for `design` on `config` (deterministic: the same inputs give the same bytes, so
    the build cache can key on the text)."""
    check_config(config)
    head = [f"/* kfactory engine, generated for design {design.design_id()} */",
            f"/* design: {design.as_dict()} */",
            f"/* architecture: {config.as_dict()} */"]
    head += [f"#define {name} {value}" for name, value in defines(design, config).items()]
    parts = ["\n".join(head) + "\n"]
    parts += [(C_DIR / name).read_text() for name in C_FILES]
    return "\n".join(parts)

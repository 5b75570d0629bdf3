"""The tensors an engine design reads, prepared from a GGUF model (in the engine's child process).

Each `Prepared` is one kf_tensor of the ABI (kfactory/engines/codegen.py): a name, a format (F32, Q4_1, Q8_0),
a layout (ROWS, PACK4 or PACK16), its logical rows and columns, and a contiguous numpy array holding the bytes the C
code reads. Quantised matrices in the ROWS layout are the file's blocks, not copied (memory-mapped); fused
matrices concatenate rows (Q|K|V, gate|up), which a row-wise format allows exactly; PACK4 interleaves rows in
groups of 4 (rows padded with zeros to a multiple of 4):

    Q4_1 per (group, block), 80 bytes:  f16 d[4] | f16 m[4] | u16 q[4][8]    (row r%4 of the group at index r%4;
                                        lane i of a row holds the block's element 8k+i in bits 4k..4k+3, so
                                        one widening and shifts give 8 consecutive elements per 32-bit lane)
    Q8_0 per (group, block), 136 bytes: f16 d[4] | i8 qs[4][32]
    F32  per (group, 8 columns):        float v[4][8]

PACK16 (design q4_decode "vnni" or "vnni24": the integer decodes' matrices) interleaves groups of 16 rows (rows
padded to a multiple of 16):

    Q4_1 per (group, block), 320 bytes: f16 d[16] | f16 m[16] | u8 q[4][16][4]   (byte [c][i][k]: row i's
                                        element 8c+k in the low nibble, 8c+4+k in the high one)
    Q8_0 per (group, block), 544 bytes: f16 d[16] | u8 q[8][16][4]   (byte [c][i][k]: row i's element 4c+k
                                        plus 128, so that vpdpbusd's unsigned operand holds the weights)
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kfactory.engines.design import EngineDesign
from kfactory.models.gguf_model import GGUFModel, LlamaConfig
from kfactory.models.quant import BLOCK_DTYPES, QuantTensor, blocks

FORMATS = {"F32": 0, "Q4_1": 1, "Q8_0": 2}
LAYOUTS = {"rows": 0, "pack4": 1, "pack16": 2}


class PrepareError(ValueError):
    """The model's tensors cannot be given to this design (a format it does not read)."""


@dataclass(frozen=True)
class Prepared:
    """One tensor as handed to the engine: `data` is C-contiguous and must stay alive while the engine is."""
    name: str
    format: str
    layout: str
    rows: int
    cols: int
    data: np.ndarray


def _pad_rows(a: np.ndarray, multiple: int) -> np.ndarray:
    extra = -a.shape[0] % multiple
    if not extra:
        return a
    return np.concatenate([a, np.zeros((extra, *a.shape[1:]), dtype=a.dtype)])


def pack4(data: np.ndarray, fmt: str) -> np.ndarray:
    """The PACK4 bytes (or floats, F32) of a ROWS matrix: raw uint8 blocks (rows, cols/32 * block bytes) for
    Q4_1/Q8_0, float32 (rows, cols) for F32. See the module docstring for the layout."""
    if fmt == "F32":
        f = _pad_rows(np.asarray(data, dtype=np.float32), 4)
        g, cols = f.shape[0] // 4, f.shape[1]
        return np.ascontiguousarray(f.reshape(g, 4, cols // 8, 8).transpose(0, 2, 1, 3))
    b = _pad_rows(blocks(np.ascontiguousarray(data), fmt), 4)        # (rows4, nb) structured
    g, nb = b.shape[0] // 4, b.shape[1]

    def by_group(field: str) -> np.ndarray:   # (g, nb, 4, ...) as bytes
        v = b[field].reshape(g, 4, nb, *b[field].shape[2:]).swapaxes(1, 2)
        return np.ascontiguousarray(v).view(np.uint8).reshape(g, nb, -1)

    if fmt == "Q4_1":
        qs = b["qs"]                                                        # (rows4, nb, 16): 32 nibbles
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.uint16)  # (rows4, nb, 32) elements
        q = q.reshape(*q.shape[:2], 4, 8)                                   # [k][i] = element 8k + i
        lanes = (q[..., 0, :] | q[..., 1, :] << 4 | q[..., 2, :] << 8 | q[..., 3, :] << 12).astype("<u2")
        v = lanes.reshape(g, 4, nb, 8).swapaxes(1, 2)
        q_bytes = np.ascontiguousarray(v).view(np.uint8).reshape(g, nb, -1)
        parts = [by_group("d"), by_group("m"), q_bytes]
    else:
        parts = [by_group("d"), by_group("qs")]
    return np.ascontiguousarray(np.concatenate(parts, axis=-1))


def pack16(data: np.ndarray, fmt: str = "Q4_1") -> np.ndarray:
    """The PACK16 bytes of a ROWS Q4_1 or Q8_0 matrix (raw uint8 blocks, (rows, cols/32 * block bytes)); see
    the module docstring for the layout."""
    b = _pad_rows(blocks(np.ascontiguousarray(data), fmt), 16)  # (rows16, nb) structured
    g, nb = b.shape[0] // 16, b.shape[1]

    def by_group(field: str) -> np.ndarray:   # (g, nb, 16 halves) as bytes
        v = b[field].reshape(g, 16, nb).swapaxes(1, 2)
        return np.ascontiguousarray(v).view(np.uint8).reshape(g, nb, -1)

    if fmt == "Q8_0":
        q = (np.ascontiguousarray(b["qs"]).view(np.uint8) ^ 0x80).reshape(g, 16, nb, 8, 4)  # code + 128: [i][b][c][k]
        codes = np.ascontiguousarray(q.transpose(0, 2, 3, 1, 4)).reshape(g, nb, 512)
        return np.ascontiguousarray(np.concatenate([by_group("d"), codes], axis=-1))

    qs = b["qs"]                                                         # byte j: element j low, j + 16 high
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)                    # (rows16, nb, 32) elements
    q = q.reshape(g, 16, nb, 4, 2, 4)                                    # [c][half][k]: element 8c + 4 half + k
    codes = (q[..., 0, :] | q[..., 1, :] << 4).astype(np.uint8)          # (g, 16, nb, 4, 4): [i][b][c][k]
    codes = np.ascontiguousarray(codes.transpose(0, 2, 3, 1, 4)).reshape(g, nb, 256)
    return np.ascontiguousarray(np.concatenate([by_group("d"), by_group("m"), codes], axis=-1))


def _matrix(name: str, parts: list[QuantTensor], design: EngineDesign) -> Prepared:
    """One matrix (several concatenated by rows when fused) in the design's format and layout."""
    cols = parts[0].shape[1]
    rows = sum(p.shape[0] for p in parts)
    if design.weights == "f32":
        fmt, mats = "F32", [p.dequantize().astype(np.float32) for p in parts]
    else:
        formats = {p.qtype for p in parts}
        if len(formats) != 1 or not formats <= set(BLOCK_DTYPES):
            raise PrepareError(f"{name}: design weights=q4_1 reads Q4_1/Q8_0 blocks of one format; the file "
                               f"stores {', '.join(sorted(formats))}")
        fmt, mats = formats.pop(), [np.asarray(p.raw) for p in parts]
    data = mats[0] if len(mats) == 1 else np.concatenate(mats)
    if design.layout_of(fmt) == "pack16":
        return Prepared(name, fmt, "pack16", rows, cols, pack16(data, fmt))
    if design.layout_of(fmt) == "pack4":
        return Prepared(name, fmt, "pack4", rows, cols, pack4(data, fmt))
    return Prepared(name, fmt, "rows", rows, cols, np.ascontiguousarray(data))


def _norm(t: QuantTensor) -> Prepared:
    return Prepared(t.name, "F32", "rows", 1, t.shape[0], np.ascontiguousarray(t.dequantize(), dtype=np.float32))


def tensors_in_order(model: GGUFModel, design: EngineDesign) -> Iterator[Prepared]:
    """Every tensor the generated engine for `design` binds, by its ABI name, one at a time in the order a step
    reads them: each block's norms and matrices as the forward takes them, then the final norm and the tied LM
    head (the embedding). The engine finds its tensors by name; the order is for `arena`."""
    config: LlamaConfig = model.config
    if not config.tied_embeddings:
        raise PrepareError("the engine reads the tied LM head (token_embd.weight); this model has output.weight")
    for i in range(config.blocks):
        def t(kind: str) -> QuantTensor:
            return model.tensor(f"blk.{i}.{kind}.weight")
        yield _norm(t("attn_norm"))
        if design.fuse_qkv:
            yield _matrix(f"blk.{i}.attn_qkv.weight", [t("attn_q"), t("attn_k"), t("attn_v")], design)
        else:
            for k in "qkv":
                yield _matrix(f"blk.{i}.attn_{k}.weight", [t(f"attn_{k}")], design)
        yield _matrix(f"blk.{i}.attn_output.weight", [t("attn_output")], design)
        yield _norm(t("ffn_norm"))
        if design.fuse_gate_up:
            yield _matrix(f"blk.{i}.ffn_gate_up.weight", [t("ffn_gate"), t("ffn_up")], design)
        else:
            for k in ("gate", "up"):
                yield _matrix(f"blk.{i}.ffn_{k}.weight", [t(f"ffn_{k}")], design)
        yield _matrix(f"blk.{i}.ffn_down.weight", [t("ffn_down")], design)
    yield _norm(model.tensor("output_norm.weight"))
    yield _matrix("token_embd.weight", [model.tensor("token_embd.weight")], design)


def prepare(model: GGUFModel, design: EngineDesign) -> list[Prepared]:
    """Every tensor the generated engine for `design` binds (tensors_in_order), each its own array."""
    return list(tensors_in_order(model, design))


def arena(model: GGUFModel, design: EngineDesign) -> list[Prepared]:
    """The tensors of `prepare`, copied one after another into one buffer in the order a step reads them (each
    at a 64-byte boundary), each tensor's own array dropped once copied, so the peak is the buffer and one
    tensor. A decode step then streams one run of memory: a kernel's prefetch past the end of one matrix already
    reads the next, and the pages run in order. On smollm2-135m (the integer decode, 1 thread, a Zen 4) decode
    measured x1.17-1.40 the separate arrays' in alternated rounds. The buffer is reserved at an upper bound
    (float32 weights, rows padded to 16) and only the pages written are ever resident."""
    bound = sum(4 * (-(-shape[0] // 16) * 16) * int(np.prod(shape[1:], dtype=np.int64)) + 64
                for shape in model.shapes.values())
    buf = np.empty(bound + 64, dtype=np.uint8)
    off = (-buf.ctypes.data) % 64
    out = []
    for t in tensors_in_order(model, design):
        n = t.data.nbytes
        if off + n > buf.nbytes:
            raise PrepareError(f"{t.name}: {n} bytes past the arena's bound of {bound}")
        view = buf[off:off + n].view(t.data.dtype).reshape(t.data.shape)
        view[...] = t.data
        out.append(Prepared(t.name, t.format, t.layout, t.rows, t.cols, view))
        off += -(-n // 64) * 64
    return out

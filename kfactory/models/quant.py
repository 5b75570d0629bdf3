"""GGUF weight formats as they lie in the file: the block layouts of Q8_0 and Q4_1, and a tensor that keeps them.

A quantised matrix of shape (rows, cols) is stored row by row; each row is cols/32 blocks of 32 consecutive
elements, and each block is packed little-endian with no padding:

    Q8_0, 34 bytes:  d: float16 | qs: 32 x int8                 element j = d * qs[j]
    Q4_1, 20 bytes:  d: float16 | m: float16 | qs: 16 x uint8   element j      = d * (qs[j] & 0x0F) + m
                                                                 element j + 16 = d * (qs[j] >> 4)   + m
                                                                 (j = 0..15: low nibbles hold the first half
                                                                 of the block, high nibbles the second)

`BLOCK_DTYPES` gives these layouts as numpy structured dtypes, so `blocks()` is a zero-copy view of the file's
bytes with named fields (`d`, `m`, `qs`) that an engine can repack for its kernels. `decode()` computes the
elements from that view; the tests check it equals `gguf.quants.dequantize` bit for bit, which is how we know the
layout written here is the one in the files.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, quants

#: elements per block (both formats)
BLOCK = 32

#: the on-disk layout of one block, per format (packed, little-endian)
BLOCK_DTYPES: dict[str, np.dtype] = {
    "Q8_0": np.dtype([("d", "<f2"), ("qs", "i1", (BLOCK,))]),
    "Q4_1": np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", (BLOCK // 2,))]),
}

#: formats kept as float arrays (no blocks)
PLAIN = {"F32": np.float32, "F16": np.float16}


def blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    """The raw bytes of a quantised matrix, (rows, cols/32 * block bytes) uint8, viewed as its blocks:
    a structured array of shape (rows, cols/32) with the fields of `BLOCK_DTYPES[qtype]` (no copy)."""
    layout = BLOCK_DTYPES[qtype]
    if raw.dtype != np.uint8 or raw.shape[-1] % layout.itemsize:
        raise ValueError(f"{qtype}: expected uint8 rows of whole {layout.itemsize}-byte blocks, got "
                         f"{raw.dtype} {raw.shape}")
    return np.ascontiguousarray(raw).view(layout)


def decode(raw: np.ndarray, qtype: str) -> np.ndarray:
    """Float32 elements of a quantised matrix computed from the documented block layout (module docstring);
    equal to `gguf.quants.dequantize` (the tests check it), kept as the executable form of the layout."""
    b = blocks(raw, qtype)
    d = b["d"].astype(np.float32)[..., None]
    if qtype == "Q8_0":
        q = b["qs"].astype(np.float32)
        out = d * q
    else:
        qs = b["qs"]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
        out = d * q + b["m"].astype(np.float32)[..., None]
    return out.reshape(*raw.shape[:-1], -1)


@dataclass(frozen=True)
class QuantTensor:
    """One tensor of a GGUF file as it is stored.

    `shape` is the logical numpy shape, row-major, outermost first (a weight matrix is (out, in), so
    y = W @ x; GGUF's own shape lists the innermost dimension first and is the reverse). For `qtype` F32/F16
    `raw` is the float array of that shape; for Q8_0/Q4_1 it is uint8 of shape (rows, cols/32 * block bytes),
    the blocks exactly as in the file (see the module docstring and `blocks()`).
    """
    name: str
    qtype: str
    shape: tuple[int, ...]
    raw: np.ndarray

    @property
    def quantized(self) -> bool:
        return self.qtype in BLOCK_DTYPES

    def blocks(self) -> np.ndarray:
        """The blocks as a structured array (rows, cols/32) with fields d, qs (Q8_0) or d, m, qs (Q4_1)."""
        if not self.quantized:
            raise ValueError(f"{self.name} is {self.qtype}: it has no blocks")
        return blocks(self.raw, self.qtype)

    def dequantize(self) -> np.ndarray:
        """The elements as float32, through `gguf.quants.dequantize` (plain formats: converted)."""
        if self.qtype in PLAIN:
            return np.asarray(self.raw, dtype=np.float32).reshape(self.shape)
        out = quants.dequantize(np.asarray(self.raw), GGMLQuantizationType[self.qtype])
        return out.reshape(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes the tensor occupies in the file (what a kernel reading it in this format moves)."""
        return int(self.raw.nbytes)


def quantize(values: np.ndarray, qtype: str) -> np.ndarray:
    """Raw blocks for a float matrix (cols a multiple of 32), through `gguf.quants.quantize`: the bytes a GGUF
    writer stores, shaped (rows, cols/32 * block bytes)."""
    if qtype not in BLOCK_DTYPES:
        raise ValueError(f"cannot quantize to {qtype}; formats: {sorted(BLOCK_DTYPES)}")
    if values.shape[-1] % BLOCK:
        raise ValueError(f"{qtype} needs the last dimension a multiple of {BLOCK}, got {values.shape}")
    return quants.quantize(np.asarray(values, dtype=np.float32), GGMLQuantizationType[qtype])

"""A GGUF file opened as a model: its architecture (from metadata), its tensors (kept or dequantised), its
tokenizer. Read with the `gguf` package's GGUFReader (or, reopened, from an index: kfactory.models.gguf_index);
tensor data stay memory-mapped until asked for."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType

from kfactory.models import gguf_index
from kfactory.models.errors import ModelError
from kfactory.models.quant import QuantTensor


@dataclass(frozen=True)
class LlamaConfig:
    """The Llama family's architecture: everything the reference forward (and an engine) needs to know."""
    blocks: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_base: float
    rms_eps: float
    vocab: int
    tied_embeddings: bool
    context_length: int

    def as_dict(self) -> dict:
        return asdict(self)

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the forward reads, by its GGUF name, with its logical (numpy, outermost first) shape."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"token_embd.weight": (self.vocab, h), "output_norm.weight": (h,)}
        if not self.tied_embeddings:
            shapes["output.weight"] = (self.vocab, h)
        for i in range(self.blocks):
            shapes.update({f"blk.{i}.attn_norm.weight": (h,), f"blk.{i}.attn_q.weight": (q, h),
                           f"blk.{i}.attn_k.weight": (kv, h), f"blk.{i}.attn_v.weight": (kv, h),
                           f"blk.{i}.attn_output.weight": (h, q), f"blk.{i}.ffn_norm.weight": (h,),
                           f"blk.{i}.ffn_gate.weight": (self.ffn, h), f"blk.{i}.ffn_up.weight": (self.ffn, h),
                           f"blk.{i}.ffn_down.weight": (h, self.ffn)})
        return shapes


def config_from_metadata(meta: dict, shapes: dict[str, tuple[int, ...]]) -> LlamaConfig:
    """The architecture from GGUF metadata (`llama.*` keys) and the tensors' shapes; refuses what the reference
    does not implement (another architecture, partial rotary, a head count that does not divide)."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ModelError(f"architecture {arch!r} is not supported (only the llama family)")

    def need(key: str):
        if f"llama.{key}" not in meta:
            raise ModelError(f"GGUF metadata lacks llama.{key}")
        return meta[f"llama.{key}"]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    head_dim = int(meta.get("llama.attention.key_length", hidden // heads))
    if heads % kv_heads:
        raise ModelError(f"{heads} query heads are not a multiple of {kv_heads} key/value heads")
    rope_dims = int(meta.get("llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ModelError(f"partial rotary embedding ({rope_dims} of {head_dim} dims) is not supported")
    if "token_embd.weight" not in shapes:
        raise ModelError("the file has no token_embd.weight")
    vocab = int(meta.get("llama.vocab_size", shapes["token_embd.weight"][0]))
    config = LlamaConfig(
        blocks=int(need("block_count")), hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        ffn=int(need("feed_forward_length")), rope_base=float(meta.get("llama.rope.freq_base", 10000.0)),
        rms_eps=float(need("attention.layer_norm_rms_epsilon")), vocab=vocab,
        # no separate output matrix: the LM head is the embedding (how llama.cpp reads such files too)
        tied_embeddings="output.weight" not in shapes,
        context_length=int(meta.get("llama.context_length", 2048)))
    check_shapes(config, shapes)
    return config


def check_shapes(config: LlamaConfig, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor the config implies is present with its shape (a file that disagrees with its own metadata
    is refused here, not as a broadcasting error deep inside a forward pass)."""
    wrong = [f"{name}: expected {want}, file has {shapes.get(name, 'nothing')}"
             for name, want in config.expected_shapes().items() if shapes.get(name) != want]
    if wrong:
        raise ModelError(f"tensors disagree with the metadata ({len(wrong)}): " + "; ".join(wrong[:5]))


def _entry(t) -> gguf_index.Entry:
    """A GGUFReader tensor as an index entry (GGUF lists dimensions innermost first: the shape is reversed)."""
    return gguf_index.Entry(t.name, t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)),
                            int(t.data_offset), t.data.dtype.str, tuple(int(n) for n in t.data.shape))


def _indexed(index_dir: Path | None, path: Path) -> tuple[LlamaConfig, list[gguf_index.Entry]] | None:
    """The architecture and tensor table indexed for `path`, or None (no index_dir, no index, or one whose
    architecture fields are not this version's LlamaConfig)."""
    found = gguf_index.load(index_dir, path) if index_dir is not None else None
    if found is None:
        return None
    try:
        return LlamaConfig(**found[0]), found[1]
    except TypeError:
        return None


def _kept_tokenizer(doc: dict):
    """The tokenizer kept in an index, or None where what was kept is not one (it is then built again)."""
    from kfactory.models.tokenizer import Tokenizer
    try:
        return Tokenizer.from_json(doc)
    except (KeyError, TypeError, ValueError):
        return None


def _field_value(field):
    """A metadata field as a Python value (string, number, bool, or a list of them)."""
    if field.types and field.types[0] == GGUFValueType.ARRAY:
        return list(field.contents())
    return field.contents()


class GGUFModel:
    """One GGUF file: `metadata`, `config`, `tensor(name)` (blocks kept), `weights()` (dequantised),
    `tokenizer`. Parsing the metadata takes seconds for a 49k-token vocabulary (GGUFReader reads each string as
    its own numpy view), so given an `index_dir` the tensor table and architecture are read from an index kept
    there (kfactory.models.gguf_index; written on the first open) and the metadata is parsed only when asked for.
    Tensor bytes are memory-mapped, read only, and read only when used."""

    def __init__(self, path: Path | str, index_dir: Path | None = None):
        self.path = Path(path)
        self.index_dir = index_dir
        if not self.path.is_file():
            raise ModelError(f"{self.path}: no such GGUF file")
        indexed = _indexed(index_dir, self.path)
        #: the architecture as indexed (None: read from the metadata when first asked for)
        self._indexed_config = indexed[0] if indexed is not None else None
        entries = indexed[1] if indexed is not None else [_entry(t) for t in self.reader.tensors]
        self._table = {e.name: e for e in entries}
        if indexed is None and index_dir is not None:
            gguf_index.save(index_dir, self.path, self.config.as_dict(), entries)   # after config: a valid file

    @cached_property
    def reader(self) -> GGUFReader:
        """The file parsed by the gguf package (metadata included)."""
        try:
            return GGUFReader(self.path)
        except (ValueError, OSError) as e:
            raise ModelError(f"{self.path}: not a readable GGUF file: {e}") from e

    @cached_property
    def _bytes(self) -> np.memmap:
        return np.memmap(self.path, dtype=np.uint8, mode="r")

    @cached_property
    def metadata(self) -> dict:
        """Every metadata key (GGUF.* header fields left out) with its value."""
        return {k: _field_value(f) for k, f in self.reader.fields.items() if not k.startswith("GGUF.")}

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each tensor's logical shape (numpy order, outermost first)."""
        return {name: e.shape for name, e in self._table.items()}

    @cached_property
    def config(self) -> LlamaConfig:
        return self._indexed_config or config_from_metadata(self.metadata, self.shapes)

    @property
    def tensor_names(self) -> list[str]:
        return list(self._table)

    def tensor(self, name: str) -> QuantTensor:
        """A tensor as stored: raw blocks for Q8_0/Q4_1 (memory-mapped, not copied), floats for F32/F16."""
        if name not in self._table:
            raise ModelError(f"{self.path.name} has no tensor {name!r}")
        e = self._table[name]
        dtype = np.dtype(e.dtype)
        n = int(np.prod(e.array_shape, dtype=np.int64)) * dtype.itemsize
        raw = self._bytes[e.offset:e.offset + n].view(dtype).reshape(e.array_shape)
        return QuantTensor(name=name, qtype=e.qtype, shape=e.shape, raw=raw)

    def formats(self) -> dict[str, str]:
        """Each tensor's storage format (F32, Q8_0, Q4_1, ...)."""
        return {name: e.qtype for name, e in self._table.items()}

    def weights(self, dtype=np.float64) -> dict[str, np.ndarray]:
        """Every tensor the forward reads, dequantised (float32 through gguf.quants.dequantize, then converted
        to `dtype`, exactly: float64 holds every float32): the weights the reference and a dequantising engine
        both compute with."""
        return {name: self.tensor(name).dequantize().astype(dtype)
                for name in self.config.expected_shapes()}

    @cached_property
    def tokenizer(self):
        """The tokenizer built from this file's metadata (kfactory.models.tokenizer), or the one kept in the
        index from an earlier open."""
        from kfactory.models.tokenizer import Tokenizer
        kept = gguf_index.load_tokenizer(self.index_dir, self.path) if self.index_dir is not None else None
        tok = _kept_tokenizer(kept) if kept is not None else None
        if tok is None:
            tok = Tokenizer.from_metadata(self.metadata)
            if self.index_dir is not None:
                gguf_index.save_tokenizer(self.index_dir, self.path, tok.to_json())
        return tok

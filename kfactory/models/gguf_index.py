"""A GGUF file's tensor table and architecture, kept in the model cache so that reopening the file skips the parse
of its metadata.

GGUFReader parses every metadata field when it opens a file: about 5 s for SmolLM2-135M, whose vocabulary and
merges are some 98,000 strings, each read as its own numpy view. An engine's child process needs none of them, only
the tensors (names, formats, shapes, where their bytes lie) and the architecture, and it opens the model once per
design to verify it and once per timing round. The first open writes this index; later opens read the tensor
table from it and map the file's bytes themselves. The tokenizer, which a verifier or `kfactory generate` needs,
is kept beside it once built (the tokenizers package's own JSON form), so that the metadata is parsed only
when something else of it is asked for.

The index names the file by its resolved path, size and modification time, and is used only while all three match
(a file rewritten in place gets a new one); an index that cannot be read or does not match is written again. An
index is written only after the architecture was read from the metadata, so it never holds what the file does not.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: the index's format; a change makes every older index a miss
VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One tensor: its GGUF type name, logical (numpy) shape, and its bytes: `offset` into the file, read as
    `dtype` in `array_shape` (as GGUFReader presents them: raw uint8 rows for block formats)."""
    name: str
    qtype: str
    shape: tuple[int, ...]
    offset: int
    dtype: str
    array_shape: tuple[int, ...]


def _identity(gguf: Path) -> dict:
    st = gguf.stat()
    return {"path": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def index_path(cache_dir: Path, gguf: Path, part: str = "tensors") -> Path:
    """Where `part` of the index of `gguf` lives under `cache_dir` (a name that changes with the file's identity):
    "tensors" (the table and architecture) or "tokenizer" (kfactory.models.tokenizer.Tokenizer.to_json)."""
    return _path(cache_dir, gguf, part, _identity(gguf))


def _path(cache_dir: Path, gguf: Path, part: str, ident: dict) -> Path:
    key = hashlib.sha256(json.dumps([VERSION, ident], sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / "gguf-index" / f"{gguf.stem}-{key}.{part}.json"


def _read(cache_dir: Path, gguf: Path, part: str) -> dict | None:
    """The payload of `part`, or None: no index, one that cannot be read, or one that does not match the file
    as it is now (the caller parses the file and writes it again)."""
    ident = _identity(gguf)
    try:
        doc = json.loads(_path(cache_dir, gguf, part, ident).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):   # none yet, or torn: parsed and written again
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or doc.get("file") != ident:
        return None
    payload = doc.get(part)
    return payload if isinstance(payload, dict) else None


def _write(cache_dir: Path, gguf: Path, part: str, payload: dict) -> Path | None:
    """Write `part` atomically (a concurrent reader finds a whole index or none); its path, or None where the
    cache directory cannot be written: the index only saves time, so the model opens without it."""
    ident = _identity(gguf)
    path = _path(cache_dir, gguf, part, ident)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".index-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": VERSION, "file": ident, part: payload}, f)
        os.replace(tmp, path)
    except OSError:
        return None
    return path


def load(cache_dir: Path, gguf: Path) -> tuple[dict, list[Entry]] | None:
    """The architecture fields and tensor table indexed for `gguf`, or None (see _read)."""
    doc = _read(cache_dir, gguf, "tensors")
    if doc is None:
        return None
    try:
        entries = [Entry(e["name"], e["qtype"], tuple(e["shape"]), int(e["offset"]), e["dtype"],
                         tuple(e["array_shape"])) for e in doc["tensors"]]
        return dict(doc["config"]), entries
    except (KeyError, TypeError, ValueError):
        return None


def save(cache_dir: Path, gguf: Path, config: dict, entries: list[Entry]) -> Path | None:
    """Index the architecture and tensor table of `gguf` (see _write)."""
    return _write(cache_dir, gguf, "tensors", {
        "config": config, "tensors": [{"name": e.name, "qtype": e.qtype, "shape": list(e.shape),
                                       "offset": e.offset, "dtype": e.dtype, "array_shape": list(e.array_shape)}
                                      for e in entries]})


def load_tokenizer(cache_dir: Path, gguf: Path) -> dict | None:
    """The tokenizer kept for `gguf` (Tokenizer.to_json's form), or None (see _read)."""
    return _read(cache_dir, gguf, "tokenizer")


def save_tokenizer(cache_dir: Path, gguf: Path, doc: dict) -> Path | None:
    """Keep the tokenizer built from the metadata of `gguf` (see _write)."""
    return _write(cache_dir, gguf, "tokenizer", doc)

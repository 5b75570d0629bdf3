"""An inference engine exported by kfactory, usable without kfactory (ctypes, numpy and tokenizers only).

`kfactory export MODEL --format python --name NAME` copies this file as NAME.py beside the engine's C source
(NAME.c), its prepared weights (NAME.weights), tokenizer.json and manifest.json; everything this module needs
to know (its name, the build command, the tokenizer's special ids and chat template) is read from the manifest
next to it, so the file itself is the same for every export. It must never import kfactory.

    from NAME import Engine
    engine = Engine()                                   # builds libNAME.so on first use, again if NAME.c changed
    for piece in engine.generate("What is the capital of France?", max_tokens=64):
        print(piece, end="", flush=True)
    logits = engine.prefill([1, 2, 3])                  # (vocab,) float32 of the last token
    logits = engine.decode_step(int(logits.argmax()))
    engine.reset()

NAME.weights (little-endian): a 128-byte header (magic "KFENGW01", u32 file version 1, u32 ABI version 1, u32
tensor count, u32 0, char design_id[64], the kf_config: 7 x i32 blocks, hidden, heads, kv_heads, head_dim, ffn,
vocab, 2 x f32 rope_base, rms_eps, 4 bytes 0), then one 96-byte entry per tensor (char name[64], i32 format,
layout, rows, cols, u64 offset, u64 nbytes), then the tensors' bytes at 64-byte aligned offsets: exactly the
bytes kfactory's engine runner hands the library (kfactory/engines/prepare.py). The library reads them in place
from the memory map.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
import subprocess
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
MAGIC = b"KFENGW01"
FILE_VERSION = 1
ABI_VERSION = 1
HEADER = struct.Struct("<8s4I64s7i2f4x")
ENTRY = struct.Struct("<64s4iQQ")
#: what a negative return code of prefill/decode_step means (the ABI's)
RETURN_CODES = {-1: "bad arguments", -2: "token id out of range", -3: "context capacity exceeded"}
BUILD_TIMEOUT_S = 600


class EngineError(RuntimeError):
    """The engine cannot be built, loaded or called as asked; the message says what to fix."""


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("format", ctypes.c_int32), ("layout", ctypes.c_int32),
                ("rows", ctypes.c_int32), ("cols", ctypes.c_int32), ("data", ctypes.c_void_p)]


class _Config(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_int32), ("hidden", ctypes.c_int32), ("heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("ffn", ctypes.c_int32),
                ("vocab", ctypes.c_int32), ("rope_base", ctypes.c_float), ("rms_eps", ctypes.c_float)]


def load_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise EngineError(f"{path} is missing: point Engine() at the directory `kfactory export` wrote")
    manifest: dict[str, Any] = json.loads(path.read_text())
    if manifest.get("abi_version") != ABI_VERSION:
        raise EngineError(f"{path}: ABI {manifest.get('abi_version')}, this module speaks {ABI_VERSION}")
    return manifest


def build_library(directory: Path, manifest: dict[str, Any]) -> Path:
    """Compile libNAME.so with the command the campaign built the engine with ($CC picks the compiler);
    written to a temporary name first, so a concurrent build never leaves half a library."""
    build = manifest["build"]
    directory = Path(directory).resolve()   # the compiler runs there: a relative path would be read from it
    out = directory / build["artifact"]
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    cc = os.environ.get("CC") or build["cc"]
    # the linked op kernels' objects first (each compiled with its own flags), then the library
    for step in build.get("steps") or [build["argv"]]:
        argv = [cc if w == "{cc}" else str(tmp) if w == "{out}" else w for w in step]
        try:
            proc = subprocess.run(argv, cwd=directory, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EngineError(f"building {out.name} failed ({' '.join(argv)}): {e}") from e
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise EngineError(f"building {out.name} failed ({' '.join(argv)}):\n{proc.stderr[-4000:]}")
    os.replace(tmp, out)
    try:
        _stamp(out).write_text(_sources_digest(directory, manifest))
    except OSError as e:   # the library is whole; without a stamp the next open builds it again
        raise EngineError(f"cannot record what {out.name} was built from beside it: {e}") from e
    return out


def _sources(directory: Path, manifest: dict[str, Any]) -> list[Path]:
    """The files the library is built from: NAME.c and the linked op kernels' NAME_opI.c."""
    name = manifest["name"]
    return [directory / f for f in sorted(manifest.get("files", {}))
            if f == f"{name}.c" or (f.startswith(f"{name}_op") and f.endswith(".c"))]


def _sources_digest(directory: Path, manifest: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for path in _sources(directory, manifest):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _stamp(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sources")


def _built_from(lib: Path, directory: Path, manifest: dict[str, Any]) -> bool:
    """Whether `lib` was built from the sources now beside it: the sha256 of those sources is the one its build
    stamped (an export again into the same directory, or an edited source, needs it built again; mtimes would
    rebuild on every open after a clock skew). A library without a stamp is used where the directory cannot be
    written (an install of a copied export), and built again, once, where it can."""
    if not lib.is_file():
        return False
    try:
        return _stamp(lib).read_text().strip() == _sources_digest(directory, manifest)
    except FileNotFoundError:
        return not os.access(directory, os.W_OK)


def read_weights(path: Path) -> tuple[np.memmap, str, tuple, list[tuple]]:
    """(the file's memory map, design id, config fields, [(name, format, layout, rows, cols, offset, nbytes)])."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if len(data) < HEADER.size or bytes(data[:8]) != MAGIC:
        raise EngineError(f"{path} is not an engine weights file (magic {MAGIC!r})")
    buf = data.data   # the map's bytes, for struct
    magic, version, abi, n, _, design, *config = HEADER.unpack_from(buf, 0)
    if version != FILE_VERSION or abi != ABI_VERSION:
        raise EngineError(f"{path}: file version {version}, ABI {abi}; this module reads {FILE_VERSION}, "
                          f"{ABI_VERSION}")
    entries = []
    for i in range(n):
        name, fmt, layout, rows, cols, offset, nbytes = ENTRY.unpack_from(buf, HEADER.size + i * ENTRY.size)
        if offset + nbytes > len(data):
            raise EngineError(f"{path}: tensor {name.rstrip(bytes(1))!r} runs past the end of the file")
        entries.append((name.rstrip(bytes(1)), fmt, layout, rows, cols, offset, nbytes))
    return data, design.rstrip(bytes(1)).decode(), tuple(config), entries


class Engine:
    """The exported engine over its weights: `prefill`, `decode_step`, `reset`, `generate`.

    `directory` is the export's (default: where this file is); `ctx` the KV cache's capacity in positions
    (default: the model's context, at most 4096); `threads` defaults to the design's. The design's OpenMP
    environment (OMP_WAIT_POLICY, GOMP_SPINCOUNT: the manifest's omp_env) is set where the environment does not
    set it: libgomp reads it once."""

    def __init__(self, directory: Path | str = HERE, ctx: int | None = None, threads: int | None = None):
        self.directory = Path(directory).resolve()
        self.manifest = m = load_manifest(self.directory)
        self.name: str = m["name"]
        lib_path = self.directory / m["build"]["artifact"]
        if not _built_from(lib_path, self.directory, m):
            lib_path = build_library(self.directory, m)
        for name, value in m["omp_env"].items():   # this file ships with its manifest: the same export's
            os.environ.setdefault(name, value)
        self._lib = ctypes.CDLL(str(lib_path))
        self._bind()
        self._weights, design_id, config, entries = read_weights(self.directory / m["weights"]["file"])
        if design_id != self._fn("design_id")().decode():
            raise EngineError(f"{m['weights']['file']} was prepared for design {design_id}, the library is "
                              f"{self._fn('design_id')().decode()}")
        self.vocab = int(config[6])
        self.ctx = int(ctx if ctx is not None else min(m["config"]["context_length"], 4096))
        self._names = [e[0] for e in entries]
        arr = (_Tensor * len(entries))()
        base = self._weights.ctypes.data
        for slot, (name, fmt, layout, rows, cols, offset, _) in zip(arr, entries):
            slot.name, slot.format, slot.layout, slot.rows, slot.cols = name, fmt, layout, rows, cols
            slot.data = base + offset
        cfg = _Config(*config)
        handle = self._fn("engine_new")(arr, len(entries), ctypes.byref(cfg), self.ctx,
                                        int(threads if threads is not None else m["design"]["threads"]))
        if not handle:
            raise EngineError(f"{self.name}_engine_new refused: {self._error()}")
        self._handle = ctypes.c_void_p(handle)
        self._logits = np.empty(self.vocab, dtype=np.float32)
        tok = m["tokenizer"]
        self.tokenizer = Tokenizer.from_file(str(self.directory / tok["file"]))
        self.bos_id, self.eos_id, self.add_bos, self.chat = tok["bos_id"], tok["eos_id"], tok["add_bos"], tok["chat"]

    def _fn(self, short: str) -> Any:
        return getattr(self._lib, f"{self.name}_{short}")

    def _bind(self) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int
        sig = {"engine_new": (p, [ctypes.POINTER(_Tensor), i, ctypes.POINTER(_Config), i, i]),
               "prefill": (i, [p, p, i, p, i]), "decode_step": (i, [p, ctypes.c_int32, p]),
               "reset": (None, [p]), "position": (i, [p]), "engine_free": (None, [p]),
               "abi_version": (i, []), "design_id": (ctypes.c_char_p, []), "last_error": (ctypes.c_char_p, [])}
        for short, (restype, argtypes) in sig.items():
            try:
                fn = self._fn(short)
            except AttributeError as e:
                raise EngineError(f"the library lacks {self.name}_{short}: rebuild it from {self.name}.c") from e
            fn.restype, fn.argtypes = restype, argtypes
        if self._fn("abi_version")() != ABI_VERSION:
            raise EngineError(f"the library speaks ABI {self._fn('abi_version')()}, not {ABI_VERSION}")

    def _error(self) -> str:
        return (self._fn("last_error")() or b"").decode(errors="replace")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise EngineError(f"{what} returned {rc} ({RETURN_CODES.get(rc, 'unknown code')}): {self._error()}")

    # -- the ABI -------------------------------------------------------------------------------------------

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Run `ids` after the tokens already held; the last token's logits (vocab,) float32 (a copy)."""
        tokens = np.ascontiguousarray(ids, dtype=np.int32)
        if tokens.ndim != 1 or not len(tokens):
            raise EngineError("prefill needs a non-empty list of token ids")
        self._check(self._fn("prefill")(self._handle, tokens.ctypes.data, len(tokens), self._logits.ctypes.data, 0),
                    f"{self.name}_prefill")
        return self._logits.copy()

    def decode_step(self, token: int) -> np.ndarray:
        """One token; its logits (vocab,) float32 (a copy)."""
        self._check(self._fn("decode_step")(self._handle, int(token), self._logits.ctypes.data),
                    f"{self.name}_decode_step")
        return self._logits.copy()

    def reset(self) -> None:
        """Forget the context (position 0)."""
        self._fn("reset")(self._handle)

    @property
    def position(self) -> int:
        return int(self._fn("position")(self._handle))

    def close(self) -> None:
        if getattr(self, "_handle", None):
            self._fn("engine_free")(self._handle)
            self._handle = ctypes.c_void_p(0)

    def __del__(self) -> None:
        self.close()

    # -- text ----------------------------------------------------------------------------------------------

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of a user message through the model's chat template (when it has one and `chat`), BOS
        prepended where the model asks for it."""
        if chat and self.chat is not None:
            prompt = self.chat["prefix"] + prompt + self.chat["suffix"]
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def greedy(self, ids: Sequence[int], max_tokens: int) -> Iterator[int]:
        """Greedy tokens after `ids` from an empty context, ending at the model's end token (yielded) or after
        `max_tokens`; ties go to the lowest id."""
        if max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if len(ids) + max_tokens > self.ctx:
            raise EngineError(f"{len(ids)} prompt tokens and {max_tokens} new ones exceed the context of "
                              f"{self.ctx}: pass a larger ctx to Engine()")
        self.reset()
        logits = self.prefill(ids)
        for n in range(1, max_tokens + 1):
            token = int(logits.argmax())
            yield token
            if token == self.eos_id or n == max_tokens:
                return
            logits = self.decode_step(token)

    def generate(self, prompt: str, max_tokens: int = 64, chat: bool = True) -> Iterator[str]:
        """Stream the greedy continuation's text in pieces (a character split across tokens is held back until
        it is whole); special tokens are not shown."""
        out: list[int] = []
        shown = ""
        for token in self.greedy(self.encode(prompt, chat), max_tokens):
            out.append(token)
            text = self.decode(out)
            if text.endswith("\ufffd") or text == shown:
                continue
            yield text[len(shown):]
            shown = text
        text = self.decode(out)
        if text != shown:
            yield text[len(shown):]

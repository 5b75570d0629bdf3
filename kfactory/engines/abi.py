"""The engine ABI seen from Python through ctypes (kfactory/engines/codegen.py documents it).

Used only in the engine's child process (kfactory/engines/child.py): loading a generated library runs its code,
which never happens in a service process.
"""
from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from kfactory.engines.prepare import FORMATS, LAYOUTS, Prepared
from kfactory.models.gguf_model import LlamaConfig

ABI_VERSION = 1
#: what kf_prefill's negative return codes mean
RETURN_CODES = {-1: "bad arguments", -2: "token id out of range", -3: "context capacity exceeded"}


class KfTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("format", ctypes.c_int32), ("layout", ctypes.c_int32),
                ("rows", ctypes.c_int32), ("cols", ctypes.c_int32), ("data", ctypes.c_void_p)]


class KfConfig(ctypes.Structure):
    _fields_ = [("blocks", ctypes.c_int32), ("hidden", ctypes.c_int32), ("heads", ctypes.c_int32),
                ("kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("ffn", ctypes.c_int32),
                ("vocab", ctypes.c_int32), ("rope_base", ctypes.c_float), ("rms_eps", ctypes.c_float)]


class AbiError(RuntimeError):
    """The library refused a call (its message is kf_last_error's), or is not of this ABI."""


def _bind(lib: ctypes.CDLL) -> None:
    sig = {"kf_engine_new": (ctypes.c_void_p, [ctypes.POINTER(KfTensor), ctypes.c_int, ctypes.POINTER(KfConfig),
                                               ctypes.c_int, ctypes.c_int]),
           "kf_prefill": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                         ctypes.c_int]),
           "kf_decode_step": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
           "kf_reset": (None, [ctypes.c_void_p]), "kf_position": (ctypes.c_int, [ctypes.c_void_p]),
           "kf_engine_free": (None, [ctypes.c_void_p]), "kf_abi_version": (ctypes.c_int, []),
           "kf_design_id": (ctypes.c_char_p, []), "kf_last_error": (ctypes.c_char_p, [])}
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)          # AttributeError: the symbol is missing
        fn.restype, fn.argtypes = restype, argtypes


class Engine:
    """A generated engine library loaded and instantiated over prepared tensors (which it keeps alive)."""

    def __init__(self, so_path: str, tensors: Sequence[Prepared], config: LlamaConfig, ctx: int, threads: int):
        self.lib = ctypes.CDLL(so_path)
        try:
            _bind(self.lib)
        except AttributeError as e:
            raise AbiError(f"{so_path} lacks an ABI function: {e}") from e
        if self.lib.kf_abi_version() != ABI_VERSION:
            raise AbiError(f"{so_path} speaks ABI {self.lib.kf_abi_version()}, not {ABI_VERSION}")
        self.tensors = list(tensors)
        self._names = [t.name.encode() for t in self.tensors]
        arr = (KfTensor * len(self.tensors))()
        for slot, t, name in zip(arr, self.tensors, self._names):
            slot.name, slot.format, slot.layout = name, FORMATS[t.format], LAYOUTS[t.layout]
            slot.rows, slot.cols, slot.data = t.rows, t.cols, t.data.ctypes.data
        c = config
        self.config = config
        cfg = KfConfig(c.blocks, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab, c.rope_base, c.rms_eps)
        handle = self.lib.kf_engine_new(arr, len(self.tensors), ctypes.byref(cfg), ctx, threads)
        if not handle:
            raise AbiError(f"kf_engine_new refused: {self.error()}")
        self.handle = ctypes.c_void_p(handle)
        self.ctx = ctx
        self.design_id = self.lib.kf_design_id().decode()

    def error(self) -> str:
        return (self.lib.kf_last_error() or b"").decode(errors="replace")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise AbiError(f"{what} returned {rc} ({RETURN_CODES.get(rc, 'unknown code')}): {self.error()}")

    def prefill(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Logits (vocab,) of the last token, or (n, vocab) of every token."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32)
        out = np.empty((len(ids) if all_logits else 1, self.config.vocab), dtype=np.float32)
        self._check(self.lib.kf_prefill(self.handle, ids.ctypes.data, len(ids), out.ctypes.data, int(all_logits)),
                    "kf_prefill")
        return out if all_logits else out[0]

    def decode(self, token: int, out: np.ndarray | None = None) -> np.ndarray:
        logits = out if out is not None else np.empty(self.config.vocab, dtype=np.float32)
        self._check(self.lib.kf_decode_step(self.handle, int(token), logits.ctypes.data), "kf_decode_step")
        return logits

    def reset(self) -> None:
        self.lib.kf_reset(self.handle)

    @property
    def position(self) -> int:
        return int(self.lib.kf_position(self.handle))

    def free(self) -> None:
        if self.handle:
            self.lib.kf_engine_free(self.handle)
            self.handle = ctypes.c_void_p(0)

"""llama.cpp through llama-cpp-python on the same GGUF file: what most people run a small quantised model with on
a cpu. It computes on the Q4_1/Q8_0 blocks as stored (quantising activations to 8 bits for its dot products)
with an f16 KV cache (its default), so its roofline reads the file's formats and a 2-byte cache.

llama_cpp is imported only when an engine is built; where it is missing, `load` raises NotImportable. Build it
from its sdist for this host: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from kfactory.engines.baselines.result import NotImportable
from kfactory.engines.baselines.roofline import Formats
from kfactory.models import GGUFModel, load_model

NAME = "llama-cpp"
DEFAULT_STEPS = 64
#: the prompt batch (llama.cpp evaluates a prompt n_batch tokens at a time; 512 is its default)
N_BATCH = 512
#: the smallest context a Llama is created with; a larger capacity recreates it (rounded up to 256 positions)
MIN_CTX = 2048
#: llama.cpp's default KV cache type
KV_CACHE = "f16"


def _import_llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        raise NotImportable(f"llama_cpp is not importable by {sys.executable} ({e}); build it: "
                            "CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install llama-cpp-python, or name an "
                            "interpreter that has it") from e
    return llama_cpp


class LlamaCpp:
    """llama_cpp.Llama behind the baselines' Engine protocol: batch 1, its own KV cache, logits of the last
    position only (logits_all=False)."""
    name = NAME
    weights_format = "q4_1"

    def __init__(self, model: GGUFModel, threads: int):
        self.llama_cpp = _import_llama_cpp()
        self.path, self.threads, self.config = str(model.path), threads, model.config
        self.formats = Formats.from_gguf(model.formats(), model.config, kv_cache=KV_CACHE)
        self.weights_format = self.formats.label
        self.llm: Any = None
        self.n_ctx = 0

    def reset(self, capacity: int) -> None:
        if self.llm is None or capacity > self.n_ctx:
            self.llm = None                                   # free the old context before making a bigger one
            self.n_ctx = max(MIN_CTX, -(-capacity // 256) * 256)
            self.llm = self.llama_cpp.Llama(model_path=self.path, n_ctx=self.n_ctx, n_threads=self.threads,
                                            n_threads_batch=self.threads, n_batch=N_BATCH, logits_all=False,
                                            verbose=False)
        self.llm.reset()                                      # the next eval drops the cache past position 0

    def _argmax(self) -> int:
        # logits_all=False: llama-cpp-python keeps no scores, so read the last output row from the context
        ptr = self.llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))))

    def prefill(self, tokens: Sequence[int]) -> int:
        self.llm.eval(list(tokens))
        return self._argmax()

    def decode(self, token: int) -> int:
        self.llm.eval([token])
        return self._argmax()


def load(model_name: str, threads: int) -> LlamaCpp:
    _import_llama_cpp()                                      # not importable: say so before opening the model
    return LlamaCpp(load_model(model_name).open(), threads)

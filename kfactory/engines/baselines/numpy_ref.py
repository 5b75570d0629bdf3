"""The float64 numpy reference (kfactory.models.Reference) as a baseline: what the judge's truth costs to run.

It computes on float64 copies of the dequantised weights, with a float64 cache, through numpy's BLAS (its threads
are set by the environment the child starts with: OPENBLAS_NUM_THREADS and friends)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from kfactory.engines.baselines.roofline import Formats
from kfactory.models import KVCache, Reference, load_model

NAME = "numpy-ref"
#: decode steps timed per context by default: a float64 step reads ~1 GB of weights for SmolLM2, so a few
DEFAULT_STEPS = 4


class NumpyReference:
    """kfactory.models.Reference behind the baselines' Engine protocol."""
    name = NAME
    weights_format = "float64"
    formats = Formats.uniform("f64")

    def __init__(self, model_name: str):
        model = load_model(model_name).open()
        self.config = model.config
        self.ref = Reference.from_model(model)
        self.cache: KVCache | None = None

    def reset(self, capacity: int) -> None:
        # an explicit capacity: the default (the model's context length, 8192 for SmolLM2) would allocate
        # 750 MB of float64 cache and count it in the peak RSS
        self.cache = self.ref.new_cache(capacity)

    def prefill(self, tokens: Sequence[int]) -> int:
        logits, _ = self.ref.prefill(tokens, self.cache)
        return int(np.argmax(logits[-1]))

    def decode(self, token: int) -> int:
        assert self.cache is not None, "reset() first"
        return int(np.argmax(self.ref.decode(token, self.cache)))


def load(model_name: str, threads: int) -> NumpyReference:
    """The reference engine (`threads` is applied through the child's environment before numpy loads)."""
    return NumpyReference(model_name)

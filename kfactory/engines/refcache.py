"""The float64 reference's answers, computed once per (model file, question) and kept on disk.

The reference (kfactory.models.Reference) is slow on the real model (a 1000-token prefill and 192 greedy steps
take minutes), and its answers depend only on the weights file, the tokens asked and the reference's own code.
So each answer is stored under <data_dir>/engines/reference/<key>.npz, the key a sha256 of the file's sha256,
reference.py's source, the question's kind and its tokens. Logits are kept as float32: their rounding (6e-8
relative) is four orders of magnitude below any engine tolerance, and it halves the files.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from kfactory.models import GGUFModel, ModelPackage, Reference
from kfactory.models import reference as reference_module
from kfactory.models.loader import sha256_of


def default_dir() -> Path:
    from kfactory.platform.config import Settings
    return Path(Settings().data_dir) / "engines" / "reference"


@dataclass
class ReferenceCache:
    """Answers of one model's reference: `stream_logits` (every position of a token stream) and `greedy`
    (a greedy generation with the logits of each step); computed on a miss, read from disk on a hit."""
    package: ModelPackage
    model: GGUFModel
    directory: Path = field(default_factory=default_dir)
    hits: int = 0
    misses: int = 0
    _ref: Reference | None = None

    def __post_init__(self):
        self.directory = Path(self.directory)
        declared = getattr(self.package.spec.weights, "sha256", None)
        self.model_sha = declared or sha256_of(self.model.path)
        self.code_sha = hashlib.sha256(Path(reference_module.__file__).read_bytes()).hexdigest()

    @property
    def reference(self) -> Reference:
        if self._ref is None:
            self._ref = Reference.from_model(self.model)
        return self._ref

    def _path(self, kind: str, tokens: Sequence[int], extra: int) -> Path:
        key = json.dumps([self.model_sha, self.code_sha, kind, [int(t) for t in tokens], extra])
        return self.directory / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"

    def _load(self, path: Path) -> dict[str, np.ndarray] | None:
        if not path.is_file():
            return None
        try:
            with np.load(path) as f:
                data = {k: f[k] for k in f.files}
        except (OSError, ValueError):   # a torn or foreign file: recompute and replace it
            return None
        self.hits += 1
        return data

    def _store(self, path: Path, logits: np.ndarray, tokens: np.ndarray | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        if tokens is None:
            np.savez(tmp, logits=logits)
        else:
            np.savez(tmp, logits=logits, tokens=tokens)
        os.replace(tmp, path)   # atomic: a concurrent reader sees the whole file or none
        self.misses += 1

    def stream_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits (n, vocab) at every position of `tokens` prefilled from an empty cache."""
        path = self._path("stream", tokens, 0)
        found = self._load(path)
        if found is not None:
            return found["logits"]
        logits, _ = self.reference.prefill(list(tokens))
        out = logits.astype(np.float32)
        self._store(path, out)
        return out

    def greedy(self, prompt: Sequence[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
        """(the greedy tokens after `prompt`, no stop token, and the logits (new_tokens, vocab) each was chosen
        from)."""
        path = self._path("greedy", prompt, new_tokens)
        found = self._load(path)
        if found is not None:
            return [int(t) for t in found["tokens"]], found["logits"]
        gen = self.reference.generate(list(prompt), new_tokens, keep_logits=True)
        assert gen.logits is not None
        logits = gen.logits.astype(np.float32)
        self._store(path, logits, np.asarray(gen.tokens, dtype=np.int64))
        return gen.tokens, logits

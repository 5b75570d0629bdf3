"""Is a baseline computing the same model? Its logits and greedy tokens against kfactory.models.Reference (float64)
for the model's first chat prompt.

A baseline's speed means nothing if it runs a different network (a q/k permutation left undone still produces
fluent-looking logits). Torch eager computes on the same dequantised weights in fp32, so its logits must agree to
fp32 rounding and its greedy tokens must be identical; llama.cpp quantises activations to 8 bits for its dot
products, so its tokens are only reported."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from kfactory.engines.baselines.measure import Engine, greedy
from kfactory.models import GGUFModel, Reference, load_model


def chat_prompt(model: GGUFModel, model_name: str) -> list[int]:
    """The model package's first prompt rendered with its chat template, as token ids."""
    prompts = load_model(model_name).spec.prompts
    tok = model.tokenizer
    return tok.encode(tok.chat([{"role": "user", "content": prompts[0] if prompts else "Hello"}]))


def logit_agreement(got: np.ndarray, want: np.ndarray) -> dict:
    """How far logits (n, vocab) are from the reference's: the largest absolute difference, and the largest
    per-position difference relative to that position's reference spread (max - min)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = np.abs(got - want).max(axis=-1)
    spread = want.max(axis=-1) - want.min(axis=-1)
    return {"positions": int(want.shape[0]), "max_abs_diff": float(diff.max()),
            "max_diff_over_spread": float((diff / spread).max()), "min_spread": float(spread.min())}


def token_agreement(got: Sequence[int], want: Sequence[int]) -> dict:
    """Greedy tokens against the reference's: how many positions agree, and the common prefix (after the first
    divergence the two continue from different texts, so the prefix is the meaningful count)."""
    same = [a == b for a, b in zip(got, want)]
    prefix = same.index(False) if False in same else len(same)
    return {"tokens": len(want), "same_positions": int(sum(same)), "common_prefix": prefix,
            "identical": list(got) == list(want), "got": list(got), "want": list(want)}


def check_engine(engine: Engine, model: GGUFModel, model_name: str, new_tokens: int = 32) -> dict:
    """The engine against the reference on the model's first chat prompt: logits of the prompt's positions (when
    the engine exposes `logits(tokens)`) and `new_tokens` greedy tokens."""
    prompt = chat_prompt(model, model_name)
    ref = Reference.from_model(model)
    out: dict = {"name": engine.name, "prompt_tokens": len(prompt)}
    logits = getattr(engine, "logits", None)
    if logits is not None:
        out["logits"] = logit_agreement(logits(prompt), ref.prefill(prompt)[0])
    want = ref.generate(prompt, new_tokens).tokens
    out["greedy"] = token_agreement(greedy(engine, prompt, new_tokens), want)
    return out

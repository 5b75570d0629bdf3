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


def forced_agreement(engine: Engine, prompt: Sequence[int], want: Sequence[int]) -> dict:
    """Step-by-step agreement on the reference's own continuation (teacher forcing): the engine decodes the
    reference's tokens, and at each step its argmax is compared with the reference's next token. Unlike free
    greedy tokens, one near-tie early does not make every later step differ."""
    engine.reset(len(prompt) + len(want))
    got = [engine.prefill(prompt)]
    for tok in want[:-1]:
        got.append(engine.decode(tok))
    same = sum(a == b for a, b in zip(got, want))
    return {"tokens": len(want), "same_positions": int(same), "got": got}


def check_engine(engine: Engine, model: GGUFModel, model_name: str, new_tokens: int = 32) -> dict:
    """The engine against the reference on the model's first chat prompt: logits of the prompt's positions (when
    the engine exposes `logits(tokens)`) and `new_tokens` greedy tokens."""
    prompt = chat_prompt(model, model_name)
    ref = Reference.from_model(model)
    out: dict = {"name": engine.name, "prompt_tokens": len(prompt)}
    logits = getattr(engine, "logits", None)
    if logits is not None:
        out["logits"] = logit_agreement(logits(prompt), ref.prefill(prompt)[0])
    gen = ref.generate(prompt, new_tokens, keep_logits=True)
    want = gen.tokens
    out["greedy"] = token_agreement(greedy(engine, prompt, new_tokens), want)
    out["teacher_forced"] = forced_agreement(engine, prompt, want)
    assert gen.logits is not None
    top2 = np.sort(gen.logits, axis=-1)[:, -2:]
    # how close the reference's own choices were: a margin below an engine's rounding is a coin toss for it
    out["reference_margins"] = [float(m) for m in top2[:, 1] - top2[:, 0]]
    return out

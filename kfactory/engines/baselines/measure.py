"""The one measurement every baseline gets: decode tokens/s at batch 1 after a prefill to each context, prefill
tokens/s of one prompt, and peak RSS. An engine is anything with the `Engine` protocol; this module times it
the same way whatever computes underneath, so the figures compare.

Token ids are drawn at random (seeded) from the vocabulary: a dense model's speed does not depend on which
tokens it reads, and a fixed draw makes every engine run the same sequence.
"""
from __future__ import annotations

import time
from typing import Protocol, Sequence

import numpy as np

from kfactory.engines.baselines.result import OK, peak_rss_mb, release_freed_memory, reset_peak_rss
from kfactory.engines.baselines.roofline import Formats
from kfactory.models.gguf_model import LlamaConfig

SEED = 0
#: tokens of the untimed warm-up prefill and decode (first-call costs: thread pools, allocations, lazy init)
WARMUP_TOKENS = 8


class Engine(Protocol):
    """A baseline engine at batch 1 with its own KV cache. `reset(capacity)` empties the cache for up to
    `capacity` positions; `prefill` appends tokens to it and `decode` runs one token, each returning the argmax
    of its last position's logits (which forces the engine to finish the step, as generation would)."""
    name: str
    weights_format: str
    formats: Formats
    config: LlamaConfig

    def reset(self, capacity: int) -> None: ...

    def prefill(self, tokens: Sequence[int]) -> int: ...

    def decode(self, token: int) -> int: ...


def token_ids(vocab: int, n: int, seed: int = SEED) -> list[int]:
    """`n` token ids drawn uniformly from the vocabulary (seeded: every engine gets the same ones)."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, n)]


def greedy(engine: Engine, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """`new_tokens` greedy tokens after `prompt` (no stop token: every engine runs the same number of steps)."""
    engine.reset(len(prompt) + new_tokens)
    tokens = [engine.prefill(prompt)]
    while len(tokens) < new_tokens:
        tokens.append(engine.decode(tokens[-1]))
    return tokens


def time_decode(engine: Engine, context: int, steps: int) -> float:
    """Tokens/s of `steps` decode steps after prefilling `context` tokens (the prefill is not timed)."""
    ids = token_ids(engine.config.vocab, context + steps + 1)
    engine.reset(context + steps + 1)
    engine.prefill(ids[:context])
    engine.decode(ids[context])                     # warm-up step, untimed
    t0 = time.perf_counter()
    for tok in ids[context + 1:context + 1 + steps]:
        engine.decode(tok)
    return steps / (time.perf_counter() - t0)


def time_prefill(engine: Engine, n: int) -> float:
    """Tokens/s of one prefill of `n` tokens into an empty cache (after an untimed short warm-up prefill)."""
    ids = token_ids(engine.config.vocab, n, seed=SEED + 1)
    engine.reset(WARMUP_TOKENS)
    engine.prefill(ids[:WARMUP_TOKENS])
    engine.reset(n)
    t0 = time.perf_counter()
    engine.prefill(ids)
    return n / (time.perf_counter() - t0)


def measure(engine: Engine, threads: int, contexts: Sequence[int], prefill_tokens: int, steps: int) -> dict:
    """The baseline's result (kfactory.engines.baselines.result's shape), roofline fractions not yet filled
    (the parent process knows the host's ceilings)."""
    load_peak = peak_rss_mb()
    release_freed_memory()
    scope = "run" if reset_peak_rss() else "process"
    t0 = time.perf_counter()
    decode = {str(ctx): time_decode(engine, ctx, steps) for ctx in contexts}
    prefill = time_prefill(engine, prefill_tokens) if prefill_tokens else None
    return {"name": engine.name, "available": True, "status": OK, "reason": "", "threads": threads,
            "decode_tokens_per_s": decode, "prefill_tokens_per_s": prefill, "peak_rss_mb": peak_rss_mb(),
            "load_peak_rss_mb": load_peak, "peak_rss_scope": scope, "weights_format": engine.weights_format,
            "roofline_fraction": {},
            "formats": engine.formats.as_dict(), "config": engine.config.as_dict(), "decode_steps": steps,
            "prefill_tokens": prefill_tokens, "seconds": time.perf_counter() - t0}

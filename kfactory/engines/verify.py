"""An engine's verification against the float64 reference (issue 26, deliverable 4).

The engine computes on the same dequantised weights as the reference (the blocks dequantise to them), so its
only licence is fp32 rounding. Checks, each over many steps:

    prefill_N        prompts of N tokens (N in the plan's lengths: 1, 7, 100, 1000 on the real model), every
                     position's logits (the engine's all-logits prefill) against the reference's
    decode_after_N   `decode_steps` single steps after each prompt; after the longest prompt this is the
                     step after a long context, named long_context_N
    greedy_I         greedy generation of `greedy_tokens` tokens from prompt I (the model package's prompts
                     through the chat template; fixed token lists on a model without a chat template or with a
                     tiny vocabulary): the tokens identical to the reference's, and each step's logits in
                     tolerance while they are

A step's error is max |engine - reference| over the vocabulary divided by the reference logits' spread
(max - min) at that step: scale-free, so one tolerance serves a model whose logits span 10 and one whose logits
span 40. TOLERANCE = 1e-4. Measured worst steps of correct engines (fp32 accumulation, every check): 1.6e-6..4e-6
on tiny-llama (q4_1 and f32 designs), 2.9e-6 on smollm2-135m (30 blocks, 1000-token context, 64 greedy steps):
the bound leaves a margin of 25x and more for other summation orders and a scalar build. Convention errors
measure 0.4..1.2 on tiny-llama (RoPE on other pairs, another head grouping) and fail at their first wrong step.
The figures are in docs/engines.md.

The stream's tokens are the model's prompts' text, tokenised and repeated; the reference's answers are cached
on disk (kfactory.engines.refcache). The verdict is typed: passed, the figures of every check, the first
failing check and step, and the engine's fault when it crashed, timed out or refused a call.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from kfactory.engines.design import EngineDesign
from kfactory.engines.refcache import ReferenceCache, default_dir
from kfactory.engines.runner import EngineFault, EngineRunner
from kfactory.models import GGUFModel, load_model

TOLERANCE = 1e-4
#: a model with fewer tokens than this gets fixed greedy prompts (its chat text would not be a language)
CHAT_MIN_VOCAB = 1000
TINY_GREEDY_PROMPTS = ((1, 40, 41, 42, 43), (7, 99, 150, 3, 250, 12, 64), (2,))


@dataclass(frozen=True)
class Plan:
    """What a verification runs: prompt lengths (prefixes of one token stream), decode steps after each, and
    greedy generations of `greedy_tokens` from `greedy_prompts`."""
    prompt_lengths: tuple[int, ...]
    decode_steps: int
    greedy_tokens: int
    greedy_prompts: tuple[tuple[int, ...], ...]

    @property
    def capacity(self) -> int:
        """KV positions the engine needs."""
        return max(max(self.prompt_lengths) + self.decode_steps,
                   max(len(p) for p in self.greedy_prompts) + self.greedy_tokens)


def plan_for(model: GGUFModel, prompts: list[str], *, lengths: tuple[int, ...] | None = None,
             decode_steps: int = 4, greedy_tokens: int = 64) -> Plan:
    """The issue's plan: lengths 1, 7, 100, 1000 where the context allows (a shorter model gets lengths that
    fit, the longest ending `decode_steps` short of its context), greedy from the chat prompts."""
    ctx = model.config.context_length
    if lengths is None:
        lengths = tuple(n for n in (1, 7, 100, 1000) if n + decode_steps <= ctx)
        if max(lengths) < 1000:
            lengths += (ctx - decode_steps - 8,)
    tok = model.tokenizer
    if model.config.vocab >= CHAT_MIN_VOCAB and prompts:
        greedy = tuple(tuple(tok.encode(tok.chat([{"role": "user", "content": p}]))) for p in prompts)
    else:
        greedy = TINY_GREEDY_PROMPTS
    return Plan(tuple(lengths), decode_steps, greedy_tokens, greedy)


def stream_tokens(model: GGUFModel, prompts: list[str], n: int) -> list[int]:
    """n tokens of the prompts' text, tokenised and repeated (real text: the activations real use sees)."""
    text = " ".join(prompts) if prompts else "The quick brown fox jumps over the lazy dog."
    ids = model.tokenizer.encode(text + " ")
    if not ids:
        raise ValueError("the prompts tokenise to nothing")
    return (ids * (n // len(ids) + 1))[:n]


@dataclass
class CheckResult:
    """One check: `max_err` the worst step's error (relative to the spread), `max_abs_err` in logits,
    `first_failing_step` the first step over tolerance (or whose greedy token differs)."""
    name: str
    passed: bool
    steps: int = 0
    max_err: float = 0.0
    max_abs_err: float = 0.0
    first_failing_step: int | None = None
    detail: str = ""


@dataclass
class Verdict:
    """Passed when every check passed and the engine never faulted."""
    model: str
    design_id: str
    tolerance: float
    checks: list[CheckResult] = field(default_factory=list)
    fault: str | None = None
    fault_kind: str | None = None

    @property
    def passed(self) -> bool:
        return self.fault is None and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def first_failure(self) -> CheckResult | None:
        return next((c for c in self.checks if not c.passed), None)

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}

    def summary(self) -> str:
        lines = [f"{self.model} {self.design_id}: {'PASSED' if self.passed else 'FAILED'} "
                 f"(tolerance {self.tolerance:g} of the logits' spread)"]
        for c in self.checks:
            fail = f", first failing step {c.first_failing_step}" if c.first_failing_step is not None else ""
            detail = f"  {c.detail}" if c.detail else ""
            lines.append(f"  {c.name:<20} {'ok  ' if c.passed else 'FAIL'} steps {c.steps:>5}  "
                         f"max err {c.max_err:.2e} (abs {c.max_abs_err:.2e}){fail}{detail}")
        if self.fault:
            lines.append(f"  engine fault ({self.fault_kind}): {self.fault}")
        return "\n".join(lines)


def step_errors(engine: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(relative error, absolute error) per step of (steps, vocab) logits; a non-finite engine value is
    an infinite error."""
    engine, ref = np.atleast_2d(engine), np.atleast_2d(ref)
    rel, diff = np.empty(len(engine)), np.empty(len(engine))
    for i in range(0, len(engine), 64):   # in float64, 64 rows at a time (a 1000-token prompt's logits are large)
        with np.errstate(invalid="ignore", over="ignore"):   # a broken engine's NaN and inf are its errors here
            e, r = engine[i:i + 64].astype(np.float64), ref[i:i + 64].astype(np.float64)
            d = np.abs(e - r).max(axis=1)
        d[~np.isfinite(e).all(axis=1)] = np.inf
        spread = r.max(axis=1) - r.min(axis=1)
        diff[i:i + 64], rel[i:i + 64] = d, d / np.maximum(spread, np.finfo(np.float64).tiny)
    return rel, diff


def _logit_check(name: str, engine: np.ndarray, ref: np.ndarray, tol: float, offset: int = 0) -> CheckResult:
    rel, ab = step_errors(engine, ref)
    bad = np.flatnonzero(~(rel <= tol))
    return CheckResult(name, not bad.size, len(rel), float(rel.max()), float(ab.max()),
                       int(bad[0]) + offset if bad.size else None)


class Verifier:
    """Verifies engines of one model; the reference's answers are shared by every engine verified."""

    def __init__(self, model: str = "tiny-llama", *, cache_dir: Path | str | None = None,
                 reference_dir: Path | str | None = None, plan: Plan | None = None, tolerance: float = TOLERANCE):
        self.name = model
        self.package = load_model(model)
        self.cache_dir = cache_dir
        self.model = self.package.open(Path(cache_dir) if cache_dir is not None else None)
        prompts = list(self.package.spec.prompts)
        self.plan = plan or plan_for(self.model, prompts)
        self.tolerance = tolerance
        self.refs = ReferenceCache(self.package, self.model,
                                   Path(reference_dir) if reference_dir is not None else default_dir())
        longest = max(self.plan.prompt_lengths) + self.plan.decode_steps
        self.stream = stream_tokens(self.model, prompts, longest)

    def verify(self, design: EngineDesign, so_path: Path | str, *, timeout_s: float = 60.0) -> Verdict:
        """Run every check of the plan on the engine built at `so_path` (in a child process)."""
        verdict = Verdict(self.name, design.design_id(), self.tolerance)
        ref_stream = self.refs.stream_logits(self.stream)
        greedy_refs = [self.refs.greedy(p, self.plan.greedy_tokens) for p in self.plan.greedy_prompts]
        runner = EngineRunner(str(self.package.directory), design, so_path, self.plan.capacity,
                              cache_dir=self.cache_dir, timeout_s=timeout_s)
        current = "open"
        try:
            runner.start()
            longest = max(self.plan.prompt_lengths)
            for n in self.plan.prompt_lengths:
                current = f"prefill_{n}"
                runner.reset()
                verdict.checks.append(_logit_check(current, runner.prefill(self.stream[:n], all_logits=True),
                                                   ref_stream[:n], self.tolerance))
                current = f"{'long_context' if n == longest else 'decode_after'}_{n}"
                steps = [runner.decode(t) for t in self.stream[n:n + self.plan.decode_steps]]
                verdict.checks.append(_logit_check(current, np.stack(steps), ref_stream[n:n + len(steps)],
                                                   self.tolerance))
            for i, (prompt, (ref_tokens, ref_logits)) in enumerate(zip(self.plan.greedy_prompts, greedy_refs)):
                current = f"greedy_{i}"
                runner.reset()
                verdict.checks.append(self._greedy(current, runner, prompt, ref_tokens, ref_logits))
        except EngineFault as e:
            verdict.fault, verdict.fault_kind = str(e), e.kind
            verdict.checks.append(CheckResult(current, False, detail=f"engine fault ({e.kind}): {e}"))
        finally:
            runner.close()
        return verdict

    def _greedy(self, name: str, runner: EngineRunner, prompt: tuple[int, ...], ref_tokens: list[int],
                ref_logits: np.ndarray) -> CheckResult:
        """The engine's own greedy tokens (argmax, lowest id on ties, as the reference) against the
        reference's; logits compared at each step while the tokens agree."""
        logits = runner.prefill(prompt)
        got: list[np.ndarray] = []
        for step, want in enumerate(ref_tokens):
            got.append(logits)
            token = int(np.argmax(logits))
            if token != want:
                res = _logit_check(name, np.stack(got), ref_logits[:len(got)], self.tolerance)
                top = np.sort(ref_logits[step])[-2:]
                spread = float(ref_logits[step].max() - ref_logits[step].min())
                res.passed, res.first_failing_step = False, step
                res.detail = (f"token {step}: engine {token}, reference {want} (reference's top-2 margin "
                              f"{(top[1] - top[0]) / spread:.2e} of the spread)")
                return res
            if step + 1 < len(ref_tokens):
                logits = runner.decode(token)
        res = _logit_check(name, np.stack(got), ref_logits, self.tolerance)
        res.detail = f"{len(ref_tokens)} tokens identical"
        return res

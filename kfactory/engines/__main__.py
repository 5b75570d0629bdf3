"""`python -m kfactory.engines`: generate, build, verify and time engines from the command line.

    python -m kfactory.engines verify --model smollm2-135m [--design '{"threads": 2}'] [--quick]
    python -m kfactory.engines bench  --model smollm2-135m --threads 1 2 [--context 128] [--decode 32]
                                      [--greedy] [--design '{...}']

`verify` runs the full verification (kfactory.engines.verify; --quick: lengths 1, 7, 100 and one greedy prompt)
and exits 1 when it fails. `bench` times decode at the given context and prefill, per thread count, in the
engine's child, and reports the bytes a decode step reads (weights and KV cache) against this host's memory
bandwidth as the cpu target's probe measures it (kfactory.targets.cpu.ceiling), measured right after;
--greedy also checks 64 greedy tokens against the reference on the first prompt.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from dataclasses import replace

from kfactory.engines.build import build
from kfactory.engines.codegen import generate
from kfactory.engines.design import EngineDesign
from kfactory.engines.runner import EngineRunner
from kfactory.engines.verify import Plan, Verifier
from kfactory.platform.config import Settings
from kfactory.targets import get_target


def _design(text: str | None) -> EngineDesign:
    return EngineDesign.from_dict(json.loads(text)) if text else EngineDesign()


def _built(design: EngineDesign, verifier: Verifier):
    res = build(generate(design, verifier.model.config))
    if not res.ok:
        print(f"build failed ({res.command}):\n{res.log}", file=sys.stderr)
        sys.exit(2)
    return res.path


def cmd_verify(args) -> int:
    verifier = Verifier(args.model)
    if args.quick:
        p = verifier.plan
        verifier.plan = Plan(tuple(n for n in p.prompt_lengths if n <= 100), p.decode_steps, p.greedy_tokens,
                             p.greedy_prompts[:1])
    design = _design(args.design)
    verdict = verifier.verify(design, _built(design, verifier))
    print(verdict.summary())
    print(f"reference answers: {verifier.refs.hits} from the cache, {verifier.refs.misses} computed")
    if args.json:
        print(json.dumps(verdict.as_dict()))
    return 0 if verdict.passed else 1


def host_bandwidth(threads: int) -> float:
    """GB/s of the cpu target's bandwidth probe (kfactory.targets.cpu.ceiling), measured now in a scratch data
    dir: on a shared host the bandwidth moves with the load, and the roofline fraction should use the one
    measured beside the timing, not a figure cached on another day."""
    with tempfile.TemporaryDirectory(prefix="kf-ceiling-") as tmp:
        return get_target("cpu", Settings(data_dir=Path(tmp), threads=threads)).device().mem_bandwidth_gbps


def cmd_bench(args) -> int:
    verifier = Verifier(args.model)
    base = _design(args.design)
    for threads in args.threads:
        design = replace(base, threads=threads)
        path = _built(design, verifier)
        with EngineRunner(str(verifier.package.directory), design, path, args.context + args.decode + 8) as runner:
            fig = runner.bench(args.context, args.decode, args.repeats)
        c = verifier.model.config
        # a step reads every weight once (the LM head is the embedding) and the KV cache up to its context
        step_bytes = runner.info["weight_bytes"] + 2 * 4 * c.blocks * c.kv_heads * c.head_dim * args.context
        gbps = host_bandwidth(threads)
        roof = f"{100 * step_bytes * fig.decode_tok_s / 1e9 / gbps:.0f}%" if gbps else "unknown"
        print(f"{design.design_id()} threads {threads}: decode {fig.decode_tok_s:.1f} tok/s at context "
              f"{args.context} (median of {len(fig.step_s)} steps), prefill {fig.prefill_tok_s:.1f} tok/s "
              f"({args.context} tokens); {step_bytes / 1e6:.1f} MB read per step = "
              f"{step_bytes * fig.decode_tok_s / 1e9:.2f} GB/s; host bandwidth (kfactory's cpu ceiling) "
              f"{gbps:.2f} GB/s -> {roof} of the roofline", flush=True)
    if args.greedy:
        p = verifier.plan
        verifier.plan = Plan((1,), 1, p.greedy_tokens, p.greedy_prompts[:1])
        verdict = verifier.verify(base, _built(base, verifier))
        g = verdict.check("greedy_0")
        print(f"greedy {p.greedy_tokens} tokens on prompt 0: {'identical' if g.passed else 'DIFFERENT'} "
              f"({g.detail}; max logit error {g.max_err:.2e} of the spread)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kfactory.engines", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="verify one design against the float64 reference")
    v.add_argument("--model", default="tiny-llama")
    v.add_argument("--design", help="the design as JSON (fields of EngineDesign; defaults for the rest)")
    v.add_argument("--quick", action="store_true", help="prompt lengths up to 100 and one greedy prompt")
    v.add_argument("--json", action="store_true", help="also print the verdict as JSON")
    b = sub.add_parser("bench", help="time decode and prefill per thread count")
    b.add_argument("--model", default="tiny-llama")
    b.add_argument("--design", help="the design as JSON (threads is set by --threads)")
    b.add_argument("--threads", type=int, nargs="+", default=[1])
    b.add_argument("--context", type=int, default=128)
    b.add_argument("--decode", type=int, default=32, help="decode steps timed after the context")
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--greedy", action="store_true", help="also check 64 greedy tokens on the first prompt")
    args = ap.parse_args(argv)
    return cmd_verify(args) if args.cmd == "verify" else cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())

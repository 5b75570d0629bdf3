"""`python -m kfactory.engines`: generate, build, verify and time engines from the command line.

    python -m kfactory.engines verify --model smollm2-135m [--design '{"threads": 2}'] [--quick]
    python -m kfactory.engines bench  --model smollm2-135m --threads 1 2 [--context 128] [--decode 32]
                                      [--greedy] [--design '{...}']

`verify` runs the full verification (kfactory.engines.verify; --quick: lengths 1, 7, 100 and one greedy prompt)
and exits 1 when it fails. `bench` times decode at the given context and prefill, per thread count, in the
engine's child, and reports the bytes a decode step reads (weights and KV cache) against the cpu target's
ceilings at that thread count (kfactory.targets.cpu.ceiling, cached per host; --fresh-ceilings measures them
now): "roof (read)" against the read-only stream, the roofline of a decode step, which reads and writes almost
nothing, and "roof (copy)" against the copy stream (read + write), which a read stream exceeds; and the bound the
read bandwidth puts on any fp32 forward (torch eager reads every weight as float32); --greedy also checks 64
greedy tokens against the reference on the first prompt.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from kfactory.engines.baselines.roofline import COPY_GBPS, READ_GBPS, host_ceilings
from kfactory.engines.build import build
from kfactory.engines.codegen import generate
from kfactory.engines.design import DesignError, EngineDesign
from kfactory.engines.runner import EngineRunner
from kfactory.engines.verify import Plan, Verifier
from kfactory.platform.config import Settings


def _design_fields(text: str | None) -> dict:
    try:
        fields = json.loads(text) if text else {}
    except ValueError as e:
        raise DesignError(f"--design is not JSON: {e}") from e
    if not isinstance(fields, dict):
        raise DesignError("--design must be a JSON object of EngineDesign fields")
    return fields


def _design(text: str | None) -> EngineDesign:
    return EngineDesign.from_dict(_design_fields(text))


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


def _roof(achieved_gbps: float, ceilings: dict[str, float], name: str, what: str) -> str:
    gbps = ceilings[name]
    return f"roof ({what}) {100 * achieved_gbps / gbps:.0f}% of {gbps:.2f} GB/s" if gbps else f"roof ({what}) -"


def cmd_bench(args) -> int:
    verifier = Verifier(args.model)
    # on a shared host the bandwidth moves with the load: --fresh-ceilings measures it beside the timing, in a
    # scratch data dir, instead of reading the figures cached on another day
    fresh = Settings(data_dir=Path(tempfile.mkdtemp(prefix="kf-ceilings-"))) if args.fresh_ceilings else None
    try:
        return _bench(args, verifier, fresh)
    finally:
        if fresh is not None:
            shutil.rmtree(fresh.data_dir, ignore_errors=True)


def _bench(args, verifier: Verifier, fresh: Settings | None) -> int:
    fields = _design_fields(args.design)
    base = EngineDesign.from_dict(fields).at_threads(1)
    for threads in args.threads:
        design = EngineDesign.from_dict(fields).at_threads(threads)
        path = _built(design, verifier)
        with EngineRunner(str(verifier.package.directory), design, path, args.context + args.decode + 8) as runner:
            fig = runner.bench(args.context, args.decode, args.repeats)
        ceilings = host_ceilings(threads, fresh)
        read_gbps = ceilings[READ_GBPS]
        c = verifier.model.config
        # a step reads every weight once (the LM head is the embedding) and the KV cache up to its context
        kv_bytes = 2 * 4 * c.blocks * c.kv_heads * c.head_dim * args.context
        step_bytes = runner.info["weight_bytes"] + kv_bytes
        fp32_bytes = 4 * sum(int(np.prod(shape)) for shape in c.expected_shapes().values()) + kv_bytes
        achieved = step_bytes * fig.decode_tok_s / 1e9
        fp32_bound = f"{read_gbps * 1e9 / fp32_bytes:.1f} tok/s" if read_gbps else "- (no read ceiling)"
        print(f"{design.design_id()} threads {threads}: decode {fig.decode_tok_s:.1f} tok/s at context "
              f"{args.context} (median of {len(fig.step_s)} steps), prefill {fig.prefill_tok_s:.1f} tok/s "
              f"({args.context} tokens); {step_bytes / 1e6:.1f} MB read per step = {achieved:.2f} GB/s = "
              f"{_roof(achieved, ceilings, READ_GBPS, 'read')}, {_roof(achieved, ceilings, COPY_GBPS, 'copy')}; "
              f"an fp32 forward (torch eager's weights, {fp32_bytes / 1e6:.0f} MB a step) is bounded by "
              f"{fp32_bound} here", flush=True)
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
    b.add_argument("--fresh-ceilings", action="store_true",
                   help="measure the cpu target's ceilings now (read, copy, peak; ~20 s a thread count), neither "
                        "reading nor writing the shared cache")
    args = ap.parse_args(argv)
    try:
        return cmd_verify(args) if args.cmd == "verify" else cmd_bench(args)
    except DesignError as e:
        print(f"bad design: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

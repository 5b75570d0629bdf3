"""Two versions of the engine's C code side by side: decode and prefill tok/s of the same design built from the C
files at a git revision and from the working tree, timed alternately in one run, and whether their logits are
bit-identical. With --against instead of --base, two designs of the working tree: --design is the base and
--against the new (their logits then differ by design; the print says by how much).

    python bench/engine_ab.py --base REV [--model smollm2-135m] [--design JSON] [--context 128] [--rounds 8]
        [--steps 32] [--json OUT]
    python bench/engine_ab.py --design JSON --against JSON [...]

Each version runs in its own engine child (kfactory.engines.runner), both open at once (a spinning design's
children one at a time: started for each request and closed after it, as their threads spin); a round times one
`bench` request (a prefill of --context tokens, then --steps decode steps) in each, in turn, so that the load
of a shared host falls on both alike (each goes first in every other round). Decode tok/s per round is the
median step's; the ratio new/base is taken per round and its median, min and max printed (a single round's
ratio moves with the host; the median of pairs does not). The logits of a prefill of 7 tokens (a tile of 4
and 3 leftovers) and of --steps decode steps after it are compared exactly: a change meant to reorder nothing
must print `bit-identical: True`.

Only the files of kfactory/engines/c/ differ between the two: the generator, the design and the tensors'
preparation are the working tree's in both.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from kfactory.engines.build import build
from kfactory.engines.codegen import C_DIR, C_FILES, generate
from kfactory.engines.design import EngineDesign
from kfactory.engines.runner import EngineRunner
from kfactory.models import load_model
from kfactory.platform.config import Settings

ROOT = Path(__file__).resolve().parent.parent


def base_source(current: str, rev: str) -> str:
    """`current` (the working tree's generated source) with each C file replaced by its text at `rev`."""
    out = current
    for name in C_FILES:
        rel = (C_DIR / name).relative_to(ROOT)
        if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}:{rel}"], capture_output=True).returncode:
            out = out.replace((C_DIR / name).read_text(), "")   # a file that revision did not have yet
            continue
        try:
            old = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True, text=True,
                                 check=True).stdout
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"cannot read {rel} at {rev!r}: {e.stderr.strip()}") from e
        out = out.replace((C_DIR / name).read_text(), old)
    return out


def logits(runner: EngineRunner, steps: int, vocab: int) -> np.ndarray:
    runner.reset()
    rows = [runner.prefill([(7919 * i) % (vocab - 200) + 100 for i in range(7)])]
    rows += [runner.decode(300 + i) for i in range(steps)]
    return np.stack(rows)


def _alone(runner: EngineRunner, alone: bool, work):
    """work() on `runner`; when `alone`, in a child started for it and closed after it (no other engine open)."""
    if not alone:
        return work()
    runner.start()
    try:
        return work()
    finally:
        runner.close()


def _warm_bench(runner: EngineRunner, fresh: bool, context: int, steps: int):
    """One bench request; a fresh child first runs a short one (its first steps take the page faults)."""
    if fresh:
        runner.bench(context, 4, 1)
    return runner.bench(context, steps, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--base", help="git revision whose kfactory/engines/c/ files are the base")
    which.add_argument("--against", help="a second design (EngineDesign fields as JSON): the new, --design the base")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--design", default="{}", help="EngineDesign fields as JSON (default: the default design)")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    design = EngineDesign.from_dict(json.loads(args.design))
    designs = {"base": design, "new": EngineDesign.from_dict(json.loads(args.against)) if args.against else design}
    data = Path(Settings().data_dir)
    model = load_model(args.model).open(data / "models")
    new = generate(designs["new"], model.config)
    sources = {"base": base_source(new, args.base) if args.base else generate(design, model.config), "new": new}
    if sources["base"] == new:
        print(f"note: kfactory/engines/c/ is the same at {args.base} and in the working tree", file=sys.stderr)
    libs = {}
    for name, src in sources.items():
        res = build(src, data / "engines")
        if not res.ok or res.path is None:
            raise SystemExit(f"{name} does not build:\n{res.log[-3000:]}")
        libs[name] = res.path
    ctx = max(args.context, 7) + args.steps + 8
    decode: dict[str, list[float]] = {k: [] for k in libs}
    prefill: dict[str, list[float]] = {k: [] for k in libs}
    runners = {k: EngineRunner(args.model, designs[k], p, ctx, cache_dir=data / "models") for k, p in libs.items()}
    # a spinning design's threads spin between requests too: two such engines open at once would take each
    # other's cores (on 2 cores, base and new measured 0.01x to 104x of each other), so each runs alone
    alone = any(d.spin for d in designs.values())
    try:
        if not alone:
            for r in runners.values():
                r.start()
        base_logits, new_logits = (_alone(r, alone, lambda r=r: logits(r, args.steps, model.config.vocab))
                                   for r in runners.values())
        same = np.array_equal(base_logits, new_logits)
        for i in range(args.rounds):
            # each goes first in every other round: a host whose load drifts within a round favours neither
            for name, r in (runners.items() if i % 2 == 0 else reversed(runners.items())):
                fig = _alone(r, alone, lambda r=r: _warm_bench(r, alone, args.context, args.steps))
                decode[name].append(fig.decode_tok_s)
                prefill[name].append(fig.prefill_tok_s)
    finally:
        for r in runners.values():
            r.close()
    ratios = [n / b for n, b in zip(decode["new"], decode["base"])]
    out = {"base": args.base or design.design_id(), "design_id": designs["new"].design_id(),
           "context": args.context, "rounds": args.rounds,
           "decode_tok_s": {k: statistics.median(v) for k, v in decode.items()},
           "prefill_tok_s": {k: statistics.median(v) for k, v in prefill.items()},
           "decode_ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
           "bit_identical": bool(same), "max_abs_logit_difference": float(np.max(np.abs(new_logits - base_logits)))}
    print(f"{out['base']} -> {out['design_id']} after {args.context} tokens, {args.rounds} rounds: decode base "
          f"{out['decode_tok_s']['base']:.1f} new {out['decode_tok_s']['new']:.1f} tok/s, new/base median "
          f"x{out['decode_ratio']['median']:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); prefill base "
          f"{out['prefill_tok_s']['base']:.1f} new {out['prefill_tok_s']['new']:.1f} tok/s; "
          f"bit-identical: {out['bit_identical']} (largest logit difference {out['max_abs_logit_difference']:.3g})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

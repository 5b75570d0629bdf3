"""Whether the engine's decode follows the host's read bandwidth from 1 to N threads: each round measures the
read probe at 1 and N threads and the int8 peak at N (as the cpu target's ceilings are measured, each in its
runner child), then kfactory's engine decoding after --context tokens at 1 and at N threads (each in its own
engine child, started for its run and closed after it). Rounds repeat, so a host whose memory bandwidth moves
shows whether the engine moves with it.

    python bench/engine_scaling.py [--model smollm2-135m] [--design JSON] [--threads 2] [--context 128]
        [--steps 32] [--rounds 6] [--json OUT]

An engine's tok/s is also given as the GB/s it would read at that rate (the bytes of one decode step as the
roofline counts them, kfactory.engines.baselines.roofline), so that it reads on the probe's scale. The summary
gives each figure's median and range over the rounds, the engine's N-thread GB/s over the N-thread probe per
round, and the correlation between the N-thread probe and the N-thread engine across the rounds (near 1: the
engine moves with the host's bandwidth; near 0 or below: something of its own bounds it).

The design is --design, else the engine campaign's best.json, else the default design (as bench/engine.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import build_design, checked_design, cpu_target, engine_formats  # noqa: E402  (bench/ is no package)

from kfactory.engines.baselines.roofline import decode_cost  # noqa: E402
from kfactory.engines.design import EngineDesign  # noqa: E402
from kfactory.engines.runner import EngineRunner  # noqa: E402
from kfactory.platform.config import Settings  # noqa: E402
from kfactory.targets.cpu.ceiling import measure_peak_int8_gops, measure_read_bandwidth  # noqa: E402


def int8_now(threads: int) -> float:
    """The host's int8 dot-product peak in GOP/s at `threads` threads, measured now (0 without such an op)."""
    return measure_peak_int8_gops(cpu_target(threads), threads)


def read_at(threads: int) -> float:
    """The read probe at exactly `threads` threads (the ceilings take the best of 1 and the count)."""
    return measure_read_bandwidth(cpu_target(threads), threads)


def decode_rate(model: str, design: EngineDesign, lib: Path, context: int, steps: int, cache: Path) -> float:
    """Decode tok/s (the median step) after `context` tokens, in an engine child started for it; its first short
    run takes the page faults of a fresh child."""
    with EngineRunner(model, design, lib, context + steps + 8, cache_dir=cache, timeout_s=120.0) as runner:
        runner.bench(context, 4, 1)
        return runner.bench(context, steps, 1).decode_tok_s


def _span(values: list[float], fmt: str) -> str:
    return f"median {statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--design", help="EngineDesign fields as JSON (default: best.json's, else the default design)")
    ap.add_argument("--threads", type=int, default=2, help="the thread count set against 1 (2 or more)")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", help="write every round and the summary here")
    args = ap.parse_args(argv)
    if args.threads < 2 or args.rounds < 1 or args.context < 1 or args.steps < 1:
        ap.error("--threads must be 2 or more; --rounds, --context and --steps 1 or more")
    fields, source, kernels, model = checked_design(ap, args)
    data = Path(Settings().data_dir)
    designs = {n: EngineDesign.from_dict(fields).at_threads(n) for n in (1, args.threads)}
    libs = {}
    for n, d in designs.items():
        lib = build_design(d, model.config, kernels)
        if not lib.ok or lib.path is None:
            raise SystemExit(f"the design at {n} threads does not build: {lib.log.strip()[-2000:]}")
        libs[n] = lib.path
    step_bytes = decode_cost(model.config, engine_formats(designs[1], model),
                             args.context + (args.steps + 1) / 2).bytes
    print(f"{designs[args.threads].design_id()} ({source}); a decode step after {args.context} tokens reads "
          f"{step_bytes / 1e6:.1f} MB", flush=True)
    rounds = []
    for i in range(args.rounds):
        r = {"read_1_gbps": read_at(1), f"read_{args.threads}_gbps": read_at(args.threads),
             f"int8_{args.threads}_gops": int8_now(args.threads)}
        for n in (1, args.threads):
            rate = decode_rate(args.model, designs[n], libs[n], args.context, args.steps, data / "models")
            r[f"engine_{n}_tok_s"] = rate
            r[f"engine_{n}_gbps_equiv"] = rate * step_bytes / 1e9
        r["engine_over_read"] = r[f"engine_{args.threads}_gbps_equiv"] / r[f"read_{args.threads}_gbps"]
        rounds.append(r)
        print(f"round {i + 1}: read 1t {r['read_1_gbps']:.1f} {args.threads}t {r[f'read_{args.threads}_gbps']:.1f} "
              f"GB/s, int8 {r[f'int8_{args.threads}_gops']:.0f} GOP/s | engine 1t {r['engine_1_tok_s']:.0f} tok/s "
              f"({r['engine_1_gbps_equiv']:.1f} GB/s), {args.threads}t {r[f'engine_{args.threads}_tok_s']:.0f} tok/s "
              f"({r[f'engine_{args.threads}_gbps_equiv']:.1f} GB/s, {r['engine_over_read']:.0%} of the probe)",
              flush=True)
    n = args.threads
    summary: dict[str, object] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                                  for k in rounds[0] for v in [[r[k] for r in rounds]]}
    reads, engines = [r[f"read_{n}_gbps"] for r in rounds], [r[f"engine_{n}_tok_s"] for r in rounds]
    corr = float(np.corrcoef(reads, engines)[0, 1]) if len(rounds) > 2 and np.std(reads) and np.std(engines) else None
    summary["correlation_read_engine"] = corr
    print(f"over {len(rounds)} rounds: read {n}t {_span(reads, '.1f')} GB/s; engine {n}t {_span(engines, '.0f')} "
          f"tok/s = {_span([r[f'engine_{n}_gbps_equiv'] for r in rounds], '.1f')} GB/s; of the probe "
          f"{_span([r['engine_over_read'] for r in rounds], '.0%')}; correlation of probe and engine across rounds "
          f"{'n/a' if corr is None else f'{corr:+.2f}'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"design": designs[n].as_dict(), "design_source": source,
                                               "context": args.context, "steps": args.steps,
                                               "step_bytes": step_bytes, "rounds": rounds, "summary": summary},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

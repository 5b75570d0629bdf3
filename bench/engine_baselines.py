"""The engine bench's baselines side by side: decode tokens/s at batch 1 after prefilling 128 and 1024 tokens,
prefill tokens/s of a 512-token prompt, peak RSS and the fraction of each engine's roofline on this host, for the
float64 numpy reference, torch eager (transformers, fp32, same weights) and llama.cpp (llama-cpp-python, same
GGUF file). Each engine runs in its own subprocess; one whose library is missing is shown with the reason.

    python bench/engine_baselines.py [--threads 1,2] [--baseline-python PY] [--python NAME=PY]
        [--model smollm2-135m] [--only numpy-ref,torch-eager] [--json OUT]

torch and llama_cpp may live in other virtual environments: --baseline-python names the interpreter every
baseline runs with (it must import kfactory), --python NAME=PY one baseline's own.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kfactory.engines.baselines import BASELINES, CONTEXTS, PREFILL_TOKENS, run_baseline
from kfactory.engines.baselines.report import table
from kfactory.engines.baselines.roofline import COPY_GBPS, PEAK_GFLOPS, PEAK_INT8_GOPS, READ_GBPS, host_ceilings
from kfactory.platform.config import Settings


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_arguments(ap: argparse.ArgumentParser, threads: str, only_help: str, steps_help: str) -> None:
    """The flags every engine bench takes (bench/engine.py adds its own after these)."""
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", default=threads, help="thread counts, comma-separated")
    ap.add_argument("--baseline-python", help="interpreter for every baseline (default: this one)")
    ap.add_argument("--python", action="append", default=[], metavar="NAME=PY",
                    help="interpreter for one baseline (repeatable)")
    ap.add_argument("--only", default=",".join(BASELINES), help=only_help)
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--prefill", type=int, default=PREFILL_TOKENS)
    ap.add_argument("--steps", type=int, default=0, help=steps_help)
    ap.add_argument("--fresh-ceilings", action="store_true",
                    help="measure the host's ceilings now, neither reading nor writing the shared cache")
    ap.add_argument("--json", help="write the results here")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap, str(os.cpu_count() or 1), "baselines to run, comma-separated",
                  "decode steps per context (0: each baseline's default)")
    return ap.parse_args(argv)


def interpreters(args: argparse.Namespace) -> dict[str, str | None]:
    """The interpreter of each baseline: its --python, else --baseline-python, else this one."""
    own = dict(item.split("=", 1) for item in args.python)
    unknown = set(own) - set(BASELINES)
    if unknown:
        raise SystemExit(f"--python names unknown baselines {sorted(unknown)}; known: {', '.join(BASELINES)}")
    return {name: own.get(name, args.baseline_python) for name in BASELINES}


def run_named(args: argparse.Namespace, names: list[str], pythons: dict, threads: int, ceilings: dict) -> list[dict]:
    """Each named baseline at `threads`, in its own subprocess, with a progress line each (bench/engine.py runs
    them beside kfactory's engine the same way)."""
    results = []
    for name in names:
        t0 = time.perf_counter()
        r = run_baseline(name, args.model, threads, pythons.get(name), contexts=_ints(args.contexts),
                         prefill=args.prefill, steps=args.steps, ceilings=ceilings)
        r["python"] = pythons.get(name) or sys.executable
        print(f"  {name} ({threads} threads): {r['status']} in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
        results.append(r)
    return results


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def roofline_lines(results: list[dict], ceilings: dict[str, dict]) -> list[str]:
    """Per thread count its ceilings, and per engine that ran its roofline fractions against both bandwidths:
    "roof (read)" (the table's roof columns: a forward reads and hardly writes) and "roof (copy)" (the copy probe's
    read + write figure, which flatters an engine where a read stream is faster)."""
    lines = [f"ceilings at {t} threads: read {c.get(READ_GBPS, 0.0):.1f} GB/s, copy {c.get(COPY_GBPS, 0.0):.1f} "
             f"GB/s, peak {c.get(PEAK_GFLOPS, 0.0):.1f} GFLOP/s, int8 {c.get(PEAK_INT8_GOPS, 0.0):.1f} GOP/s"
             for t, c in ceilings.items()]
    for r in results:
        per = r.get("roofline", {}).get("per_token", {})
        if per:
            lines.append(f"{r['name']} ({r['threads']} threads): " + ", ".join(
                f"{key} roof (read) {_pct(d['fraction'])} roof (copy) {_pct(d['fraction_copy'])}"
                for key, d in per.items()))
    return lines


def run(args: argparse.Namespace) -> dict:
    names = [n for n in args.only.split(",") if n]
    pythons = interpreters(args)
    results, ceilings, load_before = [], {}, os.getloadavg()
    fresh = Settings(data_dir=Path(tempfile.mkdtemp(prefix="kf-ceilings-"))) if args.fresh_ceilings else None
    for threads in _ints(args.threads):
        # measured before any baseline runs, with nothing else of ours on the cores (cached per thread count)
        ceilings[str(threads)] = host_ceilings(threads, fresh)
        results.extend(run_named(args, names, pythons, threads, ceilings[str(threads)]))
    if fresh is not None:
        shutil.rmtree(fresh.data_dir, ignore_errors=True)
    return {"model": args.model, "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                                          "load_average": {"before": load_before, "after": os.getloadavg()}},
            "ceilings": ceilings, "results": results}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    out = run(args)
    print(table(out["results"]))
    for r in out["results"]:
        if r.get("roofline", {}).get("warning"):
            print(f"{r['name']} ({r['threads']} threads): {r['roofline']['warning']}")
    print("\n".join(roofline_lines(out["results"], out["ceilings"])))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Call each cuda baseline of a problem once per shape, so that their JIT compilation (FLA's Triton kernels: tens
of seconds on a bare GPU machine, cached on disk in ~/.triton/cache for later processes) happens here, timed,
instead of inside a campaign's time share. On 2026-12-04 the first H200 runs' KDA campaigns ran past their
limits while FLA's kernels compiled in their measurements, and the step after them found the cache warm.

    python scripts/gpu_warm_baselines.py PACKAGE_DIR --shape '{"B": 1, "T": 64, ...}' [--shape ...]
        [--skip torch] [--json OUT]

Prints one line per (baseline, shape) with its seconds and writes {"warmed": [...], "failed": [...],
"skipped": reason} to --json. A baseline that raises is reported and the others go on. Exit 0 unless the
arguments are wrong: a warm-up saves time, it decides nothing. The inputs are random values of each tensor's
dtype and shape (gates through logsigmoid, beta through sigmoid, as kda draws them): the values do not change
what is compiled.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TORCH_DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")


def _inputs(torch, problem, shape: dict) -> tuple[dict, dict]:
    """Device tensors for every input (random, of the problem's dtype) and output (empty)."""
    def make(t, out: bool):
        dims = problem.tensor_shape(t, shape)
        dtype = getattr(torch, t.dtype)
        if out:
            return torch.empty(dims, dtype=dtype, device="cuda")
        x = torch.randn(dims, dtype=torch.float32, device="cuda")
        if t.name == "g":
            x = torch.nn.functional.logsigmoid(x)
        elif t.name == "beta":
            x = torch.sigmoid(x)
        return x.to(dtype)
    ins = {t.name: make(t, False) for t in problem.spec.inputs}
    outs = {t.name: make(t, True) for t in problem.spec.outputs}
    return ins, outs


def warm(package: Path, shapes: list[dict], skip: set[str]) -> dict:
    """{"warmed": [{baseline, shape, seconds}], "failed": [{baseline, shape, error}]} or {"skipped": why}."""
    from kfactory.problems import load_problem

    problem = load_problem(package)
    fn = getattr(problem.reference, "cuda_baselines", None)
    found = fn(**problem.params) if fn else {}
    todo = {name: f for name, f in found.items() if name in problem.spec.baselines and name not in skip}
    if not todo:
        return {"skipped": "no cuda baseline can run here (no GPU, or none importable)"}
    bad = [t.dtype for t in problem.spec.inputs + problem.spec.outputs if t.dtype not in TORCH_DTYPES]
    if bad:
        return {"skipped": f"dtypes {bad} are not made here"}
    import torch

    done: dict = {"warmed": [], "failed": []}
    for shape in shapes:
        ins, outs = _inputs(torch, problem, shape)
        for name, call in todo.items():
            t0 = time.time()
            try:
                call(ins, outs)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a baseline's own failure: report it, warm the others
                done["failed"].append({"baseline": name, "shape": shape, "error": f"{type(e).__name__}: {e}"[:500]})
                print(f"{name} {shape}: failed: {type(e).__name__}: {e}"[:300], flush=True)
                continue
            done["warmed"].append({"baseline": name, "shape": shape, "seconds": round(time.time() - t0, 2)})
            print(f"{name} {shape}: {time.time() - t0:.1f}s", flush=True)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package", type=Path)
    ap.add_argument("--shape", action="append", type=json.loads, required=True, help="a shape as JSON (repeatable)")
    ap.add_argument("--skip", action="append", default=[], help="a baseline not to call (repeatable)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = warm(args.package, args.shape, set(args.skip))
    if "skipped" in result:
        print(f"baselines not warmed: {result['skipped']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One baseline in its own process, so that its peak RSS and its threads are its own:

    python -m kfactory.engines.baselines.child NAME --model M --threads T [--contexts 128,1024]
        [--prefill 512] [--steps N] [--check]

prints one line `KFACTORY_BASELINE <json>` on stdout: the measurements (kfactory.engines.baselines.result's
shape), or with --check the baseline's agreement with the reference (kfactory.engines.baselines.check). A baseline
whose library is missing prints a not_importable result; any other failure a failed result with its reason. The
parent sets the BLAS/OpenMP thread variables before this interpreter starts (they are read when numpy or torch
loads, before this module runs).
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback

from kfactory.engines.baselines.registry import MARKER, MODULES
from kfactory.engines.baselines.result import FAILED, NOT_IMPORTABLE, NotImportable, empty


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kfactory.engines.baselines.child", description=__doc__)
    p.add_argument("name", choices=sorted(MODULES))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--contexts", default="128,1024", help="decode contexts, comma-separated")
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens of the timed prefill (0: none)")
    p.add_argument("--steps", type=int, default=0, help="decode steps timed per context (0: the baseline's default)")
    p.add_argument("--check", action="store_true", help="compare with the reference instead of timing")
    p.add_argument("--check-tokens", type=int, default=32)
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    """The result of one baseline (never raises: a failure is a result with a status and a reason)."""
    try:
        module = importlib.import_module(MODULES[args.name])
        engine = module.load(args.model, args.threads)
        if args.check:
            from kfactory.engines.baselines.check import check_engine
            from kfactory.models import load_model
            return {"available": True, "status": "ok",
                    **check_engine(engine, load_model(args.model).open(), args.model, args.check_tokens)}
        from kfactory.engines.baselines.measure import measure
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
        return measure(engine, args.threads, contexts, args.prefill, args.steps or module.DEFAULT_STEPS)
    except NotImportable as e:
        return empty(args.name, args.threads, NOT_IMPORTABLE, str(e))
    except Exception as e:  # noqa: BLE001 - any failure of a third-party engine is reported, typed, not raised
        tail = traceback.format_exc().strip().splitlines()[-6:]
        return empty(args.name, args.threads, FAILED, f"{type(e).__name__}: {e} | " + " / ".join(tail))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    sys.stdout.flush()
    print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

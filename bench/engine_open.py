"""What it costs to start an engine's child, with the model's tensor index and without it, side by side.

Every verification and every timing round of an engine campaign starts a child process that opens the model,
prepares its tensors for the design and loads the engine (kfactory.engines.runner). Opening a GGUF file parses
all of its metadata, the tokenizer's ~98,000 strings included, unless the tensor index kept in the model cache
(kfactory.models.gguf_index) is there. This times `EngineRunner.start()` alternately with the index removed
before each start ("parse") and with it in place ("index"), in one run, and prints the medians, the child's own
open and prepare times, and their ratio.

    python bench/engine_open.py [--model smollm2-135m] [--design JSON] [--repeats 5] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kfactory.engines.build import build
from kfactory.engines.codegen import generate
from kfactory.engines.design import EngineDesign
from kfactory.engines.runner import EngineRunner
from kfactory.models import load_model


def _start(model: str, design: EngineDesign, so: Path, cache: Path) -> dict:
    t0 = time.perf_counter()
    with EngineRunner(model, design, so, 64, cache_dir=str(cache)) as runner:
        wall = time.perf_counter() - t0
        return {"start_s": wall, "open_s": runner.info["open_s"], "prepare_s": runner.info["prepare_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--design", default="{}", help="the design as JSON (fields of EngineDesign)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    design = EngineDesign.from_dict(json.loads(args.design))
    package = load_model(args.model)
    cache = Path(tempfile.mkdtemp(prefix="kf-engine-open-"))
    try:
        model = package.open(cache)   # writes the index (and a generated model's file) once
        res = build(generate(design, model.config))
        if res.path is None:
            print(f"build failed ({res.command}):\n{res.log}", file=sys.stderr)
            return 2
        runs: dict[str, list[dict]] = {"parse": [], "index": []}
        for i in range(args.repeats):
            # each arm goes first in every other round, so that a shared host's load falls on both alike
            for arm in (("parse", "index") if i % 2 == 0 else ("index", "parse")):
                if arm == "parse":
                    shutil.rmtree(cache / "gguf-index", ignore_errors=True)
                runs[arm].append(_start(str(package.directory), design, res.path, cache))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    out = {arm: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for arm, rs in runs.items()}
    for arm, fig in out.items():
        print(f"{arm:6s} start {fig['start_s']:.2f} s (child: open {fig['open_s']:.2f} s, prepare "
              f"{fig['prepare_s']:.2f} s), median of {args.repeats}")
    ratio = out["parse"]["start_s"] / out["index"]["start_s"]
    print(f"{args.model} {design.design_id()}: an engine child starts x{ratio:.2f} faster with the index")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "design": design.design_id(),
                                               "repeats": args.repeats, **out, "speedup": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

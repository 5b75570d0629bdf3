"""What the objective decides: one family searched twice, scored by its first shape alone and by weights.

Builds two copies of a small softmax package (64x1000 and 1x5000) whose only family is tests/objective/ (honest
kernels, each slow at one shape), one without weights and one with `--weights` (default 1 and 50: a workload that
runs 1x5000 fifty times for each 64x1000), runs `kfactory run` on each in a fresh workspace, and prints each
campaign's result and what it costs the weighted workload by its own measured medians, side by side: the ratio
is how much slower, for that workload, the kernel the first shape picked is than the one the weights picked.

    python bench/objective.py [--weights 1 50] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from kfactory.problems import BUILTIN_DIR

FAMILY = Path(__file__).resolve().parent.parent / "tests" / "objective"
SHAPES = {"optimize": [{"rows": 64, "cols": 1000}, {"rows": 1, "cols": 5000}],
          "verify": [{"rows": 3, "cols": 17}, {"rows": 5, "cols": 1027}]}


def package(root: Path, weights: list[float] | None) -> Path:
    """The small softmax package with tests/objective/ as its one family, weighed by `weights` (None: not)."""
    dst = root / "softmax"
    shutil.copytree(BUILTIN_DIR / "softmax", dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"] = {**SHAPES, "verify": SHAPES["verify"] + spec["shapes"]["verify"]}
    if weights is not None:
        spec["shapes"]["weights"] = weights
    shutil.rmtree(dst / "families")
    shutil.copytree(FAMILY, dst / "families" / "cpu_weighted")
    spec["families"] = ["cpu_weighted"]
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dst


def campaign(root: Path, weights: list[float] | None) -> dict:
    """`kfactory run` of the package in a workspace of its own: its summary."""
    out = root / "summary.json"
    env = {**os.environ, "KFACTORY_DATA_DIR": str(root / "data")}
    subprocess.run([sys.executable, "-m", "kfactory.cli.main", "run", str(package(root, weights)), "--target", "cpu",
                    "--strategy", "grid", "--budget", "4", "--parallel", "1", "--warm", "0", "--quiet",
                    "--json", str(out)], check=True, env=env, cwd=root)
    return json.loads(out.read_text())


def workload_s(best: dict, weights: list[float]) -> float:
    """What the result costs the weighted workload, by its own medians."""
    medians = [best["shapes"][f"{s['rows']}x{s['cols']}"]["median_seconds"] for s in SHAPES["optimize"]]
    return sum(w * m for w, m in zip(weights, medians))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=float, nargs=2, default=[1.0, 50.0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, weights in (("first shape alone", None), ("weighted", args.weights)):
            root = Path(tmp) / name.replace(" ", "_")
            root.mkdir()
            best = campaign(root, weights)["best"]
            rows[name] = {"result": best["params"]["kind"], "objective": best["shape"],
                          "score_ms": best["median_seconds"] * 1e3,
                          "workload_ms": workload_s(best, args.weights) * 1e3,
                          "medians_ms": {s: t["median_seconds"] * 1e3 for s, t in best["shapes"].items()}}
    for name, r in rows.items():
        print(f"{name:18s} result {r['result']:12s} scored {r['score_ms']:8.3f} ms at {r['objective']:24s} "
              f"workload {r['workload_ms']:8.3f} ms  medians {json.dumps(r['medians_ms'])}")
    ratio = rows["first shape alone"]["workload_ms"] / rows["weighted"]["workload_ms"]
    print(f"the first shape's pick costs the workload {ratio:.2f}x the weighted pick's time")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "workload_ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()

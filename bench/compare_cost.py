"""Where a final comparison's device lease goes: one kernel timed against the problem's reference kernel and
baselines at every optimisation shape, as the benchmarker's final comparison does (sets drawn ahead, then under
the lease a rotated timing a shape with the candidate probed after it), repeated on one input pool as a
benchmarker's comparisons and measurements share it.

Prints, per comparison, the seconds the lease would be held and the stage-time ledger's parts of it: the kernels'
own run time, the output checks, buffers, runner round trips, and any drawing or float64 references made under
the lease (none where everything was drawn ahead).

    python bench/compare_cost.py [--problem softmax] [--point '{"passes": "two", ...}'] [--repeat 3] [--json OUT]

`--point` is a design point of the problem's cpu family (default: the reference kernel stands in as the
candidate too).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from kfactory.judge.checks import InputPool
from kfactory.judge.measure import available_baselines, drawn_ahead
from kfactory.judge.rotated import measure_rotated
from kfactory.observability import stagetime
from kfactory.platform.config import Settings
from kfactory.problems import Problem, load_problem
from kfactory.problems.package import ProblemError
from kfactory.targets import get_target


def candidate(problem: Problem, point: dict | None) -> tuple[str, str, str, dict | None]:
    """(source, flags, language, launch rule) of the candidate: the design point of the problem's cpu family, or
    the reference kernel."""
    if point is None:
        return problem.reference_kernel("cpu")
    family = next((f for f in problem.families.values() if f.spec.target == "cpu"), None)
    if family is None:
        raise SystemExit(f"{problem.name} has no cpu family for --point")
    try:
        source, flags, _ = family.render(point)   # (its OpenMP threads are in the source)
    except ProblemError as e:
        raise SystemExit(f"--point: {e}") from e
    return source, flags, family.spec.language, None


def load(session, target, problem: Problem, cand: tuple) -> list[str]:
    """The candidate, the reference kernel and the baselines loaded in `session`; their keys, candidate first."""
    ref_source, ref_flags, language, rule = problem.reference_kernel("cpu")
    source, flags, lang, launch = cand
    for key, (src, fl, lg, lr) in {"candidate": (source, flags, lang, launch),
                                   "reference": (ref_source, ref_flags, language, rule)}.items():
        res = target.compile(src, lg, fl, "kernel")
        if not res.ok:
            raise SystemExit(f"{key} does not compile: {res.message}")
        session.load_artifact(key, res.artifact, "kernel", lr)
    keys = ["candidate", "reference"]
    for b in available_baselines(problem, "cpu"):
        session.load_baseline(f"baseline:{b}", b)
        keys.append(f"baseline:{b}")
    return keys


def one(session, target, problem: Problem, keys: list[str], pool: InputPool, settings: Settings) -> dict:
    """One final comparison: the seconds drawn ahead, held (per shape too), and the ledger's parts under the
    lease."""
    t0 = time.perf_counter()
    view = drawn_ahead(session, problem, problem.shapes("optimize"), pool, target.cache_bytes(), len(keys))
    ahead = time.perf_counter() - t0
    before = stagetime.snapshot()
    shapes: dict[str, dict] = {}
    for shape in problem.shapes("optimize"):
        ts = time.perf_counter()
        res = measure_rotated(session, keys, problem, shape, view, target.cache_bytes(), settings,
                              settings.compare_max_s, target.device(), ["candidate"])
        if res.reason:
            raise SystemExit(f"{problem.shape_str(shape)}: {res.message}")
        shapes[problem.shape_str(shape)] = {
            "held_s": round(time.perf_counter() - ts, 3),
            "median_ms": {k: round(t.median_s * 1e3, 4) for k, t in res.timings.items()},
            "samples": {k: t.samples for k, t in res.timings.items()}}
    # the ledger's own paths ("comparison", "runner/kernel", ...): exclusive seconds, so they add up to the lease
    parts = {path: round(s, 3) for path, (s, _) in stagetime.since(before).items()}
    held = sum(float(s["held_s"]) for s in shapes.values())
    return {"ahead_s": round(ahead, 3), "held_s": round(held, 3),
            "parts": parts, "shapes": shapes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="softmax")
    ap.add_argument("--point", type=json.loads, help="a design point of the problem's cpu family, as JSON")
    ap.add_argument("--repeat", type=int, default=3, help="comparisons on one input pool")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat: at least one comparison")
    settings = Settings()
    problem = load_problem(a.problem)
    if "cpu" not in problem.spec.reference_kernel:
        raise SystemExit(f"{a.problem} has no cpu reference kernel to compare with")
    target = get_target("cpu", settings)
    cand = candidate(problem, a.point)
    # the runner's threads as a campaign's (CampaignSpec.threads, the planner's default: Settings.threads)
    session = target.session(problem, settings.threads)
    try:
        keys = load(session, target, problem, cand)
        pool = InputPool(problem, settings.input_reuse)
        runs = []
        for i in range(a.repeat):
            runs.append(one(session, target, problem, keys, pool, settings))
            r = runs[-1]
            print(f"comparison {i + 1}: drawn ahead {r['ahead_s']:.2f} s, lease {r['held_s']:.2f} s "
                  f"({', '.join(f'{k} {v:.2f}' for k, v in sorted(r['parts'].items()) if v >= 0.005)})")
            for name, s in r["shapes"].items():
                print(f"    {name}: {s['held_s']:.2f} s; ms {s['median_ms']}; samples {s['samples']}")
    finally:
        session.close()
    later = [r["held_s"] for r in runs[1:]]
    out = {"problem": a.problem, "keys": keys, "first_held_s": runs[0]["held_s"],
           "later_held_s_median": statistics.median(later) if later else None, "runs": runs}
    print(f"lease: first {out['first_held_s']:.2f} s" +
          (f", later ones' median {out['later_held_s_median']:.2f} s" if later else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

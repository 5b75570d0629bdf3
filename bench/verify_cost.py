"""The cost of rigour: the verifier's time per candidate as a multiple of the candidate's own run time.

Compiles one kernel (the best-known softmax design point by default, or --source FILE), verifies it the way
the verifier service does (every shape x every distribution, fresh draws, poisoned outputs, full comparison,
guard bands, input-mutation, determinism and memoisation checks), and times one call at the first
optimisation shape. It prints the verification time split into its parts, each as a multiple of that call.

    python bench/verify_cost.py [--problem softmax] [--source FILE --flags FLAGS] [--repeat 3]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from kfactory.platform.config import Settings
from kfactory.platform.heap import keep_freed_memory_if_set
from kfactory.judge.checks import InputPool
from kfactory.judge.measure import measure
from kfactory.judge.verify import verify
from kfactory.problems import load_problem
from kfactory.targets import get_target

DEFAULT_POINT = {"exp": "poly", "flags": "-O3 -march=native", "passes": "two", "threads": 2, "unroll": 2,
                 "vec": 16, "split": 0, "prefetch": 1}
PARTS = {"drawing inputs + float64 reference": ("inputs.py", "reference.py"),
         "comparing outputs": ("compare.py",),
         "runner round trips (kernel runs, mapping)": ("select",),
         "buffer set-up, guard bands, poison, copies": ("build_argset", "new_guarded", "intact", "array",
                                                        "same_bits")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="softmax")
    ap.add_argument("--source")
    ap.add_argument("--flags", default="-O3 -march=native -fopenmp")
    ap.add_argument("--repeat", type=int, default=3, help="verifications to time after the first")
    a = ap.parse_args()
    settings = Settings()
    keep_freed_memory_if_set(settings)   # as every kfactory command, whose verification this times
    problem = load_problem(a.problem)
    target = get_target("cpu", settings)
    if a.source:
        source, flags = open(a.source).read(), a.flags
    else:
        source, flags, _ = problem.families["cpu_c"].render(DEFAULT_POINT)
    res = target.compile(source, "c", flags, "kernel")
    assert res.ok, res.message
    session = target.session(problem, settings.threads)
    session.load_artifact("k", res.artifact, "kernel")
    shape = problem.shapes("optimize")[0]
    pool = InputPool(problem, settings.input_reuse)
    t = measure(session, ["k"], problem, shape, pool, target.cache_bytes(), settings).timings["k"]
    first = time.perf_counter()
    verify(session, "k", problem, pool)  # draws the shared large input sets
    first = time.perf_counter() - first
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(a.repeat):
        v = verify(session, "k", problem, pool)
    prof.disable()
    steady = (time.perf_counter() - t0) / a.repeat
    session.close()
    run = t.median_s
    print(f"kernel at {problem.shape_str(shape)}: median {run * 1e3:.3f} ms ({t.samples} samples); "
          f"verdict {'passed' if v.passed else v.message}; {len(v.checks)} checks")
    print(f"verification, steady state (large inputs shared by {settings.input_reuse}): {steady:.2f} s "
          f"= {steady / run:.0f}x the kernel's run time")
    print(f"verification with fresh draws of every large input set: {first:.2f} s = {first / run:.0f}x")
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]  # the raw table: real, not in the stubs
    for part, needles in PARTS.items():
        secs = sum(tt for (file, _, fn), (_, _, tt, _, _) in stats.items()
                   if any(n in file or n in fn for n in needles)) / a.repeat
        print(f"  {part:45s} {secs:6.2f} s  {secs / run:6.0f}x")


if __name__ == "__main__":
    main()

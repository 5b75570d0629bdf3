"""What a process of the factory costs to start, in this tree and at another commit, side by side.

Every service, runner and command is a fresh interpreter: a six-process factory starts each service once, but
a campaign starts a runner per candidate batch and a user's shell a command per query, and the test suite
starts them by the hundreds. This times, in CPU seconds (the child's user + system time, which a loaded host
does not inflate as it does wall time), each of: the import of every service's class (what `kfactory serve
NAME` loads before it connects), the runner's module, and two commands that fail at once after their start
(`kfactory best` of an unknown candidate, `kfactory status` of none, on an empty workspace of their own). Each
is started --repeats times, in turn in each tree, and the medians and their ratios are printed; a start that
does not end as it should (an import that fails, a command's traceback) stops the bench.

    python bench/startup.py --against REF [--repeats 7] [--json OUT]

REF (a commit, e.g. 27de5bc) is checked out in a temporary git worktree; each child runs with its tree as the
working directory and PYTHONPATH, so `import kfactory` is that tree's, with PYTHONDONTWRITEBYTECODE set and no
other KFACTORY_* variable. Three columns: this tree and REF byte-compiled (as `make install` leaves a tree: the
change in what is imported), timed in turn, and REF from its sources (a fresh clone before `make install`
compiled it: what every start paid there), timed first, in a pass of its own. The benchmarker's row is its
imports: it now imports scipy.stats there, which the others leave to where it is used.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kfactory.platform.app import SERVICE_NAMES

ROOT = Path(__file__).resolve().parent.parent
#: the columns: this tree and REF byte-compiled, REF from its sources
HERE, COMPILED, SOURCE = "here", "ref", "ref_source"


#: how each start must end: the imports succeed, the commands exit 1 as they say (no such candidate; no campaign
#: has run in the empty workspace)
EXPECTED = {"kfactory best --candidate": 1, "kfactory status": 1}


def entries() -> dict[str, list[str]]:
    """name -> argv of each start that is timed."""
    py = sys.executable
    out = {f"serve {name} (imports)": [py, "-c", f"from kfactory.platform.app import service_class\n"
                                                 f"service_class({name!r})"] for name in SERVICE_NAMES}
    out["runner (imports)"] = [py, "-c", "import kfactory.sandbox.child"]
    out["kfactory best --candidate"] = [py, "-m", "kfactory.cli.main", "best", "--candidate", "nosuch", "--json"]
    out["kfactory status"] = [py, "-m", "kfactory.cli.main", "status", "--json"]
    return out


def cpu_seconds(name: str, argv: list[str], tree: Path, env: dict[str, str], data: Path) -> float:
    """The child's user + system CPU seconds (os.wait4's rusage of that one child); SystemExit naming the start
    when it did not end as EXPECTED says."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, cwd=tree, env={**env, "PYTHONPATH": str(tree),
                                                     "KFACTORY_DATA_DIR": str(data)},
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode != EXPECTED.get(name, 0) or "Traceback" in stderr:
        raise SystemExit(f"bench/startup.py: {name} in {tree} exited {proc.returncode}:\n{stderr[-2000:]}")
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="the commit to compare with (a git worktree of it is made)")
    ap.add_argument("--repeats", type=int, default=7, choices=range(1, 1001), metavar="N (1-1000)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kf-startup-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(other), args.against],
                       check=True)
        try:
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("KFACTORY_")},
                   "PYTHONDONTWRITEBYTECODE": "1"}
            source = _measure(entries(), {SOURCE: other}, args.repeats, env, Path(tmp))
            for tree in (ROOT, other):
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "kfactory")], check=True)
            rows = _measure(entries(), {HERE: ROOT, COMPILED: other}, args.repeats, env, Path(tmp))
            for row, src in zip(rows, source):
                row[SOURCE] = src[SOURCE]
        finally:   # not check=True: a failed removal must not hide why the bench stopped; prune forgets it
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=False)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    _print(rows, args.against)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"against": args.against, "rows": rows}, indent=1))
    return 0


def _measure(starts: dict[str, list[str]], trees: dict[str, Path], repeats: int, env: dict,
             work: Path) -> list[dict]:
    """The median CPU seconds of each start in each tree (a workspace of its own per tree, under `work`)."""
    rows = []
    for name, argv in starts.items():
        taken: dict[str, list[float]] = {key: [] for key in trees}
        for _ in range(repeats):   # alternating, so that a change in the host's load falls on both
            for key, tree in trees.items():
                taken[key].append(cpu_seconds(name, argv, tree, env, work / f"data-{key}"))
        rows.append({"start": name, **{key: statistics.median(v) for key, v in taken.items()}})
    return rows


def _print(rows: list[dict], against: str) -> None:
    """CPU seconds per start (medians) and the ratios: here / REF compiled, here / REF from its sources."""
    ref = against[:10]
    print(f"{'start':30s} {'here':>7s} {ref:>10s} {ref + ' src':>14s} {'/ref':>6s} {'/src':>6s}")
    total = {"start": "all of them", **{k: sum(r[k] for r in rows) for k in (HERE, COMPILED, SOURCE)}}
    for r in [*rows, total]:
        print(f"{r['start']:30s} {r[HERE]:7.3f} {r[COMPILED]:10.3f} {r[SOURCE]:14.3f} "
              f"{r[HERE] / r[COMPILED]:6.2f} {r[HERE] / r[SOURCE]:6.2f}")


if __name__ == "__main__":
    sys.exit(main())

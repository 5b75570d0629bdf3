"""The GPU-side check: real services (embedded NATS, in-process claims) compile, verify and measure softmax and
RMSNorm on the cuda target, then a table: kernel, shape, median microseconds, GB/s, fraction of the measured
copy bandwidth, ratio vs torch. Full results go to $OUT (when set) as JSON.

Run through scripts/gpu_check.sh on a machine with an NVIDIA GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kfactory.cli.run import EXIT_INTERRUPTED  # kfactory run after Ctrl-C (its summary holds what finished)

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else None

#: GPU-sized shapes for the check (a subset of what the packages declare, to fit the time limit); the
#: verify shapes (ragged, size 1) stay as the packages declare them
SHAPES = {
    "softmax": [{"rows": 4096, "cols": 8192}],
    "rmsnorm": [{"rows": 8192, "hidden": 8192}],
}
#: distributions kept for the check (drawing and referencing 100M-element inputs on the host costs seconds
#: each); a full campaign uses every distribution the package declares
DISTRIBUTIONS = {"softmax": ["normal", "large", "masked"], "rmsnorm": ["normal", "large", "tiny"]}


def package(name: str, work: Path) -> Path:
    """A copy of the built-in package whose optimisation shapes are SHAPES[name]."""
    from kfactory.problems import BUILTIN_DIR

    dst = work / name
    shutil.copytree(BUILTIN_DIR / name, dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = SHAPES[name]
    spec["distributions"] = {k: v for k, v in spec["distributions"].items() if k in DISTRIBUTIONS[name]}
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dst


#: the share of a campaign's time limit its search may take (`kfactory run --seconds`): the rest covers the
#: services' start, the points still in flight when the search stops, the baselines' timings and the summary, so
#: that a campaign ends with its summary instead of being killed at its limit
SEARCH_SHARE = 0.55
#: seconds before its time limit at which a campaign still running is interrupted (at most a fifth of the limit)
INTERRUPT_GRACE_S = 20.0


def campaign(name: str, pkg: Path, budget: int, env: dict, timeout_s: float,
             families: tuple[str, ...] = (), target: str = "cuda", goal: float = 0.0) -> dict | None:
    """The campaign's JSON summary (None when it failed); `families` restricts it. The search stops at `budget`
    candidates, after SEARCH_SHARE of timeout_s, or once a candidate reaches `goal` of the measured copy bandwidth
    at every shape (0: no goal), whichever comes first; a campaign still running near
    timeout_s is interrupted and its summary holds what finished ("state": "cancelled"). Its output goes to
    $OUT/<name>.log in every case."""
    out = (OUT or pkg.parent) / f"{name}.json"
    cmd = [sys.executable, "-m", "kfactory.cli.main", "run", str(pkg), "--target", target, "--budget", str(budget),
           "--seconds", f"{max(10.0, SEARCH_SHARE * timeout_s):.0f}",
           "--strategy", os.environ.get("KF_GPU_STRATEGY", "evolutionary"), "--seed", "11", "--json", str(out),
           # two in flight, as every GPU figure so far was measured (the CLI's default was 2 until the cpu target
           # got its own; on cuda the planner's is one per core plus two, not yet measured on a GPU)
           "--parallel", os.environ.get("KF_GPU_PARALLEL") or "2"]
    for family in families:
        cmd += ["--family", family]
    if goal:
        cmd += ["--goal", str(goal)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    grace = min(INTERRUPT_GRACE_S, 0.2 * timeout_s)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s - grace)
    except subprocess.TimeoutExpired:
        # as Ctrl-C: kfactory run cancels the campaign and writes the summary of what finished (exit 130)
        print(f"{name}: interrupted at {timeout_s - grace:.0f}s", flush=True)
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
            print(f"{name}: killed at {timeout_s:.0f}s", flush=True)
    if OUT:
        (OUT / f"{name}.log").write_text(stdout + stderr)
    print(f"{name}: exit {proc.returncode} after {time.time() - t0:.0f}s")
    if proc.returncode not in (0, EXIT_INTERRUPTED) or not out.exists():
        print(stdout[-6000:] + stderr[-6000:])
        return None
    print(stdout[-2500:])
    summary = json.loads(out.read_text())
    print(f"{name}: {stage_line(summary)}", flush=True)
    return summary


def stage_line(summary: dict, top: int = 10) -> str:
    """The services' seconds per proposed candidate by part of their work (the summary's stage_seconds), the
    largest first: where a GPU campaign's time goes, for the next run to cut."""
    n = max(1, summary["counts"].get("proposed", 0))
    parts = sorted(summary.get("stage_seconds", {}).items(), key=lambda kv: -kv[1][0])[:top]
    return f"{summary.get('device_seconds_per_candidate')} device-s a candidate; s a candidate: " + ", ".join(
        f"{path} {sec / n:.2f}" for path, (sec, _) in parts)


def workspace(work: Path) -> str:
    """The campaigns' data directory: gpu_check.sh's KF_DATA, shared by every stage (the committed evidence is
    imported there, the GPU's ceilings are measured there once, and the evidence bundle is exported from it)."""
    return os.environ.get("KF_DATA") or str(work / "data")


def campaign_env(work: Path) -> dict:
    """The environment of the check's campaigns: the shared workspace, reports under $OUT when set (gpu_check.sh's
    logs.tar.gz brings them back; else under `work`), GPU-sized inputs drawn once for 64 candidates, and short
    comparisons and measurements."""
    return dict(os.environ, KFACTORY_DATA_DIR=workspace(work), KFACTORY_REPORT_DIR=str((OUT or work) / "reports"),
                KFACTORY_INPUT_REUSE="64", KFACTORY_COMPARE_MAX_S=os.environ.get("KF_GPU_COMPARE_S", "1.0"),
                KFACTORY_MEASURE_MAX_S="0.3", KFACTORY_RUNNER_TIMEOUT_S="60", PYTHONUNBUFFERED="1")


def save_evidence(env: dict) -> None:
    """Export the workspace's evidence bundle to KF_EVIDENCE_OUT (gpu_check.sh: $OUT/evidence.json.gz) after a
    campaign, so that a run cut short still leaves what it measured."""
    path = os.environ.get("KF_EVIDENCE_OUT")
    if not path:
        return
    try:
        done = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "evidence", "export", "--out", path], env=env,
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:  # the check goes on; gpu_check.sh exports again after the stage
        print("evidence export ran past 120 s", flush=True)
        return
    print(done.stdout.strip() or done.stderr.strip()[-500:], flush=True)


def table(results: dict[str, dict | None]) -> list[str]:
    rows = [f"{'problem':8} {'kernel':10} {'shape':12} {'median us':>10} {'GB/s':>8} {'of copy bw':>10} "
            f"{'vs torch':>9} {'mode':6} {'throttled':9}"]
    for name, summary in results.items():
        best = (summary or {}).get("best")
        if not best:
            rows.append(f"{name:8} no measured candidate")
            continue
        for shape, s in best["shapes"].items():
            compared = s.get("compared", {})
            torch_t = compared.get("torch", {}).get("median_seconds")
            for kernel, e in compared.items():
                ratio = f"{torch_t / e['median_seconds']:.2f}x" if torch_t else "-"
                rows.append(f"{name:8} {kernel:10} {shape:12} {e['median_seconds'] * 1e6:10.1f} {e['gbps']:8.0f} "
                            f"{e['fraction_of_measured_bandwidth']:10.1%} {ratio:>9} {e['mode']:6} "
                            f"{str(e['throttled']):9}")
    return rows


def main() -> int:
    budget = int(os.environ.get("KF_GPU_BUDGET", "40"))  # the time share binds first on a GPU
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="kf-gpu-"))
    env = campaign_env(work)
    results = {}
    for name in SHAPES:
        results[name] = campaign(name, package(name, work), budget, env, timeout_s=float(os.environ.get(
            "KF_GPU_CAMPAIGN_S", "130")), goal=float(os.environ.get("KF_GPU_GOAL", "0.9")))
        save_evidence(env)
        print(f"elapsed {time.time() - t0:.0f}s", flush=True)
    judged = os.environ.get("KFACTORY_DEVICE_JUDGE", "0").lower() in ("1", "true", "yes", "on")
    rows = [f"device judge (issue 23): {'on' if judged else 'off'}"] + table(results)
    if OUT:
        (OUT / "gpu_check.json").write_text(json.dumps(results, indent=1))
        (OUT / "table.txt").write_text("\n".join(rows) + "\n")
    dev: dict = next((r["device_info"] for r in results.values() if r), {})
    print(f"\ndevice: {dev.get('model')} {dev.get('arch')} "
          f"copy bandwidth {dev.get('mem_bandwidth_gbps', 0):.0f} GB/s, "
          f"fp32 {dev.get('peak_gflops', 0) / 1e3:.1f} TFLOP/s, "
          f"bf16 {dev.get('peak_bf16_gflops', 0) / 1e3:.0f} TFLOP/s")
    print("\n".join(rows))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The GPU-side check for KDA (called by scripts/gpu_check.sh after gpu_check.py).

1. A campaign of the kda_bf16 problem (kda with bf16 q, k, v, beta and o, as FLA takes them: its chunk kernels
   refuse fp32 q/k/v) on the cuda target through the real services (as gpu_check.py runs softmax
   and RMSNorm), restricted to the cuda_recurrent family: GPU-sized shapes of its domain (a large-batch
   decoding step with a carried state, a 1024-token prefill at Kimi Linear's 32 heads), verified against the
   float64 reference on the package's small verify shapes; the campaign's measurements include FLA's
   fused_recurrent_kda and chunk_kda (or the torch recurrence without fla-core) as baselines.
2. A second, smaller campaign restricted to the cuda_chunked family (the chunked WY algorithm for prefill),
   optimising a prefill shape (CHUNKED_SHAPES). Its best point (or DEFAULT_CHUNKED when the campaign gives
   none) is then verified once more here against the float64 reference on every verify shape and every
   distribution of the package plus a ragged multi-chunk prefill (VERIFY_CHUNKED), its worst errors recorded.
3. The public shapes (docs/kda.md: FLA's benchmark registry and the H64 T8192 shape of the published H200
   figures), where the float64 reference would cost minutes on the host: the recurrent campaign's best kernel
   ("best"), the chunked point ("chunked") and the cuda reference kernel timed interleaved with the baselines
   by the cuda target's runner, and each kernel's o and final state compared with FLA's chunk_kda
   (relative RMS error <= 0.005, FLA's own bar). The chunked kernel's figure of merit is its speedup over
   fla_chunk, the recurrent one's over fla_recurrent.

The whole step must end inside gpu_check.sh's `timeout $KF_GPU_KDA_S`: the campaigns have their own
time limits, public shapes not started by KF_GPU_KDA_S - PUBLIC_MARGIN_S seconds are skipped (recorded as
such), and $OUT/kda_check.json is rewritten after every stage, so a kill leaves what was done.
Results go to $OUT/kda_check.json (the campaigns' own JSON to $OUT/kda.json and $OUT/kda_chunked.json) when
OUT is set. Environment (gpu_check.sh sets the limits; these defaults are for a run of this script alone):
KF_GPU_BUDGET (candidates of the recurrent campaign, default 12), KF_KDA_CAMPAIGN_S (its time limit, default 75),
KF_KDA_WARM_S (the baselines' JIT warm-up before the campaigns, default 60), KF_KDA_CHUNKED_BUDGET (default 6),
KF_KDA_CHUNKED_S (default 50), KF_GPU_KDA_S (the step's allowance, default 220), KF_KDA_PUBLIC (comma-separated
shape names to keep, default all).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import OUT, campaign, campaign_env, save_evidence, workspace  # noqa: E402  (same runner, $OUT, env)

CAMPAIGN_SHAPES = [dict(B=64, T=1, H=32, HV=32, K=128, V=128), dict(B=1, T=1024, H=32, HV=32, K=128, V=128)]
#: the chunked campaign's optimisation shape: a prefill with 32 (batch x head) pairs (128 blocks at bv = 32),
#: its float64 reference a few seconds on the host
CHUNKED_SHAPES = [dict(B=2, T=1024, H=16, HV=16, K=128, V=128)]
#: the explicit verification of the chunked point: the package's verify shapes and every distribution, plus
#: this ragged prefill over several 64-token chunks with grouped value heads
VERIFY_CHUNKED = [dict(B=1, T=300, H=2, HV=4, K=128, V=128)]
#: when the chunked campaign measures nothing (no verified candidate, or it ran out of time)
DEFAULT_CHUNKED = dict(chunk=64, bv=32, ks=8, tile=4, exp="fast", io="bf16")
DISTRIBUTIONS = ["normal", "no_state", "slow_decay"]
#: seconds kept back at the end of KF_GPU_KDA_S: a public shape is not started later than this
PUBLIC_MARGIN_S = 30
#: name -> shape: FLA's benchmark registry (D = K = V) and the H200 chunk_kda figure's H64 T8192
PUBLIC = {
    "B1_T8192_H64_D128": dict(B=1, T=8192, H=64, HV=64, K=128, V=128),
    "B1_T8192_H96_D128": dict(B=1, T=8192, H=96, HV=96, K=128, V=128),
    "B2_T16384_H16_D128": dict(B=2, T=16384, H=16, HV=16, K=128, V=128),
    "B4_T2048_H16_D128": dict(B=4, T=2048, H=16, HV=16, K=128, V=128),
    "B4_T4096_H64_D128": dict(B=4, T=4096, H=64, HV=64, K=128, V=128),
    "B8_T2048_H32_D256": dict(B=8, T=2048, H=32, HV=32, K=256, V=256),
    "B8_T1024_H8_D64": dict(B=8, T=1024, H=8, HV=8, K=64, V=64),
}
FLA_RMS_BAR = 0.005


def package(work: Path, name: str = "kda_bf16", shapes: list[dict] = CAMPAIGN_SHAPES,
            distributions: list[str] | None = DISTRIBUTIONS) -> Path:
    """A copy of the kda_bf16 package under work/name with these optimisation shapes and distributions
    (None: all of the package's)."""
    from kfactory.problems import BUILTIN_DIR

    dst = work / name
    shutil.copytree(BUILTIN_DIR / "kda_bf16", dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = shapes
    if distributions is not None:
        spec["distributions"] = {k: v for k, v in spec["distributions"].items() if k in distributions}
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dst


def warm_baselines(pkg: Path, env: dict, timeout_s: float) -> dict:
    """FLA's kernels compiled before the campaigns (scripts/gpu_warm_baselines.py, in a child process: Triton's
    JIT, cached on disk, then costs the campaigns nothing): what it warmed, or why it did not."""
    out = Path(tempfile.mkdtemp(prefix="kf-warm-")) / "warm.json"
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "gpu_warm_baselines.py"), str(pkg), "--skip", "torch",
           "--json", str(out)]
    for shape in CAMPAIGN_SHAPES + CHUNKED_SHAPES:
        cmd += ["--shape", json.dumps(shape)]
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"skipped": f"ran past {timeout_s:.0f} s (the campaigns compile the rest)"}
    print(proc.stdout[-2000:] + proc.stderr[-2000:], flush=True)
    return json.loads(out.read_text()) if out.exists() else {"skipped": f"exit {proc.returncode}"}


def rel_rms(out: np.ndarray, ref: np.ndarray) -> float:
    """rms(out - ref) / rms(ref), in float64."""
    d = out.astype(np.float64) - ref.astype(np.float64)
    return float(np.sqrt(np.mean(d * d)) / max(np.sqrt(np.mean(ref.astype(np.float64) ** 2)), 1e-30))


def _shm_free() -> int:
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return 0


def verify_chunked(work: Path, point: dict, settings) -> dict:
    """The chunked point verified by the judge against the float64 reference (every verify shape plus
    VERIFY_CHUNKED, every distribution of the package): passed, the reason, the worst check per output."""
    from kfactory.judge.checks import InputPool
    from kfactory.judge.verify import verify
    from kfactory.problems import load_problem
    from kfactory.targets import get_target
    from kfactory.v1 import events_pb2 as pb

    problem = load_problem(package(work, "kda_bf16_verify", VERIFY_CHUNKED, None))
    fam = problem.families["cuda_chunked"]
    if not fam.valid(point):
        return {"params": point, "passed": False, "message": "not a valid cuda_chunked point"}
    target = get_target("cuda", settings)
    source, flags, _ = fam.render(point)
    res = target.compile(source, fam.spec.language, flags, fam.spec.entry)
    if not res.ok:
        return {"params": point, "passed": False, "message": f"compile: {res.message[-500:]}"}
    session = target.session(problem, 1)
    try:
        session.load_artifact("chunked", res.artifact, fam.spec.entry, fam.launch_rule(point))
        v = verify(session, "chunked", problem, InputPool(problem, 4))
    finally:
        session.close()
    worst = max(v.checks, key=lambda c: c.norm_rel_err) if v.checks else None
    return {"params": point, "passed": v.passed, "reason": pb.RejectReason.Name(v.reason), "message": v.message,
            "checks": len(v.checks), "worst_norm_rel": worst.norm_rel_err if worst else None,
            "worst_at": f"{worst.shape} {worst.distribution}" if worst else None,
            "registers": res.report.registers}


def public_shapes(pkg: Path, best: dict | None, settings, chunked: dict | None = None,
                  deadline: float = float("inf"), save=lambda results: None) -> dict:
    """Kernel(s) vs baselines at the public shapes; {} entries say why a shape was skipped. `chunked` is a
    cuda_chunked point timed beside the recurrent best; no shape starts after `deadline` (time.time());
    `save(results)` after each shape."""
    from kfactory.judge.inputs import draw
    from kfactory.problems import load_problem
    from kfactory.sandbox.parent import RunnerFault
    from kfactory.targets import get_target
    from kfactory.sandbox.shm_args import set_bytes

    problem = load_problem(pkg)
    target = get_target("cuda", settings)
    session, keys = _open(problem, target, best, chunked)
    keep = [s for s in os.environ.get("KF_KDA_PUBLIC", "").split(",") if s] or list(PUBLIC)
    results = {}
    try:
        for name in keep:
            shape = PUBLIC[name]
            if time.time() > deadline:
                results[name] = {"skipped": "out of time (KF_GPU_KDA_S)"}
                print(f"{name}: {results[name]['skipped']}", flush=True)
                continue
            need = (len(keys) + 1) * set_bytes(problem, shape)
            if need > 0.8 * _shm_free():
                results[name] = {"skipped": f"needs {need / 2**30:.1f} GiB of /dev/shm, "
                                            f"{_shm_free() / 2**30:.1f} GiB free"}
                print(f"{name}: {results[name]['skipped']}", flush=True)
                continue
            x = draw(problem, shape, "normal", 20260)
            try:
                res = session.bench(list(keys.values()), shape, [x], min_samples=5, min_s=0.2, max_s=2.0,
                                    noise=0.05, warmup_s=0.05)
            except (RunnerFault, OSError) as e:  # a runner fault or a full /dev/shm at one shape: keep the others
                results[name] = {"failed": f"{type(e).__name__}: {e}"[:1000]}
                print(name, results[name]["failed"], flush=True)
                session.close()
                session, keys = _open(problem, target, best, chunked)
                continue
            results[name] = _row(keys, res, shape)
            print(name, json.dumps(results[name]), flush=True)
            save(results)
    finally:
        session.close()
    return results


def _open(problem, target, best: dict | None, chunked: dict | None):
    """A runner session with the kernels under test and the baselines loaded, and their keys by name."""
    from kfactory.judge.measure import available_baselines

    session = target.session(problem, 1)
    keys = _load_kernels(problem, target, session, best, chunked)
    for b in available_baselines(problem, "cuda"):
        session.load_baseline(f"baseline:{b}", b)
        keys[b] = f"baseline:{b}"
    return session, keys


def _load_kernels(problem, target, session, best: dict | None, chunked: dict | None = None) -> dict[str, str]:
    """The recurrent campaign's best point (when there is one), the cuda_chunked point (when given) and the
    cuda reference kernel."""
    keys = {}
    kernels = [("best", best.get("family"), best.get("params"))] if best else []
    if chunked:
        kernels.append(("chunked", "cuda_chunked", chunked))
    for key, family, params in kernels:
        if family not in problem.families:
            continue
        fam = problem.families[family]
        source, flags, _ = fam.render(params)
        res = target.compile(source, fam.spec.language, flags, fam.spec.entry)
        if res.ok:
            session.load_artifact(key, res.artifact, fam.spec.entry, fam.launch_rule(params))
            keys[key] = key
    source, flags, language, rule = problem.reference_kernel("cuda")
    res = target.compile(source, language, flags, "kernel")
    if res.ok:
        session.load_artifact("reference", res.artifact, "kernel", rule)
        keys["reference"] = "reference"
    return keys


#: the kernels under test at the public shapes (every other key is a baseline)
KERNELS = ("best", "chunked", "reference")


def _row(keys: dict[str, str], res, shape: dict) -> dict:
    med = {n: float(np.median(res.samples[k])) for n, k in keys.items()}
    truth = next((n for n in ("fla_chunk", "fla_recurrent", "torch") if n in keys), None)
    row = {"median_ms": {n: round(s * 1e3, 4) for n, s in med.items()}, "mode": res.mode,
           "flops": 7 * shape["B"] * shape["T"] * shape["HV"] * shape["K"] * shape["V"]}
    for n in KERNELS:
        if n not in keys:
            continue
        row[f"{n}_tflops"] = round(row["flops"] / med[n] / 1e12, 3)
        for b in keys:
            if b not in KERNELS:
                row[f"{n}_speedup_vs_{b}"] = round(med[b] / med[n], 3)
        if truth:
            out, ref = res.outputs[keys[n]][0], res.outputs[keys[truth]][0]
            errs = {t: rel_rms(out[t], ref[t]) for t in ("o", "ht")}
            row[f"{n}_rel_rms_vs_{truth}"] = errs
            row[f"{n}_agrees"] = all(e <= FLA_RMS_BAR for e in errs.values())
    return row


def main() -> int:
    from kfactory.platform.config import Settings

    t0 = time.time()
    deadline = t0 + float(os.environ.get("KF_GPU_KDA_S", "220")) - PUBLIC_MARGIN_S
    budget = int(os.environ.get("KF_GPU_BUDGET", "12"))
    work = Path(tempfile.mkdtemp(prefix="kf-kda-"))
    env = campaign_env(work)
    result: dict = {}

    def save(**stage):
        result.update(stage)
        if OUT:
            (OUT / "kda_check.json").write_text(json.dumps(result, indent=1))

    pkg = package(work)
    save(baseline_warmup=warm_baselines(pkg, env, float(os.environ.get("KF_KDA_WARM_S", "60"))))
    print(f"baselines warmed {time.time() - t0:.0f}s", flush=True)
    summary = campaign("kda", pkg, budget, env, timeout_s=float(os.environ.get("KF_KDA_CAMPAIGN_S", "75")),
                       families=("cuda_recurrent",))
    print(f"campaign elapsed {time.time() - t0:.0f}s", flush=True)
    best = (summary or {}).get("best")
    save(campaign=summary)
    save_evidence(env)
    chunked_summary = campaign("kda_chunked", package(work, "kda_bf16_chunked", CHUNKED_SHAPES),
                               int(os.environ.get("KF_KDA_CHUNKED_BUDGET", "6")), env,
                               timeout_s=float(os.environ.get("KF_KDA_CHUNKED_S", "50")), families=("cuda_chunked",))
    print(f"chunked campaign elapsed {time.time() - t0:.0f}s", flush=True)
    save_evidence(env)
    chunked_best = (chunked_summary or {}).get("best")
    chunked = chunked_best["params"] if chunked_best else dict(DEFAULT_CHUNKED)
    settings = Settings(data_dir=workspace(work), runner_timeout_s=120.0)
    verdict = verify_chunked(work, chunked, settings)
    print(f"chunked point {chunked} ({'campaign best' if chunked_best else 'default'}): "
          f"{json.dumps({k: v for k, v in verdict.items() if k != 'params'})}", flush=True)
    save(chunked_campaign=chunked_summary, chunked_verification=verdict)
    public = public_shapes(pkg, best, settings, chunked if verdict["passed"] else None, deadline,
                           lambda rows: save(public_shapes=rows))
    save(public_shapes=public)
    print(f"\nkda best: {best and best.get('params')}")
    print(f"kda chunked: {chunked} verified: {verdict['passed']} (worst {verdict.get('worst_norm_rel')})")
    for name, row in public.items():
        print(f"{name:20} {json.dumps(row)}")
    agree = all(r.get(f"{k}_agrees", True) for r in public.values() for k in KERNELS)
    ok = summary is not None and verdict["passed"] and agree
    print(f"elapsed {time.time() - t0:.0f}s", flush=True)
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())

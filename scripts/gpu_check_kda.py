"""The GPU-side check for KDA (called by scripts/gpu_check.sh after gpu_check.py).

1. A campaign of the kda_bf16 problem (kda with bf16 q, k, v, beta and o, as FLA takes them: its chunk kernels
   refuse fp32 q/k/v) on the cuda target through the real services (as gpu_check.py runs softmax
   and RMSNorm): GPU-sized shapes of the recurrent family's domain (a large-batch decoding step with a carried
   state, a 1024-token prefill at Kimi Linear's 32 heads), verified against the float64 reference on the
   package's small verify shapes; the campaign's measurements include FLA's fused_recurrent_kda and chunk_kda
   (or the torch recurrence without fla-core) as baselines.
2. The public shapes (docs/kda.md: FLA's benchmark registry and the H64 T8192 shape of the published H200
   figures), where the float64 reference would cost minutes on the host: the campaign's best kernel and the
   cuda reference kernel timed interleaved with the baselines by the cuda target's runner, and the kernel's
   o and final state compared with FLA's (relative RMS error <= 0.005, FLA's own bar).

Results go to $OUT/kda_check.json (the campaign's own JSON to $OUT/kda.json) when OUT is set.
Environment: KF_GPU_BUDGET (candidates, default 12), KF_KDA_CAMPAIGN_S (default 120), KF_KDA_PUBLIC
(comma-separated shape names to keep, default all).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import OUT, campaign  # noqa: E402  (same subprocess campaign runner, same $OUT)

CAMPAIGN_SHAPES = [dict(B=64, T=1, H=32, HV=32, K=128, V=128), dict(B=1, T=1024, H=32, HV=32, K=128, V=128)]
DISTRIBUTIONS = ["normal", "no_state", "slow_decay"]
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


def package(work: Path) -> Path:
    """A copy of the kda_bf16 package with the check's optimisation shapes and fewer distributions."""
    from kfactory.problems import BUILTIN_DIR

    dst = work / "kda_bf16"
    shutil.copytree(BUILTIN_DIR / "kda_bf16", dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = CAMPAIGN_SHAPES
    spec["distributions"] = {k: v for k, v in spec["distributions"].items() if k in DISTRIBUTIONS}
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dst


def rel_rms(out: np.ndarray, ref: np.ndarray) -> float:
    """rms(out - ref) / rms(ref), in float64."""
    d = out.astype(np.float64) - ref.astype(np.float64)
    return float(np.sqrt(np.mean(d * d)) / max(np.sqrt(np.mean(ref.astype(np.float64) ** 2)), 1e-30))


def _shm_free() -> int:
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return 0


def public_shapes(pkg: Path, best: dict | None, settings) -> dict:
    """Kernel(s) vs baselines at the public shapes; {} entries say why a shape was skipped."""
    from kfactory.inputs import draw
    from kfactory.judge import available_baselines
    from kfactory.problems import load_problem
    from kfactory.targets import get_target
    from kfactory.targets.shm_args import set_bytes

    problem = load_problem(pkg)
    target = get_target("cuda", settings)
    session = target.session(problem, 1)
    keys = _load_kernels(problem, target, session, best)
    for b in available_baselines(problem, "cuda"):
        session.load_baseline(f"baseline:{b}", b)
        keys[b] = f"baseline:{b}"
    keep = [s for s in os.environ.get("KF_KDA_PUBLIC", "").split(",") if s] or list(PUBLIC)
    results = {}
    try:
        for name in keep:
            shape = PUBLIC[name]
            need = (len(keys) + 1) * set_bytes(problem, shape)
            if need > 0.8 * _shm_free():
                results[name] = {"skipped": f"needs {need / 2**30:.1f} GiB of /dev/shm, "
                                            f"{_shm_free() / 2**30:.1f} GiB free"}
                print(f"{name}: {results[name]['skipped']}", flush=True)
                continue
            x = draw(problem, shape, "normal", 20260)
            res = session.bench(list(keys.values()), shape, [x], min_samples=5, min_s=0.2, max_s=2.0, noise=0.05,
                                warmup_s=0.05)
            results[name] = _row(keys, res, shape)
            print(name, json.dumps(results[name]), flush=True)
    finally:
        session.close()
    return results


def _load_kernels(problem, target, session, best: dict | None) -> dict[str, str]:
    """The campaign's best cuda_recurrent point (when there is one) and the cuda reference kernel."""
    keys = {}
    if best and best.get("family") in problem.families:
        fam = problem.families[best["family"]]
        source, flags, _ = fam.render(best["params"])
        res = target.compile(source, fam.spec.language, flags, fam.spec.entry)
        if res.ok:
            session.load_artifact("best", res.artifact, fam.spec.entry, fam.launch_rule(best["params"]))
            keys["best"] = "best"
    source, flags, language, rule = problem.reference_kernel("cuda")
    res = target.compile(source, language, flags, "kernel")
    if res.ok:
        session.load_artifact("reference", res.artifact, "kernel", rule)
        keys["reference"] = "reference"
    return keys


def _row(keys: dict[str, str], res, shape: dict) -> dict:
    med = {n: float(np.median(res.samples[k])) for n, k in keys.items()}
    truth = next((n for n in ("fla_chunk", "fla_recurrent", "torch") if n in keys), None)
    row = {"median_ms": {n: round(s * 1e3, 4) for n, s in med.items()}, "mode": res.mode,
           "flops": 7 * shape["B"] * shape["T"] * shape["HV"] * shape["K"] * shape["V"]}
    for n in ("best", "reference"):
        if n not in keys:
            continue
        row[f"{n}_tflops"] = round(row["flops"] / med[n] / 1e12, 3)
        for b in keys:
            if b not in ("best", "reference"):
                row[f"{n}_speedup_vs_{b}"] = round(med[b] / med[n], 3)
        if truth:
            out, ref = res.outputs[keys[n]][0], res.outputs[keys[truth]][0]
            errs = {t: rel_rms(out[t], ref[t]) for t in ("o", "ht")}
            row[f"{n}_rel_rms_vs_{truth}"] = errs
            row[f"{n}_agrees"] = all(e <= FLA_RMS_BAR for e in errs.values())
    return row


def main() -> int:
    from kfactory.config import Settings

    budget = int(os.environ.get("KF_GPU_BUDGET", "12"))
    work = Path(tempfile.mkdtemp(prefix="kf-kda-"))
    env = dict(os.environ, KFACTORY_DATA_DIR=str(work / "data"), KFACTORY_REPORT_DIR=str(work / "reports"),
               KFACTORY_INPUT_REUSE="64", KFACTORY_COMPARE_MAX_S=os.environ.get("KF_GPU_COMPARE_S", "1.0"),
               KFACTORY_MEASURE_MAX_S="0.3", KFACTORY_RUNNER_TIMEOUT_S="60", PYTHONUNBUFFERED="1")
    t0 = time.time()
    pkg = package(work)
    summary = campaign("kda", pkg, budget, env, timeout_s=float(os.environ.get("KF_KDA_CAMPAIGN_S", "120")))
    print(f"campaign elapsed {time.time() - t0:.0f}s", flush=True)
    best = (summary or {}).get("best")
    settings = Settings(data_dir=work / "data", runner_timeout_s=120.0)
    public = public_shapes(pkg, best, settings)
    result = {"campaign": summary, "public_shapes": public}
    if OUT:
        (OUT / "kda_check.json").write_text(json.dumps(result, indent=1))
    print(f"\nkda best: {best and best.get('params')}")
    for name, row in public.items():
        print(f"{name:20} {json.dumps(row)}")
    ok = summary is not None and all(r.get("best_agrees", True) and r.get("reference_agrees", True)
                                     for r in public.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

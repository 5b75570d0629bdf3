"""Where a decode step's time goes, op by op, beside the host's read bandwidth measured in the same process: the
engine is built with -DKF_PROFILE (kfactory/engines/c/forward.c: each op's wall time on the calling thread,
summed; the same code otherwise), and each round runs the read probe (kfactory/targets/cpu/cpu_read.c) at the
engine's thread count, then --steps decode steps after --context tokens.

    python bench/engine_ops.py [--model smollm2-135m] [--design JSON] [--threads 2] [--context 128]
        [--steps 100] [--rounds 6] [--json OUT]

Each op's figure is its time per step (ms) and, for the products and the attention, the GB/s it read: the
prepared tensors' bytes (the weights as the design stores them) and the KV cache of the positions attended
(float32 keys and values at the steps' mean position). The summary puts each op's median GB/s beside the
probe's median: an op well below it loses time to something other than the host's bandwidth (its start, the
threads' fork and join, its serial preparation, a short stream). The timers cost ~50 ns an op. A design with
`team: step` (one parallel region a step, kfactory/engines/c/team.c) times thread 0's own part of each op: its
waits at the barriers fall in no op, so they are in "the rest".

Generated code runs in a child process of this script (started with --child), as in every other engine bench;
the design is --design, else the engine campaign's best.json, else the default design (as bench/engine.py).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import build_design, checked_design  # noqa: E402  (bench/ is not a package)

from kfactory.engines.build import compiler  # noqa: E402
from kfactory.engines.design import EngineDesign  # noqa: E402
from kfactory.models import load_model  # noqa: E402
from kfactory.platform.config import Settings  # noqa: E402

#: kf_profile's slots in forward.c's order (KF_P_*)
OPS = ("qkv", "rope_kv", "attention", "o", "norms", "gate_up", "silu", "down", "head")
#: the tensors each product reads, by the prepared tensors' GGUF names (fused or not)
MATRICES = {"qkv": ("attn_qkv", "attn_q", "attn_k", "attn_v"), "o": ("attn_output",),
            "gate_up": ("ffn_gate_up", "ffn_gate", "ffn_up"), "down": ("ffn_down",), "head": ("token_embd",)}
READ_PROBE = Path(__file__).resolve().parent.parent / "kfactory" / "targets" / "cpu" / "cpu_read.c"


def op_bytes(tensors, config, positions: float) -> dict[str, float]:
    """Bytes each product reads a step (its prepared tensors), and the attention's KV cache at `positions`."""
    out = {op: 0.0 for op in MATRICES}
    for t in tensors:
        kind = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        for op, kinds in MATRICES.items():
            if kind in kinds:
                out[op] += t.data.nbytes
    out["attention"] = 2.0 * config.blocks * config.kv_heads * config.head_dim * 4 * positions
    return out


def child(spec: dict) -> None:
    """Runs in the child: load, then print one JSON line a round."""
    from kfactory.engines.abi import Engine
    from kfactory.engines.prepare import arena
    design = EngineDesign.from_dict(spec["design"])
    model = load_model(spec["model"]).open(Path(Settings().data_dir) / "models")
    tensors = arena(model, design)
    eng = Engine(spec["library"], tensors, model.config, spec["context"] + spec["steps"] + 8, design.threads)
    prof = (ctypes.c_double * len(OPS)).in_dll(eng.lib, "kf_profile")
    probe = ctypes.CDLL(spec["probe"])
    probe.kernel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x, y = np.ones(1 << 25, np.float32), np.zeros(4, np.float32)   # 128 MB: four times the largest L3 here
    sizes = op_bytes(tensors, model.config, spec["context"] + (spec["steps"] + 1) / 2)
    vocab = model.config.vocab
    prompt = [(100 + 7919 * i) % vocab for i in range(spec["context"])]
    logits = np.empty(model.config.vocab, np.float32)
    for _ in range(spec["rounds"]):
        reads = []
        for _ in range(3):
            t = time.perf_counter()
            probe.kernel(x.ctypes.data, y.ctypes.data, x.size)
            reads.append(x.nbytes / (time.perf_counter() - t) / 1e9)
        eng.reset()
        eng.prefill(prompt)
        for i in range(len(OPS)):
            prof[i] = 0.0
        t = time.perf_counter()
        for i in range(spec["steps"]):
            eng.decode((300 + i) % vocab, logits)
        step = (time.perf_counter() - t) / spec["steps"]
        ops = {op: prof[i] / spec["steps"] for i, op in enumerate(OPS)}
        print(json.dumps({"read_gbps": max(reads), "step_s": step, "op_s": ops,
                          "op_gbps": {op: sizes[op] / ops[op] / 1e9 for op in sizes if ops[op] > 0}}), flush=True)
    eng.free()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--design", help="EngineDesign fields as JSON (default: best.json's, else the default design)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--json", help="write every round and the summary here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    if min(args.threads, args.context, args.steps, args.rounds) < 1:
        ap.error("--threads, --context, --steps and --rounds must be 1 or more")
    fields, source, kernels, model = checked_design(ap, args)
    design = EngineDesign.from_dict(fields).at_threads(args.threads)
    lib = build_design(design, model.config, kernels, ("-DKF_PROFILE",))
    if not lib.ok or lib.path is None:
        raise SystemExit(f"the design does not build with its timers: {lib.log.strip()[-2000:]}")
    with tempfile.TemporaryDirectory(prefix="kf-ops-") as tmp:
        so = Path(tmp) / "read.so"
        subprocess.run([compiler(), "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(so),
                        str(READ_PROBE)], check=True)
        spec = {"design": design.as_dict(), "model": args.model, "library": str(lib.path), "probe": str(so),
                "context": args.context, "steps": args.steps, "rounds": args.rounds}
        env = {k: v for k, v in os.environ.items() if k not in design.omp_env()}
        env.update({k: v for k, v in design.omp_env().items() if v is not None})
        env["OMP_NUM_THREADS"] = str(args.threads)
        print(f"{design.design_id()} ({source}), {args.threads} threads, decode after {args.context} tokens",
              flush=True)
        rounds = []
        with subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                              text=True, env=env) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                r = json.loads(line)
                rounds.append(r)
                print(f"read {r['read_gbps']:.1f} GB/s | {1 / r['step_s']:.0f} tok/s, step {r['step_s'] * 1e3:.2f} ms"
                      " | " + " ".join(f"{op} {r['op_s'][op] * 1e3:.3f}" + (f" ({r['op_gbps'][op]:.0f})"
                                                                           if op in r["op_gbps"] else "")
                                       for op in OPS), flush=True)
        if proc.returncode != 0 or not rounds:
            raise SystemExit(f"the child failed (exit {proc.returncode})")
    med = {op: statistics.median(r["op_s"][op] for r in rounds) for op in OPS}
    gbps = {op: statistics.median(r["op_gbps"][op] for r in rounds) for op in rounds[0]["op_gbps"]}
    read = statistics.median(r["read_gbps"] for r in rounds)
    step = statistics.median(r["step_s"] for r in rounds)
    print(f"median of {len(rounds)} rounds: read {read:.1f} GB/s, step {step * 1e3:.2f} ms; per op ms (share of "
          "the step; GB/s over the read probe's):")
    for op in OPS:
        extra = f"; {gbps[op]:.1f} GB/s, {gbps[op] / read:.0%}" if op in gbps else ""
        print(f"  {op:10s} {med[op] * 1e3:.3f} ({med[op] / step:.0%}{extra})")
    print(f"  {'the rest':10s} {(step - sum(med.values())) * 1e3:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"design": design.as_dict(), "design_source": source,
                                               "threads": args.threads, "context": args.context,
                                               "steps": args.steps, "rounds": rounds,
                                               "median": {"read_gbps": read, "step_s": step, "op_s": med,
                                                          "op_gbps": gbps}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

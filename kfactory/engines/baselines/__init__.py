"""Baselines for the engine bench: what users run today, measured the same way as kfactory's engine.

- `numpy-ref`: kfactory.models.Reference (float64 numpy, the judge's truth);
- `torch-eager`: transformers' LlamaForCausalLM in fp32, eager attention, on the same dequantised weights;
- `llama-cpp`: llama-cpp-python on the same GGUF file.

Each runs in its own subprocess (`run_baseline`), with any interpreter that can import kfactory (torch or
llama_cpp may live in another virtual environment), and returns one dict shape (kfactory.engines.baselines.result):
decode tokens/s per context, prefill tokens/s, peak RSS, and the fraction of its roofline
(kfactory.engines.baselines.roofline) on this host. A baseline that cannot run is a result with a reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Sequence

from kfactory.engines.baselines.registry import MARKER, MODULES
from kfactory.engines.baselines.result import FAILED, add_roofline, empty

#: the baselines, in the order a bench shows them
BASELINES = tuple(MODULES)
#: the bench's defaults (the issue's figures: decode at contexts 128 and 1024, a 512-token prefill)
CONTEXTS = (128, 1024)
PREFILL_TOKENS = 512
#: the environment variables that fix a child's BLAS/OpenMP thread pools (read when those libraries load)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
               "NUMEXPR_NUM_THREADS")


def child_command(name: str, model_name: str, threads: int, python: str | None = None,
                  contexts: Sequence[int] = CONTEXTS, prefill: int = PREFILL_TOKENS, steps: int = 0,
                  check: bool = False) -> list[str]:
    """The command line of one baseline's child process."""
    cmd = [python or sys.executable, "-m", "kfactory.engines.baselines.child", name, "--model", model_name,
           "--threads", str(threads), "--contexts", ",".join(str(c) for c in contexts), "--prefill", str(prefill),
           "--steps", str(steps)]
    return cmd + (["--check"] if check else [])


def run_child(cmd: list[str], name: str, threads: int, timeout_s: float) -> dict:
    """Run a child command and return its JSON line; a crash, a timeout or no JSON is a failed result."""
    env = {**os.environ, **{v: str(threads) for v in THREAD_VARS}}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return empty(name, threads, FAILED, f"ran past {timeout_s:.0f} s")
    except OSError as e:
        return empty(name, threads, FAILED, f"could not start {cmd[0]}: {e}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    tail = (proc.stderr or proc.stdout).strip()[-800:]
    return empty(name, threads, FAILED, f"{cmd[0]} exited with {proc.returncode} and no result: {tail}")


def run_baseline(name: str, model_name: str, threads: int, python: str | None = None, *,
                 contexts: Sequence[int] = CONTEXTS, prefill: int = PREFILL_TOKENS, steps: int = 0,
                 ceilings: dict[str, float] | None = None, timeout_s: float = 1800.0) -> dict:
    """One baseline measured in its own subprocess (`python`: the interpreter, default this one), with its
    roofline fractions filled in when the host's `ceilings` are given (roofline.host_ceilings)."""
    if name not in MODULES:
        return empty(name, threads, FAILED, f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
    cmd = child_command(name, model_name, threads, python, contexts, prefill, steps)
    result = run_child(cmd, name, threads, timeout_s)
    return add_roofline(result, ceilings) if ceilings else result


def check_baseline(name: str, model_name: str, threads: int, python: str | None = None, new_tokens: int = 32,
                   timeout_s: float = 1800.0) -> dict:
    """A baseline's agreement with the reference (kfactory.engines.baselines.check), in its own subprocess."""
    cmd = child_command(name, model_name, threads, python, check=True) + ["--check-tokens", str(new_tokens)]
    return run_child(cmd, name, threads, timeout_s)


__all__ = ["BASELINES", "CONTEXTS", "PREFILL_TOKENS", "check_baseline", "child_command", "run_baseline"]

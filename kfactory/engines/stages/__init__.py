"""The pipeline's stages for a candidate that is a whole inference engine (a problem of kind "engine",
kfactory/engines/problem.py): one small module per stage, each called by its service in place of the kernel
judge's step, so the services keep one path for the bus, the locks, the device lease and the events.

- `coder`: a design point -> the engine's C source (kfactory.engines.codegen), or a typed codegen failure;
- `compiler`: the source -> the shared object's bytes (kfactory.engines.build), or a typed build failure;
- `verifier`: the object -> a Verdict from kfactory.engines.verify.Verifier (the engine runs in its child);
- `benchmarker`: the object -> a Measured (decode seconds per token at context 128, EngineRunner.bench in the
  child), or a typed rejection when the engine faults while timed.

Generated code runs only in the engine's child process (kfactory.engines.runner), never in a service.
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import TypeGuard

from kfactory.engines.problem import EngineProblem
from kfactory.problems import Problem

_lock = threading.Lock()


def is_engine(problem: Problem) -> TypeGuard[EngineProblem]:
    """Whether a problem's candidates are whole engines (the stages here judge them) rather than kernels."""
    return isinstance(problem, EngineProblem)


def library_path(data_dir: str | Path, artifact: bytes) -> Path:
    """The compiled engine `artifact` as a file the engine's child can load: written once under
    <data_dir>/engines/artifacts/, named by its sha256 (what runs is byte for byte what the compiler built)."""
    out = Path(data_dir) / "engines" / "artifacts" / f"{hashlib.sha256(artifact).hexdigest()}.so"
    with _lock:
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(f".{threading.get_ident()}.tmp")
            tmp.write_bytes(artifact)
            tmp.replace(out)   # atomic: a reader finds the whole object or none
    return out

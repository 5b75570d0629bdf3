"""The compiler's stage for an engine: its C source built as one shared object (kfactory.engines.build).

The artifact is the object's bytes: the verifier and the benchmarker run exactly what was built here (written
to a file named by its sha256, kfactory.engines.stages.library_path), with no compiler of their own. The build
is also cached by content under <data_dir>/engines/, beside its source, so `kfactory generate` and `kfactory
export` rebuild the winner from best.json by a cache lookup.
"""
from __future__ import annotations

from pathlib import Path

from kfactory.engines.build import build
from kfactory.targets.base import CompileResult
from kfactory.v1 import events_pb2 as pb

#: the compiler's log lines a build failure's message quotes (the whole log is its own artifact)
LOG_TAIL = 2000


def compile_engine(source: str, data_dir: str | Path) -> CompileResult:
    """The object's bytes and a compile report, or a typed COMPILE_ERROR with the compiler's log."""
    lib = build(source, Path(data_dir) / "engines")
    report = pb.CompileReport(compiler=lib.command.split(" ", 1)[0], seconds=lib.seconds)
    if not lib.ok or lib.path is None:
        report.log_excerpt = lib.log.strip()[-LOG_TAIL:]
        return CompileResult(False, report, log=lib.log, reason=pb.COMPILE_ERROR,
                             message=f"build failed: {report.log_excerpt}")
    artifact = lib.path.read_bytes()
    report.artifact_bytes = len(artifact)
    return CompileResult(True, report, artifact=artifact, log=lib.log)

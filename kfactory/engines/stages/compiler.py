"""The compiler's stage for an engine: its source bundle (kfactory/engines/stages/bundle.py: the generated C and
the searched kernels it links) built as one shared object (kfactory.engines.build), exactly as the local
campaign builds the design.

The artifact is the object's bytes: the verifier and the benchmarker run exactly what was built here (written
to a file named by its sha256, kfactory.engines.stages.library_path), with no compiler of their own. The build
is also cached by content under <data_dir>/engines/, beside its source, so `kfactory generate` and `kfactory
export` rebuild the winner from best.json by a cache lookup.
"""
from __future__ import annotations

import json
from pathlib import Path

from kfactory.engines.build import build
from kfactory.engines.design import DesignError, EngineDesign
from kfactory.engines.ops import OpKernelError, units_for
from kfactory.engines.stages.bundle import BundleError, unpack
from kfactory.targets.base import CompileResult
from kfactory.v1 import events_pb2 as pb

#: the compiler's log lines a build failure's message quotes (the whole log is its own artifact)
LOG_TAIL = 2000


def compile_engine(bundle: str, params_json: str, data_dir: str | Path) -> CompileResult:
    """The object's bytes and a compile report, or a typed failure: COMPILE_ERROR with the compiler's log, or
    STATIC_CHECK when the bundle is none, names kernels other than its design's, or holds a kernel whose flags or
    source the cpu target's rules refuse (checked again here: the compiler is where a source's rules hold)."""
    report = pb.CompileReport()
    try:
        src = unpack(bundle)
        design = EngineDesign.from_dict(json.loads(params_json or "{}"))
        if set(src.kernels) != set(design.searched_kernels()):
            raise OpKernelError(f"the bundle holds kernels of {sorted(src.kernels)}, the design "
                                f"{design.design_id()} links {sorted(design.searched_kernels())}")
        units = units_for(design, src.kernels)
    except (BundleError, DesignError, OpKernelError, ValueError) as e:
        return CompileResult(False, report, reason=pb.STATIC_CHECK, message=f"refused before compiling: {e}")
    lib = build(src.engine, Path(data_dir) / "engines", units=units)
    report.compiler, report.seconds = lib.command.split(" ", 1)[0], lib.seconds
    if not lib.ok or lib.path is None:
        report.log_excerpt = lib.log.strip()[-LOG_TAIL:]
        return CompileResult(False, report, log=lib.log, reason=pb.COMPILE_ERROR,
                             message=f"build failed: {report.log_excerpt}")
    artifact = lib.path.read_bytes()
    report.artifact_bytes = len(artifact)
    return CompileResult(True, report, artifact=artifact, log=lib.log)

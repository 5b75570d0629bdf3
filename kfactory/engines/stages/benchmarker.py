"""The benchmarker's stage for an engine: EngineRunner.bench in the engine's child, under the device lease the
service holds. The score is the median decode step's seconds at context 128 (seconds per token, lower is
better, as every campaign's objective); the prefill of those 128 tokens is a second timing, per token."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kfactory.engines import runner as engine_runner
from kfactory.engines.campaign import CONTEXT, DECODE_TOKENS, REPEATS
from kfactory.engines.problem import EngineProblem
from kfactory.engines.runner import EngineFault, EngineRunner
from kfactory.engines.stages import library_path
from kfactory.engines.stages.verifier import FAULT_REASONS
from kfactory.models import ModelError, load_model
from kfactory.sandbox.parent import HarnessError
from kfactory.v1 import events_pb2 as pb

#: the second timing's shape name: the prefill of the CONTEXT tokens the decode steps follow
PREFILL_SHAPE = f"prefill_{CONTEXT}"


def timing(shape: str, seconds: list[float]) -> pb.ShapeTiming:
    """Median, quartiles and noise ((q3 - q1) / median) of per-token seconds."""
    q1, med, q3 = (float(x) for x in np.percentile(seconds, [25, 50, 75]))
    return pb.ShapeTiming(shape=shape, median_s=med, q1_s=q1, q3_s=q3, samples=len(seconds),
                          noise=(q3 - q1) / med if med > 0 else 0.0)


def measure_engine(problem: EngineProblem, cand: pb.Candidate, artifact: bytes, data_dir: str | Path,
                   device: pb.DeviceInfo) -> pb.Measured | pb.Rejected:
    """Time a verified engine: a Measured whose first timing is decode at context CONTEXT (the score) and
    second the prefill per token, or a benchmarker Rejected when the engine faults while timed."""
    try:
        design = problem.family().design(json.loads(cand.params_json or "{}"))
    except ValueError as e:   # no design of the problem (bad JSON, a candidate from elsewhere): typed, never run
        return pb.Rejected(stage="benchmarker", reason=pb.INVALID_POINT, message=str(e), point_id=cand.point_id,
                           params_json=cand.params_json)
    so = library_path(data_dir, artifact)
    try:
        with EngineRunner(str(load_model(problem.model).directory), design, so, CONTEXT + DECODE_TOKENS + 8,
                          cache_dir=Path(data_dir) / "models") as engine:
            fig = engine.bench(CONTEXT, DECODE_TOKENS, REPEATS)
    except EngineFault as e:
        return pb.Rejected(stage="benchmarker", reason=FAULT_REASONS.get(e.kind, pb.CRASHED),
                           message=f"bench failed: engine fault while timing ({e.kind}): {e}",
                           point_id=cand.point_id, params_json=cand.params_json)
    except engine_runner.HarnessError as e:
        raise HarnessError(f"engine benchmarker: {e}", e.traceback) from e
    except ModelError as e:   # the model's files, not the engine: no verdict on the candidate
        raise HarnessError(f"engine benchmarker: the model does not open: {e}") from e
    decode = timing(str(CONTEXT), fig.step_s)
    prefill = timing(PREFILL_SHAPE, [s / CONTEXT for s in fig.prefill_s])
    return pb.Measured(device=device, timings=[decode, prefill], score_s=decode.median_s)

"""The verifier's stage for an engine: kfactory.engines.verify.Verifier on the compiled object, its verdict in
the judge's terms (kfactory.judge.verify.Verdict: passed, or a typed reason; every check's figures)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

from kfactory.engines import runner as engine_runner
from kfactory.engines.campaign import rejection_reason
from kfactory.engines.problem import EngineProblem
from kfactory.engines.stages import library_path
from kfactory.engines.verify import CheckResult, Verdict as EngineVerdict, Verifier
from kfactory.judge.verify import Verdict
from kfactory.models import ModelError
from kfactory.sandbox.parent import HarnessError
from kfactory.v1 import events_pb2 as pb

#: an engine fault's kind (kfactory.engines.runner) -> the reason a rejection gives; a failed check without a
#: fault computed the wrong logits
FAULT_REASONS = {"crashed": pb.CRASHED, "timeout": pb.TIMEOUT, "load_failed": pb.LAUNCH_FAILED,
                 "engine": pb.WRONG_RESULT}

_verifiers: dict[tuple[str, str], tuple[Verifier, threading.Lock]] = {}
_made = threading.Lock()


def verifier_for(model: str, data_dir: str | Path) -> tuple[Verifier, threading.Lock]:
    """One Verifier per (model, data dir) in this process, with a lock: its reference cache and plan are shared
    by every engine it verifies, one at a time."""
    with _made:
        key = (model, str(data_dir))
        if key not in _verifiers:
            root = Path(data_dir)
            _verifiers[key] = (Verifier(model, cache_dir=root / "models", reference_dir=root / "engines" / "reference"),
                               threading.Lock())
        return _verifiers[key]


def check_of(c: CheckResult, tolerance: float) -> pb.Check:
    """One engine check as the events carry it: its name as the shape, the error over the reference logits'
    spread as norm_rel_err, the first failing step as worst_index (-1 when none)."""
    return pb.Check(shape=c.name, distribution="engine", norm_rel_err=c.max_err, max_abs_err=c.max_abs_err,
                    max_rel_err=c.max_err, passed=c.passed,
                    worst_index=-1 if c.first_failing_step is None else c.first_failing_step,
                    note=c.detail or f"{c.steps} steps within {tolerance:g} of the spread")


def verdict_of(v: EngineVerdict) -> Verdict:
    """The engine's verdict in the judge's terms: the reason from its fault's kind, the message naming the first
    failing check."""
    checks = [check_of(c, v.tolerance) for c in v.checks]
    if v.passed:
        return Verdict(True, checks=checks)
    reason = FAULT_REASONS.get(v.fault_kind or "", pb.CRASHED) if v.fault else pb.WRONG_RESULT
    return Verdict(False, reason, rejection_reason(v), checks)


def verify_engine(problem: EngineProblem, cand: pb.Candidate, artifact: bytes, data_dir: str | Path) -> Verdict:
    """Verify the compiled engine `artifact` of candidate `cand` (its design in params_json) in its child. The
    harness's own failures raise kfactory.sandbox.parent.HarnessError (the service dead-letters the work)."""
    try:
        design = problem.family().design(json.loads(cand.params_json or "{}"))
    except ValueError as e:   # no design of the problem (bad JSON, a candidate from elsewhere): typed, never run
        return Verdict(False, pb.INVALID_POINT, str(e))
    try:
        verifier, lock = verifier_for(problem.model, data_dir)
        with lock:
            return verdict_of(verifier.verify(design, library_path(data_dir, artifact)))
    except engine_runner.HarnessError as e:
        raise HarnessError(f"engine verifier: {e}", e.traceback) from e
    except ModelError as e:   # the model's files, not the engine: no verdict on the candidate
        raise HarnessError(f"engine verifier: the model does not open: {e}") from e

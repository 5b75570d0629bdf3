"""`kfactory check`: judge one kernel exactly as a campaign judges a candidate, without the services.

Compile (with the target's static checks), verify on every shape and distribution, and if it passes,
time it interleaved with the problem's reference kernel and baselines.
"""
from __future__ import annotations

from google.protobuf.json_format import MessageToDict

from kfactory import events as ev
from kfactory.judge import InputPool, available_baselines, measure, verify
from kfactory.problems import load_problem
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb


def _dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def check(problem_name: str, target_spec: str, source: str, flags: str, settings,
          compile_only: bool = False) -> dict:
    """The verdict on one kernel as a JSON-ready dict (see the README for its fields)."""
    problem = load_problem(problem_name)
    target = get_target(target_spec, settings)
    threads = settings.threads
    out = {"candidate_id": ev.candidate_id(source, "c", flags, "kernel", threads, target_spec),
           "problem": problem.name, "target": target_spec, "compiled": False, "compile": None,
           "verdict": None, "measurement": None, "speedup_vs_reference": None}
    res = target.compile(source, "c", flags, "kernel")
    out["compiled"] = res.ok
    out["compile"] = _dict(res.report) if res.ok else {"reason": pb.RejectReason.Name(res.reason),
                                                       "message": res.message, "log": res.log[-4000:]}
    if not res.ok:
        out["verdict"] = {"passed": False, "reason": pb.RejectReason.Name(res.reason), "message": res.message,
                          "checks": []}
        return out
    if compile_only:
        return out
    session = target.session(problem, threads)
    try:
        session.load_artifact("candidate", res.artifact, "kernel")
        v = verify(session, "candidate", problem, InputPool(problem, 1))
        out["verdict"] = {"passed": v.passed, "reason": pb.RejectReason.Name(v.reason) if not v.passed else None,
                          "message": v.message, "checks": [_dict(c) for c in v.checks]}
        if v.passed:
            _measure(out, session, target, problem, settings)
    finally:
        session.close()
    return out


def _measure(out: dict, session, target, problem, settings) -> None:
    keys = {"candidate": "candidate"}
    if target.name in problem.spec.reference_kernel:
        ref_source, ref_flags = problem.reference_source(target.name)
        ref = target.compile(ref_source, "c", ref_flags, "kernel")
        if ref.ok:
            session.load_artifact("reference", ref.artifact, "kernel")
            keys["reference"] = "reference"
    for b in available_baselines(problem):
        session.load_baseline(f"baseline:{b}", b)
        keys[b] = f"baseline:{b}"
    dev = target.device()
    pool = InputPool(problem, 1)
    shapes, speedups = {}, {}
    for shape in problem.shapes("optimize"):
        name = problem.shape_str(shape)
        t = measure(session, list(keys.values()), problem, shape, pool, target.cache_bytes(), settings,
                    settings.compare_max_s, dev)
        if t.reason:
            out["verdict"].update(passed=False, reason=pb.RejectReason.Name(t.reason), message=t.message)
            return
        cand = t.timings["candidate"]
        shapes[name] = {n: _dict(t.timings[k]) for n, k in keys.items()}
        speedups[name] = {n: t.timings[k].median_s / cand.median_s for n, k in keys.items() if n != "candidate"}
    out["measurement"] = {"device": _dict(dev), "shapes": shapes, "speedups": speedups}
    primary = problem.shape_str(problem.shapes("optimize")[0])
    out["speedup_vs_reference"] = speedups[primary].get("reference")

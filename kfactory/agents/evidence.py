"""What an agent is shown about its parent candidates: each one's source and the evidence of every stage
(compile log and resource report, verification failures with the worst input's figures, timings and roofline
fractions), read from memory's Evidence service and the artifact store."""
from __future__ import annotations

from typing import Any

import grpc

from kfactory.bus import events as ev
from kfactory.platform.evidence_client import EvidenceClient
from kfactory.bus.errors import ArtifactMissing
from kfactory.observability.log import get_logger
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

LOG_CHARS = 4000
TERMINAL = ("measured", "rejected", "compile_failed")
#: gRPC codes that waiting cures: memory has not archived the parent yet, or is restarting or slow
NOT_YET = frozenset({grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
log = get_logger("agents")


class EvidenceNotReady(RuntimeError):
    """Memory has not archived a parent's result yet (it follows the events stream): try again shortly."""


async def lessons(addr: str, settings, problem: str, target: str) -> str:
    """Memory's lessons for (problem, target) as text; "" when memory has none or cannot be reached (the agent
    then works from its parents' evidence alone, and the log says why it got no lessons)."""
    try:
        async with EvidenceClient(addr, settings) as memory:
            r = await memory.Lessons(spb.LessonsRequest(problem=problem, target=target))
    except grpc.aio.AioRpcError as e:
        log.warning("no lessons from memory; the prompt goes without them", addr=addr, code=e.code().name)
        return ""
    return r.text


async def parents(addr: str, settings, bus, campaign_id: str, ids: list[str], problem,
                  device: pb.DeviceInfo) -> list[dict]:
    """The evidence of each parent, as plain data for the prompt. Raises EvidenceNotReady while memory lacks a
    parent's final result in this campaign."""
    out = []
    async with EvidenceClient(addr, settings) as memory:
        for pid in ids:
            try:
                r = await memory.Candidate(spb.CandidateRequest(id=pid))
            except grpc.aio.AioRpcError as e:
                if e.code() not in NOT_YET:
                    raise  # a refused token, a bad request: not cured by waiting; the bus retries, then dead-letters
                raise EvidenceNotReady(f"parent {pid[:12]}: {e.code().name}") from e
            events = [e for e in r.events if e.campaign_id == campaign_id] or list(r.events)
            if not any(ev.kind_of(e) in TERMINAL for e in events):
                raise EvidenceNotReady(f"parent {pid[:12]} has no final result in memory yet")
            out.append(await _one(bus, r, events, problem, device))
    return out


async def _one(bus, r: spb.CandidateEvidence, events: list[pb.Event], problem, device: pb.DeviceInfo) -> dict:
    c = r.candidate
    item: dict[str, Any] = {
        "id": c.id, "short": c.id[:12], "origin": c.origin, "params": c.params_json, "flags": c.compile_flags,
        "language": c.language, "launch": c.launch_json, "source": r.source, "status": "", "compile": None,
        "rejection": None, "failures": [], "checks_passed": 0, "checks_failed": 0, "timings": []}
    for e in events:
        kind = ev.kind_of(e)
        if kind in ("compiled", "compile_failed"):
            body = getattr(e, kind)
            item["compile"] = await _compile(bus, body.report)
        if kind == "compile_failed":
            item["status"] = "compile_failed"
            item["rejection"] = {"stage": "compiler", "reason": pb.RejectReason.Name(e.compile_failed.reason),
                                 "message": e.compile_failed.message[:1500]}
        elif kind == "rejected":
            item["status"] = "rejected"
            rej = e.rejected
            item["rejection"] = {"stage": rej.stage, "reason": pb.RejectReason.Name(rej.reason),
                                 "message": rej.message[:1500],
                                 "figures": {k: v for k, v in sorted(rej.figures.items())}}
            _checks(item, rej.checks)
        elif kind == "verified":
            item["status"] = item["status"] or "verified"
            _checks(item, e.verified.checks)
        elif kind == "measured":
            item["status"] = "measured"
            item["timings"] = [_timing(t, problem, device) for t in e.measured.timings]
            item["screened_out"] = e.measured.screened_out
    return item


async def _compile(bus, rep: pb.CompileReport) -> dict:
    text = rep.log_excerpt
    if rep.log_digest:
        try:
            text = (await bus.get_artifact(rep.log_digest)).decode(errors="replace")
        except ArtifactMissing:
            pass  # the report's own excerpt stands in for the full log
    if len(text) > LOG_CHARS:
        text = text[:LOG_CHARS // 2] + "\n[...]\n" + text[-LOG_CHARS // 2:]
    resources = {k: getattr(rep, k) for k in ("registers", "shared_bytes", "stack_bytes", "spill_store_bytes",
                                               "spill_load_bytes", "local_bytes") if getattr(rep, k)}
    return {"compiler": rep.compiler, "seconds": rep.seconds, "warnings": rep.warnings, "arch": rep.arch,
            "log": text.strip(), "resources": resources, "imports": list(rep.imports)[:40]}


def _checks(item: dict, checks) -> None:
    failed = [c for c in checks if not c.passed]
    item["checks_passed"] = len(checks) - len(failed)
    item["checks_failed"] = len(failed)
    # the worst input first: the largest norm-relative error (a NaN counts as the worst)
    failed.sort(key=lambda c: -c.norm_rel_err if c.norm_rel_err == c.norm_rel_err else -float("inf"))
    item["failures"] = [{"shape": c.shape, "distribution": c.distribution, "seed": c.seed,
                         "max_abs_err": c.max_abs_err, "max_rel_err": c.max_rel_err,
                         "norm_rel_err": c.norm_rel_err, "worst_index": c.worst_index, "note": c.note}
                        for c in failed[:3]]


def _timing(t: pb.ShapeTiming, problem, device: pb.DeviceInfo) -> dict:
    out = {"shape": t.shape, "median_ms": t.median_s * 1e3, "noise": t.noise, "samples": t.samples,
           "gbps": t.gbps, "bandwidth_fraction": t.sol_fraction, "flops_fraction": None}
    try:
        _, flops = problem.cost(problem.parse_shape(t.shape))
    except ValueError:
        return out
    if device.peak_gflops and t.median_s:
        out["flops_fraction"] = flops / t.median_s / 1e9 / device.peak_gflops
    return out

"""Only the candidate's own faults become verdicts (issue 25): a failure of the harness's own code, in the runner
child or at the protocol, is a HarnessError (not a RunnerFault) that propagates out of the judge, and the service
dead-letters the work (cause HARNESS_FAILED) and records no verdict; a crashing kernel is still CRASHED.

The harness bugs are injected where they would really happen: a request the child cannot serve, sent through the
real parent/child pipe, or the parent's encoder corrupting what it sends."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from conftest import kernel_source
from kfactory.bus import events as ev
from kfactory.judge.checks import InputPool
from kfactory.judge.verify import verify
from kfactory.platform.app import start_services
from kfactory.problems import load_problem
from kfactory.sandbox import protocol
from kfactory.sandbox.parent import HarnessError, Runner, RunnerFault
from kfactory.sandbox.protocol import REJECT_REASONS, Bench, Call, FaultKind, Ping
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb


def _corrupt_calls(monkeypatch) -> None:
    """The parent's encoder with a bug: the tensors of every call and bench go out with a dtype no child knows."""
    real = protocol.encode_request

    def buggy(req):
        line = real(req)
        if not isinstance(req, (Call, Bench)):
            return line
        obj = json.loads(line)
        argsets = [obj["args"]] if isinstance(req, Call) else [s for k in obj["kernels"] for s in k["argsets"]]
        for a in (a for argset in argsets for a in argset):
            if "path" in a:
                a["dtype"] = "no_such_dtype"
        return (json.dumps(obj) + "\n").encode()

    monkeypatch.setattr(protocol, "encode_request", buggy)


def test_every_candidate_fault_kind_has_a_reason_and_harness_has_none():
    assert set(REJECT_REASONS) == {k for k in FaultKind if k.is_candidate}
    assert not FaultKind.HARNESS.is_candidate
    with pytest.raises(ValueError):
        FaultKind.HARNESS.reason
    assert not issubclass(HarnessError, RunnerFault)


def test_a_request_the_child_cannot_serve_is_a_harness_error_with_its_traceback():
    """A call of a kernel that was never loaded: the child's own code fails (KeyError), which used to come back
    as ok:false, then LoadFailed, then a CRASHED verdict on the candidate."""
    runner = Runner(1, timeout_s=20)
    try:
        with pytest.raises(HarnessError) as ei:
            runner.request(Call("never-loaded", []))
        assert not isinstance(ei.value, RunnerFault)
        assert "KeyError" in str(ei.value) and "_bind" in ei.value.traceback
        assert runner.proc is None  # a child whose own code failed is replaced
        assert runner.request(Ping()).pid > 0
    finally:
        runner.stop()


def test_bytes_the_child_cannot_read_are_a_harness_error(monkeypatch):
    monkeypatch.setattr(protocol, "encode_request", lambda req: b'{"op": "ping", "unexpected": 1}\n')
    runner = Runner(1, timeout_s=20)
    try:
        with pytest.raises(HarnessError, match="bad request"):
            runner.request(Ping())
    finally:
        monkeypatch.undo()
        runner.stop()


@pytest.fixture
def cpu(settings, small_softmax):
    target = get_target("cpu", settings)
    problem = load_problem(small_softmax)
    session = target.session(problem, 2)
    source, flags = problem.reference_source("cpu")
    res = target.compile(source, "c", flags, "kernel")
    assert res.ok, res.log
    session.load_artifact("ref", res.artifact, "kernel")
    yield target, problem, session
    session.close()


def test_verify_lets_a_harness_error_through_and_still_judges_a_crash(cpu, monkeypatch):
    target, problem, session = cpu
    res = target.compile(kernel_source("segfault"), "c", "-O2", "kernel")
    session.load_artifact("segv", res.artifact, "kernel")
    crashed = verify(session, "segv", problem, InputPool(problem, 1))
    assert not crashed.passed and crashed.reason == pb.CRASHED, crashed.message
    _corrupt_calls(monkeypatch)
    with pytest.raises(HarnessError, match="no_such_dtype"):
        verify(session, "ref", problem, InputPool(problem, 1))
    monkeypatch.undo()
    shape = problem.shapes("optimize")[0]
    x = {"x": np.ones((shape["rows"], shape["cols"]), np.float32)}
    np.testing.assert_allclose(session.call("ref", shape, x).outputs["y"], 1.0 / shape["cols"], rtol=1e-5)


# -- through the verifier service ---------------------------------------------------------------------------

#: per stage: the role that queues its work (it has none of its own here), the work's body, and its verdicts
STAGES = {"verifier": ("compiler", "compiled", ("rejected", "verified")),
          "benchmarker": ("verifier", "verified", ("rejected", "measured"))}


async def _judged_by_the_service(settings, problem_dir: str, source: str, stage: str = "verifier") -> list[pb.Event]:
    """Send `source` (a cpu kernel) to a running verifier or benchmarker; the campaign's events once the candidate's
    outcome (a verdict, or a dead letter) is in memory's archive."""
    sender, body, verdicts = STAGES[stage]
    running = await start_services(settings, names=(sender, stage, "memory"))
    try:
        bus = running.ctx.bus
        memory: Any = running.services["memory"]   # the memory service: its archive
        cid = "charness"
        res = running.ctx.target("cpu").compile(source, "c", "-O2", "kernel")
        assert res.ok, res.log
        cand = pb.Candidate(id=ev.sha256_hex(source), campaign_id=cid, problem=problem_dir, target="cpu",
                            language="c", compile_flags="-O2", entry="kernel", origin="manual:harness",
                            runner_threads=2)
        digest = await bus.put_artifact(res.artifact)
        spec = pb.CampaignSpec(problem=problem_dir, target="cpu", budget_candidates=1)
        await bus.publish(ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec)))
        msg = (pb.Compiled(candidate=cand, artifact_digest=digest) if body == "compiled"
               else pb.Verified(candidate=cand, artifact_digest=digest))
        work = ev.make_event(cid, sender, cand.id, **{body: msg})
        await bus.publish(work)
        await bus.send_work(stage, work)
        outcomes = (*verdicts, "dead_letter")
        async with asyncio.timeout(60):
            while not any(ev.kind_of(e) in outcomes for e in memory.archive.events(campaign=cid)):
                assert running.failed() is None, running.failed()
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a verdict published after the dead letter would show by now
        return memory.archive.events(campaign=cid)
    finally:
        await running.shutdown()


def _kinds(events: list[pb.Event], work: str) -> list[str]:
    return [ev.kind_of(e) for e in events if ev.kind_of(e) not in ("campaign_started", work)]


@pytest.mark.parametrize("stage", list(STAGES))
async def test_a_harness_bug_is_an_internal_dead_letter_and_no_verdict(bus_settings, small_softmax, monkeypatch,
                                                                       stage):
    _corrupt_calls(monkeypatch)
    source, _ = load_problem(small_softmax).reference_source("cpu")
    events = await _judged_by_the_service(bus_settings, small_softmax, source, stage)
    assert _kinds(events, STAGES[stage][1]) == ["dead_letter"], _kinds(events, STAGES[stage][1])
    [letter] = [e.dead_letter for e in events if e.HasField("dead_letter")]
    assert letter.cause == pb.HARNESS_FAILED and "no_such_dtype" in letter.reason, letter.reason
    assert letter.reason.startswith(f"harness error in {stage}: "), letter.reason
    assert letter.stage == stage and letter.deliveries == 1  # dead-lettered at once, not retried


async def test_a_crashing_kernel_through_the_service_is_still_crashed(bus_settings, small_softmax):
    events = await _judged_by_the_service(bus_settings, small_softmax, kernel_source("segfault"))
    assert _kinds(events, "compiled") == ["rejected"], _kinds(events, "compiled")
    [rej] = [e.rejected for e in events if e.HasField("rejected")]
    assert rej.reason == pb.CRASHED and rej.stage == "verifier", rej.message


def test_requests_and_replies_round_trip_with_their_nested_dataclasses():
    """The protocol's lines (its own field encoding, no deep copy): a bench with its kernels' argument sets, and a
    reply with a fault, decode to what was encoded; anything else in a field is refused as JSON would."""
    arg = {"kind": "tensor", "name": "x", "offset": 64, "nbytes": 400, "dtype": "float32", "shape": [1, 100]}
    bench = protocol.Bench(kernels=[protocol.BenchKernel("a", [[arg], [dict(arg, offset=512)]])], min_samples=3,
                           min_s=0.1, max_s=0.2, noise=0.03, warmup_s=0.0, shape={"rows": 1, "cols": 100})
    line = protocol.encode_request(bench)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode_request(line) == bench
    # the same bytes as the plain (deep-copying) encoding, which the runner child read before
    assert line == (json.dumps({"op": "bench", **dataclasses.asdict(bench)}) + "\n").encode()
    for kind in protocol.FaultKind:
        reply = protocol.Reply(fault=protocol.Fault(kind=kind, message="m"), samples={"a": [0.5, 0.25]})
        assert protocol.decode_reply(protocol.encode_reply(reply)) == reply
        assert protocol.encode_reply(reply) == (json.dumps(dataclasses.asdict(reply)) + "\n").encode()
    with pytest.raises(TypeError, match="not JSON serializable"):
        protocol.encode_request(protocol.Bench(kernels=[], min_samples=1, min_s=0, max_s=0, noise=0, warmup_s=0,
                                               reference={"bad": object()}))

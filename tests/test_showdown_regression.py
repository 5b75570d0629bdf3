"""A comparison (a showdown, or the final one) that finds a kernel wrong (its timed outputs on a set drawn from a
seed) tells memory the input that exposed it (the benchmarker's failed_in), and memory keeps it as a regression
input, as it keeps a rejected measurement's: every later verification of the problem runs it
(tests/test_regressions.py runs that path through the services)."""
from __future__ import annotations

import sys

import pytest
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.judge.checks import RegressionInput
from kfactory.judge.measure import Timing
from kfactory.services.benchmarker.service import failed_in
from kfactory.services.memory.archive import Archive
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from evidence_chain import chain  # noqa: E402


def _cand(cid: str) -> pb.Candidate:
    return pb.Candidate(id=cid, point_id="p-" + cid, campaign_id="c1", problem="softmax", target="cpu",
                        origin="template:cpu_c", params_json="{}")


def _comparison(key: str, failed: str, reason: pb.RejectReason, dist: str | None, seed: int = 1234567,
                showdown: bool = True) -> pb.Event:
    """The benchmarker's answer when `failed` failed with `reason`, exposed by the set drawn from (dist, seed)."""
    comp = pb.Comparison(shape="4096x4096", candidate_id="k1", showdown=showdown)
    failed_in(comp, Timing(reason=reason, failed_key=failed, message="4096x4096: output of the timed calls (set 3) "
                           "is wrong", failed_input=RegressionInput("4096x4096", dist, seed) if dist else None))
    assert comp.error.startswith(pb.RejectReason.Name(reason)) and comp.failed_reason == reason
    return ev.make_event("c1", "benchmarker", key, comparison=comp)


def test_a_comparison_that_found_a_kernel_wrong_leaves_its_input_as_a_regression_input(tmp_path):
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in [*chain("c1", _cand("k1"), 0.005), *chain("c1", _cand("k2"), 0.0051)]:
            archive.record(e)
        # nothing exposed by an input (a probe after the timing, a crash), a kernel no campaign ever passed, a
        # baseline (no candidate): nothing is kept
        for i, (failed, reason, dist) in enumerate([("k2", pb.WRONG_RESULT, None), ("k2", pb.CRASHED, None),
                                                    ("k9", pb.WRONG_RESULT, "normal"),
                                                    ("baseline:numpy", pb.WRONG_RESULT, "normal")]):
            archive.record(_comparison(f"s{i}", failed, reason, dist))
        assert archive.regressions("softmax") == []
        archive.record(_comparison("showdown", "k2", pb.WRONG_RESULT, "normal"))
        archive.record(_comparison("final", "k1", pb.WRONG_RESULT, "device:normal", seed=99, showdown=False))
        kept = archive.regressions("softmax")
    finally:
        archive.close()
    assert [(r.shape, r.distribution, r.seed, r.candidate_id, r.campaign_id, r.reason) for r in kept] == \
        [("4096x4096", "normal", 1234567, "k2", "c1", "WRONG_RESULT"),
         ("4096x4096", "device:normal", 99, "k1", "c1", "WRONG_RESULT")]
    assert kept[0].note.startswith("4096x4096: output of the timed calls")   # the check's words, not the error's


@pytest.mark.parametrize("order", [("verified", "compiled", "created", "measured"),   # the pass first
                                   ("created", "compiled", "verified", "measured"),   # the candidate first
                                   ("created", "elsewhere")])   # its only pass in another campaign
def test_a_comparison_archived_before_the_kernel_it_found_wrong_keeps_its_input_once_that_kernel_is_here(
        tmp_path, order):
    """After a restart memory may read a showdown before its failed contender's chain (a comparison waits only for
    its own candidate's measurement): the input is owed, and kept once the contender's candidate and a pass of it
    (any campaign's) are archived, whichever comes last; only once."""
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in chain("c1", _cand("k1"), 0.005):
            archive.record(e)
        archive.record(_comparison("showdown", "k2", pb.WRONG_RESULT, "normal"))
        created, compiled, verified, measured = chain("c1", _cand("k2"), 0.0051)
        elsewhere = ev.make_event("c2", "verifier", "k2", verified=verified.verified)
        events = {"created": created, "compiled": compiled, "verified": verified, "measured": measured,
                  "elsewhere": elsewhere}
        archive.record(ev.make_event("c2", "planner", "start", campaign_started=pb.CampaignStarted()))
        kept_after = []
        for step in order:
            archive.record(events[step])
            kept_after.append(len(archive.regressions("softmax")))
        archive.record(ev.make_event("c1", "verifier", "k2-again", verified=verified.verified))   # a second pass
        kept = archive.regressions("softmax")
    finally:
        archive.close()
    # nothing until both the candidate and a pass are here
    settled = max(order.index("created"), order.index("verified" if "verified" in order else "elsewhere"))
    assert kept_after == [0] * settled + [1] * (len(order) - settled)
    assert [(r.seed, r.candidate_id, r.campaign_id, r.reason) for r in kept] == [(1234567, "k2", "c1", "WRONG_RESULT")]

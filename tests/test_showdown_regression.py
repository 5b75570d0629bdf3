"""A showdown that finds one of its kernels wrong (its timed outputs on a set drawn from a seed) tells memory the
input that exposed it, and memory keeps it as a regression input, as it keeps a rejected measurement's: every
later verification of the problem runs it (tests/test_regressions.py runs that path through the services)."""
from __future__ import annotations

import sys
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.services.memory.archive import Archive
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from evidence_chain import chain  # noqa: E402


def _cand(cid: str) -> pb.Candidate:
    return pb.Candidate(id=cid, point_id="p-" + cid, campaign_id="c1", problem="softmax", target="cpu",
                        origin="template:cpu_c", params_json="{}")


def _showdown(failed: str, reason: pb.RejectReason, checks: list[pb.Check]) -> pb.Event:
    comp = pb.Comparison(shape="4096x4096", candidate_id="k1", showdown=True, failed_candidate=failed,
                         failed_reason=reason, error=f"{pb.RejectReason.Name(reason)}: set 3 is wrong")
    comp.checks.extend(checks)
    return ev.make_event("c1", "benchmarker", f"showdown:k1:{failed}:{reason}", comparison=comp)


def test_a_showdown_that_found_a_kernel_wrong_leaves_its_input_as_a_regression_input(tmp_path):
    wrong = pb.Check(shape="4096x4096", distribution="normal", seed=1234567, note="set 3 is wrong")
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in [*chain("c1", _cand("k1"), 0.005), *chain("c1", _cand("k2"), 0.0051)]:
            archive.record(e)
        assert archive.regressions("softmax") == []
        # a crash exposes no input, and a kernel no campaign ever passed is not a regression
        archive.record(_showdown("k2", pb.CRASHED, [wrong]))
        archive.record(_showdown("k9", pb.WRONG_RESULT, [wrong]))
        assert archive.regressions("softmax") == []
        archive.record(_showdown("k2", pb.WRONG_RESULT, [wrong]))
        kept = archive.regressions("softmax")
    finally:
        archive.close()
    assert [(r.shape, r.distribution, r.seed, r.candidate_id, r.campaign_id, r.reason) for r in kept] == \
        [("4096x4096", "normal", 1234567, "k2", "c1", "WRONG_RESULT")]

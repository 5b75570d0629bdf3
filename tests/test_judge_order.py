"""The judge's order (issue 23, kfactory/judge/order.py): the search's candidates are timed briefly before they are
verified, and one that cannot rank is recorded as screened out with that timing, never verified, and never a
result; one that can is verified and measured in full, so every kernel that can become a result meets the whole
judge. A grid over tests/order/ proposes, one at a time after the reference kernel: a fast honest kernel, a slow
honest one, a slow wrong one, a fast wrong one and one that crashes."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from kfactory.evidence import trust
from kfactory.export.evidence import NotVerified, judged
from kfactory.judge.order import screens_first
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from test_campaign import _campaign

# a screen's verdict is a timing: `make test` runs these alone (the serial marker)
pytestmark = pytest.mark.serial
ORDER = Path(__file__).parent / "order"


@pytest.fixture
def order_problem(tmp_path, small_softmax) -> str:
    """The small softmax package with tests/order/ as its only cpu family."""
    dst = tmp_path / "softmax_order"
    shutil.copytree(small_softmax, dst)
    shutil.rmtree(dst / "families")
    shutil.copytree(ORDER, dst / "families" / "cpu_order")
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["families"] = ["cpu_order"]
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(dst)


async def test_a_search_candidate_that_cannot_rank_is_screened_out_never_verified_and_never_a_result(
        memory_bus_settings, order_problem):
    spec = pb.CampaignSpec(problem=order_problem, target="cpu", budget_candidates=5, strategy="grid", seed=1,
                           parallel=1, warm_start=0)
    st, running = await _campaign(memory_bus_settings, spec)
    assert st.finished.state == "completed"
    memory = running.services["memory"]
    events = memory.archive.events(campaign=st.id)
    kinds: dict[str, set[str]] = {}
    kind_of = {}
    for e in events:
        cand = e.WhichOneof("body") and getattr(e, e.WhichOneof("body"))
        c = getattr(cand, "candidate", None)
        if c is not None and c.id:
            kinds.setdefault(c.id, set()).add(e.WhichOneof("body"))
            if c.params_json:
                kind_of[c.id] = yaml.safe_load(c.params_json).get("kind")
    by_kind = {k: cid for cid, k in kind_of.items()}
    measured = {e.measured.candidate.id: e.measured for e in events if e.HasField("measured")}
    rejected = {e.rejected.candidate.id: e.rejected for e in events if e.HasField("rejected")}

    # the slow ones, honest or not, were screened out before any verification, with their screening timing only
    for k in ("slow", "slow_wrong"):
        m = measured[by_kind[k]]
        assert m.screened_out and len(m.timings) == 1 and m.score_s > 1.5 * measured[by_kind["fast"]].score_s, k
        assert "verified" not in kinds[by_kind[k]], k
        # never a result: export refuses it for want of a verification
        evidence = memory.queries.candidate(spb.CandidateRequest(id=by_kind[k]))
        with pytest.raises(NotVerified):
            judged(evidence)
    # the fast wrong one (zeros) could rank, so the verifier judged it, and turned it down
    assert rejected[by_kind["fast_wrong"]].reason == pb.WRONG_RESULT
    assert rejected[by_kind["fast_wrong"]].stage == "verifier"
    # a kernel that faults during its screen is a typed result, as anywhere in the judge
    assert rejected[by_kind["crash"]].reason == pb.CRASHED and rejected[by_kind["crash"]].stage == "benchmarker"
    # the best is the fast honest kernel, verified and measured in full, for the planner and for memory
    fast = measured[by_kind["fast"]]
    assert not fast.screened_out and len(fast.timings) == 2 and "verified" in kinds[by_kind["fast"]]
    # a package that weighs nothing: the first shape's median is the score, and no weights are recorded
    assert fast.score_s == fast.timings[0].median_s and not fast.objective
    assert st.best().candidate.id == by_kind["fast"]
    found, _ = memory.archive.best(memory.archive.problem_name(st.spec.problem))
    assert found.candidate.id == by_kind["fast"]
    assert {c.candidate_id for c in st.comparisons.values()} == {by_kind["fast"]}
    # the reference kernel is verified first, as a hand-written kernel would be
    assert "verified" in kinds[st.reference_id]


def test_which_candidates_are_screened_first(settings):
    cpu = get_target("cpu", settings)
    for origin, first in (("template:cpu_c", True), ("warm:cpu_c", True), ("agent:repairer", True),
                          ("reference", False), ("manual:mine", False)):
        assert screens_first(pb.Candidate(origin=origin), settings, cpu) is first, origin
    search = pb.Candidate(origin="template:cpu_c")
    assert not screens_first(search, settings.model_copy(update={"judge_order": "verify_first"}), cpu)
    assert not screens_first(search, settings.model_copy(update={"screen_max_s": 0.0}), cpu)


def test_a_screened_out_timing_needs_no_verification_and_a_measurement_does():
    assert trust.missing_links({"candidate_created", "compiled"}, screened_out=True) == []
    assert trust.missing_links({"candidate_created", "compiled"}) == ["verified"]
    assert trust.missing_links({"candidate_created"}, screened_out=True) == ["compiled"]

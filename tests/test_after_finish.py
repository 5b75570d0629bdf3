"""Work begun before a campaign's end that ends after it (a cancel while a candidate is being measured): its
results are archived and listed, but the campaign's counts stay what it finished with, and both the planner's
and memory's status count the late ones apart (CampaignStatus.after_finish); the leaderboard marks them."""
from __future__ import annotations

import sys
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.cli.client import _status_line
from kfactory.problems import load_problem
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import Queries
from kfactory.services.planner.campaign import CampaignState
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

sys.path.insert(0, str(Path(__file__).parent))
from evidence_chain import chain, links, measured  # noqa: E402

SPEC = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=3, strategy="random", seed=1)


def _cand(cid: str) -> pb.Candidate:
    return pb.Candidate(id=cid, problem="softmax", target="cpu", origin="template:cpu_c", params_json="{}")


def _campaign() -> tuple[list[pb.Event], pb.Event, list[pb.Event]]:
    """(events up to the finish, the finish, the late chain): k1 measured before a cancel, k2 after it."""
    before = [ev.make_event("c1", "planner", "start", campaign_started=pb.CampaignStarted(spec=SPEC)),
              *chain("c1", _cand("k1"), 0.5)]
    counts = pb.Counts(compiled=1, verified=1, measured=1)
    finish = ev.make_event("c1", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="cancelled", reason="enough", counts=counts, best_candidate_id="k1"))
    return before, finish, chain("c1", _cand("k2"), 0.2)


def test_memory_keeps_late_results_apart_from_the_counts_and_marks_them(tmp_path):
    before, finish, late = _campaign()
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in [*before, finish, *late]:
            assert archive.record(e), ev.kind_of(e)
        queries = Queries(archive)
        status = queries.status(spb.GetCampaignRequest(id="c1"))
        board = queries.leaderboard(spb.LeaderboardRequest(campaign_id="c1")).entries
    finally:
        archive.close()
    assert status.state == "cancelled" and status.counts.measured == 1 and status.best_candidate_id == "k1"
    assert (status.after_finish.compiled, status.after_finish.verified, status.after_finish.measured) == (1, 1, 1)
    # the late kernel is the fastest: listed first, and marked
    assert [(e.candidate_id, e.after_finish) for e in board] == [("k2", True), ("k1", False)]
    line = _status_line(status)
    assert "measured 1;" in line and "after it finished (not counted above): 1 compiled, 1 verified, 1 measured" in line


def test_a_campaign_with_nothing_late_says_nothing_of_it(tmp_path):
    before, finish, _ = _campaign()
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in [*before, finish]:
            assert archive.record(e)
        status = Queries(archive).status(spb.GetCampaignRequest(id="c1"))
        board = Queries(archive).leaderboard(spb.LeaderboardRequest(campaign_id="c1")).entries
    finally:
        archive.close()
    assert status.after_finish == pb.Counts() and "after it finished" not in _status_line(status)
    assert [e.after_finish for e in board] == [False]


def test_the_planner_reports_what_it_finished_with_and_counts_the_late_apart():
    before, finish, late = _campaign()
    st = CampaignState("c1", SPEC, pb.DeviceInfo(), Space(list(load_problem("softmax").families.values())))
    for e in [*before[1:], finish, *late]:   # the start is the planner's own (it makes the state from it)
        assert st.apply(e) == "", ev.kind_of(e)
    counts, best = st.reported()
    assert counts.measured == 1 and best is not None and best.candidate.id == "k1"
    assert (st.after_finish.compiled, st.after_finish.verified, st.after_finish.measured) == (1, 1, 1)
    # replaying the same events (a restarted planner) counts nothing twice
    for e in late:
        st.apply(e)
    assert st.after_finish.measured == 1


def _memory(tmp_path, events: list[pb.Event]) -> tuple[spb.CampaignStatus, list[spb.LeaderboardEntry]]:
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in events:
            archive.record(e)
        queries = Queries(archive)
        return (queries.status(spb.GetCampaignRequest(id="c1")),
                list(queries.leaderboard(spb.LeaderboardRequest(campaign_id="c1")).entries))
    finally:
        archive.close()


def _state() -> CampaignState:
    return CampaignState("c1", SPEC, pb.DeviceInfo(), Space(list(load_problem("softmax").families.values())))


def _finish(counts: pb.Counts, best: str = "") -> pb.Event:
    return ev.make_event("c1", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="cancelled", reason="enough", counts=counts, best_candidate_id=best))


def test_a_result_on_the_stream_before_the_finish_but_folded_after_it_is_late_in_every_view(tmp_path):
    """The planner folds its own finish before publishing it: a measurement already on the stream, folded after,
    is not in the finish's counts. The live planner, a restarted one (which replays it before the finish) and
    memory (which archives it before the finish) all count it late, and the leaderboard marks it."""
    start, k1, fin = ev.make_event("c1", "planner", "start", campaign_started=pb.CampaignStarted(spec=SPEC)), \
        chain("c1", _cand("k1"), 0.3), _finish(pb.Counts())
    live, restarted = _state(), _state()
    live.apply(fin, own=True)
    for e in k1:
        assert live.apply(e) == ""
    for e in [*k1, fin]:
        restarted.apply(e)
    status, board = _memory(tmp_path, [start, *k1, fin])
    for counts in (live.after_finish, restarted.after_finish, status.after_finish):
        assert (counts.compiled, counts.verified, counts.measured) == (1, 1, 1), counts
    assert [(e.candidate_id, e.after_finish) for e in board] == [("k1", True)]


def test_a_result_archived_late_but_counted_by_the_finish_is_not_late(tmp_path):
    """A measurement held for want of its verdict is archived when the verdict comes, after the finish that
    counted it: nothing is late, and the campaign's best is not marked."""
    start = ev.make_event("c1", "planner", "start", campaign_started=pb.CampaignStarted(spec=SPEC))
    created, compiled, verified = links("c1", _cand("k1"))
    fin = _finish(pb.Counts(compiled=1, verified=1, measured=1), best="k1")
    status, board = _memory(tmp_path, [start, created, compiled, measured("c1", _cand("k1"), 0.3), fin, verified])
    assert status.after_finish == pb.Counts() and [e.after_finish for e in board] == [False]


def test_re_timings_and_work_left_undone_by_the_cancel_are_not_late_results(tmp_path):
    """A second timing round of a counted candidate, and a dead letter of work the cancel left undone
    (CAMPAIGN_CANCELLED), reach the campaign after its finish but are no results of it."""
    start = ev.make_event("c1", "planner", "start", campaign_started=pb.CampaignStarted(spec=SPEC))
    k1 = chain("c1", _cand("k1"), 0.3)
    fin = _finish(pb.Counts(compiled=1, verified=1, measured=1), best="k1")
    again = ev.make_event("c1", "benchmarker", "k1:r2", measured=pb.Measured(
        candidate=_cand("k1"), score_s=0.3, round=2, timings=k1[-1].measured.timings))
    k2 = _cand("k2")
    k2.point_id = "p2"
    work = ev.make_event("c1", "coder", "k2", candidate_created=pb.CandidateCreated(candidate=k2))
    undone = ev.make_event("c1", "compiler", "dl1", dead_letter=pb.DeadLetter(
        stage="compiler", payload=work.SerializeToString(), cause=pb.CAMPAIGN_CANCELLED))
    st = _state()
    for e in [*k1, fin, again, undone]:
        st.apply(e)
    status, board = _memory(tmp_path, [start, *k1, fin, again, undone])
    assert st.after_finish == pb.Counts() and status.after_finish == pb.Counts()
    assert [e.after_finish for e in board] == [False]

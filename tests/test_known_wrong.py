"""A kernel one campaign's comparison found wrong is no result of any other campaign of its problem (the same content
id is the same kernel): memory tells a new campaign the ones it has archived (KnownWrong, kept in the campaign's
CampaignStarted.known_wrong), the planner shares the ones a campaign it folds finds while others run, and a point
whose kernel is known to be wrong scores as failed. Before, a second campaign could finish with, and report as its
best, a kernel the first had caught cheating after its timing."""
from __future__ import annotations

import asyncio
import json
from typing import cast

from kfactory.bus import events as ev
from kfactory.bus import topology
from kfactory.evidence import report
from kfactory.evidence.verdicts import Verdicts
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import Queries
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.service import PlannerService
from kfactory.services.planner.summary import campaign_summary
from kfactory.strategies import Point, Space
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

from evidence_chain import chain, timing
from test_campaign import _campaign
from test_final_compare_wrong import PROBLEM, SHAPES
from test_memory_verdicts import _archive, _c1, _cand, _running, _start, _wrong


def _known(candidate: str, campaign: str, reason: str = "WRONG_RESULT") -> pb.KnownWrong:
    return pb.KnownWrong(candidate_id=candidate, campaign_id=campaign, reason=reason)


# -- memory ----------------------------------------------------------------------------------------------------------
def test_memory_names_every_kernel_a_comparison_found_wrong_and_marks_it_in_other_campaigns(tmp_path):
    """c1's showdown found k3 wrong, c3's final comparison k5; c4 (running) measured k3 as its fastest."""
    k3, k6 = _cand("k3", "c4", 3), _cand("k6", "c4", 7)
    events = _c1() + _running() + [_start("c4"), *chain("c4", k3, 0.40), *chain("c4", k6, 0.55)]
    with _archive(tmp_path, events) as archive:
        queries = Queries(archive)
        kernels = queries.known_wrong(spb.KnownWrongRequest(problem="softmax")).kernels
        assert list(kernels) == [_known("k3", "c1"), _known("k5", "c3")]
        assert not queries.known_wrong(spb.KnownWrongRequest(problem="rmsnorm")).kernels
        # c4's own leaderboard and status: k3 is no result there either
        board = queries.leaderboard(spb.LeaderboardRequest(campaign_id="c4")).entries
        assert [(e.candidate_id, e.found_wrong) for e in board] == [("k3", True), ("k6", False)]
        assert queries.status(spb.GetCampaignRequest(id="c4")).best_candidate_id == "k6"


def test_a_campaigns_start_says_which_kernels_it_knew_were_wrong():
    """The report of a campaign folds its own start: a kernel memory named there is marked wrong though no
    comparison of the campaign found it."""
    start = _start("c5")
    start.campaign_started.known_wrong.append(_known("k3", "c1"))
    assert Verdicts.of([start]).wrong == {"k3": _known("k3", "c1")}


# -- the planner's fold -----------------------------------------------------------------------------------------
def _started(cid: str, problem: str = "softmax", known: tuple[pb.KnownWrong, ...] = ()) -> pb.Event:
    spec = pb.CampaignSpec(problem=problem, target="cpu", budget_candidates=4, strategy="random", seed=1)
    return ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec,
                                                                                       known_wrong=known))


def _measured_chain(cid: str, cand: pb.Candidate, score: float) -> list[pb.Event]:
    m = pb.Measured(candidate=cand, score_s=score, timings=[timing(score, s) for s in SHAPES])
    return chain(cid, cand, score)[:-1] + [ev.make_event(cid, "benchmarker", cand.id, measured=m)]


def _fold(svc: PlannerService, events: list[pb.Event]) -> None:
    for e in events:
        svc.replay.apply(e)


def _k1_found_wrong_by(cid: str) -> list[pb.Event]:
    """Campaign `cid` measures k1 and its final comparison finds it wrong."""
    k1 = pb.Candidate(id="k1", point_id="p-k1", campaign_id=cid, origin="template:cpu_c", params_json="{}")
    comp = pb.Comparison(shape=SHAPES[0], candidate_id="k1", error="WRONG_RESULT: row 3", failed_candidate="k1",
                         failed_reason="WRONG_RESULT")
    return [*_measured_chain(cid, k1, 0.40), ev.make_event(cid, "benchmarker", "k1:compare", comparison=comp)]


async def test_a_running_campaign_learns_what_another_found_wrong_and_so_does_a_later_one(planner):
    svc = cast(PlannerService, planner)
    _fold(svc, [_started("cA"), _started("cB"), _started("cR", problem="rmsnorm")])
    b = svc.campaigns["cB"]
    for k, score in (("k1", 0.40), ("k2", 0.50)):
        _fold(svc, _measured_chain("cB", pb.Candidate(id=k, point_id="p-" + k, campaign_id="cB",
                                                      origin="template:cpu_c", params_json="{}"), score))
    assert b.best().candidate.id == "k1"
    _fold(svc, _k1_found_wrong_by("cA"))
    # cB never compared k1, yet it is no result there now; the campaign of another problem learns nothing
    assert b.known_wrong == {"k1": "cA"} and b.best().candidate.id == "k2"
    assert not svc.campaigns["cR"].known_wrong and not svc.campaigns["cA"].known_wrong
    summary = campaign_summary(b, PROBLEM)
    assert summary["known_wrong"] == {"k1": "cA"} and "found_wrong" not in summary
    # a campaign started later learns it from the fold too (memory may not have archived the comparison yet)
    _fold(svc, [_started("cC")])
    assert svc.campaigns["cC"].known_wrong == {"k1": "cA"}


def test_a_kernel_known_wrong_at_the_start_is_never_the_result_and_its_point_scores_as_failed():
    """Memory named k1 at the start: k1 is measured fastest, is no result, no showdown contender, does not reach
    the goal for the campaign, and the strategy hears that its point failed."""
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=4, strategy="random", seed=1,
                           goal_fraction=0.5)
    st = CampaignState("cK", spec, pb.DeviceInfo(), Space(list(PROBLEM.families.values())))
    start = _started("cK", known=(_known("k1", "cA"),))
    start.campaign_started.spec.CopyFrom(spec)
    assert st.apply(start) == ""
    points = {}
    for k, score in (("k1", 0.40), ("k2", 0.50), ("k3", 0.505)):
        point = st.strategy.ask()
        pp = pb.PointProposed(point_id="p-" + k, family=point.family, params_json=point.params_json,
                              origin="template:" + point.family)
        cand = pb.Candidate(id=k, point_id=pp.point_id, campaign_id="cK", origin=pp.origin, family=point.family,
                            params_json=point.params_json)
        m = pb.Measured(candidate=cand, score_s=score, timings=[timing(score, s) for s in SHAPES])
        for t in m.timings:
            t.sol_fraction = 0.9
        events = [ev.make_event("cK", "planner", pp.point_id, point_proposed=pp),
                  *chain("cK", cand, score)[:-1], ev.make_event("cK", "benchmarker", k, measured=m)]
        for e in events:
            assert st.apply(e) == "", ev.kind_of(e)
        points[k] = Point(point.family, point.params_json)
    assert st.strategy.results[points["k1"]] is None and st.strategy.results[points["k2"]] == 0.50
    assert st.best().candidate.id == "k2" and st.goal_reached().candidate.id == "k2"
    assert [m.candidate.id for m in st.contenders(st.best(), 0.05, 3)] == ["k3"]
    summary = campaign_summary(st, PROBLEM)
    assert summary["known_wrong"] == {"k1": "cA"} and summary["goal"]["reached_by"] == "k2"
    # the report: its best section names k1 and the campaign that found it wrong; its leaderboard marks it
    finish = ev.make_event("cK", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed", best_candidate_id="k2", summary_json=json.dumps(summary)))
    measured = [ev.make_event("cK", "benchmarker", cid, measured=m) for cid, m in st.measured.items()]
    md = report.markdown([start, *measured, finish])
    assert "found wrong by another campaign's comparison (no result): `k1` (campaign cA)" in md
    row = next(line for line in md.splitlines() if line.startswith("|") and "`k1" in line)
    assert "found wrong by a comparison: no result" in row


# -- end to end ------------------------------------------------------------------------------------------------------
async def test_memory_tells_a_new_campaign_what_an_earlier_one_found_wrong(memory_bus_settings, tmp_path):
    """A replayed campaign, then a comparison archived that finds its result wrong; a second campaign of the same
    recording (the same seed, so the same kernels) starts knowing it, and finishes with another kernel."""
    from tuning_synth import write_spaces
    path = write_spaces(tmp_path)[0]
    spec = pb.CampaignSpec(problem=f"replay:{path}", target=f"replay:{path}", budget_candidates=12,
                           strategy="random", seed=3, parallel=2)
    first, _ = await _campaign(memory_bus_settings, spec)
    wrong = first.best().candidate.id
    archive = Archive(memory_bus_settings.archive())
    try:
        assert archive.record(_wrong(first.id, wrong, wrong, showdown=False))
    finally:
        archive.close()
    second, running = await _campaign(memory_bus_settings, spec)
    started = next(e.campaign_started for e in running.services["memory"].archive.events(campaign=second.id)
                   if e.HasField("campaign_started"))
    assert list(started.known_wrong) == [_known(wrong, first.id)]
    assert wrong in second.measured and second.best().candidate.id != wrong
    assert json.loads(second.finished.summary_json)["known_wrong"] == {wrong: first.id}


async def test_a_campaign_starts_without_them_when_memory_does_not_answer(planner):
    """The planner alone: no memory service listens (the test settings' port 0). The submission is not refused
    and does not wait; the campaign starts knowing no kernel wrong."""
    svc = cast(PlannerService, planner)
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=1, strategy="random", seed=1)
    cid = await asyncio.wait_for(svc.submit(spec), 60)
    st = svc.campaigns[cid]
    assert st.finished is None and st.known_wrong == {}
    started = await svc.bus.stored(topology.EVENTS_STREAM, ev.event_subject("campaign_started", cid))
    assert len(started) == 1 and not pb.Event.FromString(started[0].data).campaign_started.known_wrong

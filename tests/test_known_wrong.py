"""A kernel one campaign's comparison found wrong is no result of any other campaign of its problem (the same content
id is the same kernel): memory tells a new campaign the ones it has archived (KnownWrong, kept in the campaign's
CampaignStarted.known_wrong), the planner shares the ones a campaign it folds finds while others run, and a point
whose kernel is known to be wrong scores as failed. Before, a second campaign could finish with, and report as its
best, a kernel the first had caught cheating after its timing."""
from __future__ import annotations

import asyncio
import json
import math
from typing import cast

from structlog.testing import capture_logs

from kfactory.bus import events as ev
from kfactory.bus import topology
from kfactory.evidence import report
from kfactory.evidence.verdicts import Verdicts
from kfactory.judge.order import best_key, best_of
from kfactory.problems import BUILTIN_DIR
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
        md, _ = queries.report_of("c4")
        row = next(line for line in md.splitlines() if line.startswith("|") and "`k3" in line)
        assert "found wrong by a comparison: no result" in row


def test_a_campaigns_start_says_which_kernels_it_knew_were_wrong():
    """The verdicts a report folds from a campaign's own events take in its start: a kernel memory named there
    counts as found wrong though no comparison of the campaign found it."""
    start = _start("c5")
    start.campaign_started.known_wrong.append(_known("k3", "c1"))
    assert Verdicts.of([start]).wrong == {"k3": _known("k3", "c1")}


# -- the planner's fold -----------------------------------------------------------------------------------------
def _started(cid: str, problem: str = "softmax", known: tuple[pb.KnownWrong, ...] = ()) -> pb.Event:
    spec = pb.CampaignSpec(problem=problem, target="cpu", budget_candidates=4, strategy="random", seed=1)
    return ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec,
                                                                                       known_wrong=known))


def _measured_chain(cid: str, cand: pb.Candidate, score: float, sol: float = 0.0) -> list[pb.Event]:
    """`cand`'s evidence chain, its measurement timed at every optimisation shape at `score` s, each timing at
    `sol` of the device's measured ceiling (a goal's measure)."""
    m = pb.Measured(candidate=cand, score_s=score, timings=[timing(score, s) for s in SHAPES])
    for t in m.timings:
        t.sol_fraction = sol
    return chain(cid, cand, score)[:-1] + [ev.make_event(cid, "benchmarker", cand.id, measured=m)]


def _proposed(st: CampaignState, point_id: str) -> tuple[pb.Event, Point]:
    """The strategy's next point of campaign `st`, proposed as the template coder's work `point_id`."""
    point = st.strategy.ask()
    pp = pb.PointProposed(point_id=point_id, family=point.family, params_json=point.params_json,
                          origin="template:" + point.family)
    return ev.make_event(st.id, "planner", point_id, point_proposed=pp), point


async def _caught_up(planner) -> PlannerService:
    """The planner once it has folded the stream as it was at its start (empty here): it then resumes nothing, so
    the campaigns a test folds in by hand are driven by nobody but the test."""
    svc = cast(PlannerService, planner)
    await asyncio.wait_for(svc.caught_up.wait(), 30)
    return svc


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
    svc = await _caught_up(planner)
    # cP names softmax by its package's directory: the same problem
    _fold(svc, [_started("cA"), _started("cB"), _started("cR", problem="rmsnorm"),
                _started("cP", problem=str(BUILTIN_DIR / "softmax"))])
    b = svc.campaigns["cB"]
    for k, score in (("k1", 0.40), ("k2", 0.50)):
        _fold(svc, _measured_chain("cB", pb.Candidate(id=k, point_id="p-" + k, campaign_id="cB",
                                                      origin="template:cpu_c", params_json="{}"), score))
    assert b.best().candidate.id == "k1"
    _fold(svc, _k1_found_wrong_by("cA"))
    # cB never compared k1, yet it is no result there now; the campaign of another problem learns nothing
    assert b.known_wrong == {"k1": "cA"} and b.best().candidate.id == "k2"
    assert not svc.campaigns["cR"].known_wrong and not svc.campaigns["cA"].known_wrong
    assert svc.campaigns["cP"].known_wrong == {"k1": "cA"}
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
        proposal, point = _proposed(st, "p-" + k)
        cand = pb.Candidate(id=k, point_id="p-" + k, campaign_id="cK", origin="template:" + point.family,
                            family=point.family, params_json=point.params_json)
        for e in [proposal, *_measured_chain("cK", cand, score, sol=0.9)]:
            assert st.apply(e) == "", ev.kind_of(e)
        points[k] = Point(point.family, point.params_json)
    assert st.strategy.results[points["k1"]] is None and st.strategy.results[points["k2"]] == 0.50
    assert st.best().candidate.id == "k2" and st.goal_reached().candidate.id == "k2"
    assert [m.candidate.id for m in st.contenders(st.best(), 0.05, 3)] == ["k3"]
    assert st.ranked(5) == ["k2", "k3"]   # an agent is never handed k1 to improve on
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
    """The planner alone: no memory service listens (the test settings' port 0). The submission is not refused,
    and the log says what the campaign goes without; the campaign starts knowing no kernel wrong."""
    svc = await _caught_up(planner)
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=1, strategy="random", seed=1)
    with capture_logs() as logs:
        cid = await asyncio.wait_for(svc.submit(spec), 60)
    assert any(e["event"].startswith("memory did not say which kernels") and e["log_level"] == "warning"
               and e["code"] == "UNAVAILABLE" for e in logs), logs
    st = svc.campaigns[cid]
    assert st.finished is None and st.known_wrong == {}
    started = await svc.bus.stored(topology.EVENTS_STREAM, ev.event_subject("campaign_started", cid))
    assert len(started) == 1 and not pb.Event.FromString(started[0].data).campaign_started.known_wrong


# -- the edges a review found ----------------------------------------------------------------------------------------
def _kernel(cid: str, k: str) -> pb.Candidate:
    return pb.Candidate(id=k, point_id="p-" + k, campaign_id=cid, origin="template:cpu_c", params_json="{}")


def test_a_duplicate_of_a_kernel_known_wrong_scores_as_failed_too():
    """A second point whose kernel is k1 (its candidate rejected as a DUPLICATE) scores like its twin: failed."""
    st = CampaignState("cD", pb.CampaignSpec(problem="softmax", target="cpu", strategy="random", seed=1),
                       pb.DeviceInfo(), Space(list(PROBLEM.families.values())))
    assert st.apply(_started("cD", known=(_known("k1", "cA"),))) == ""
    (one, first), (two, second) = _proposed(st, "p-k1"), _proposed(st, "p-twin")
    assert st.apply(one) == "" and st.apply(two) == ""
    for e in _measured_chain("cD", _kernel("cD", "k1"), 0.40):
        assert st.apply(e) == ""
    dup = pb.Rejected(candidate=pb.Candidate(id="k1", point_id="p-twin", campaign_id="cD"), stage="coder",
                      reason=pb.DUPLICATE, point_id="p-twin")
    assert st.apply(ev.make_event("cD", "coder", "p-twin:dup", rejected=dup)) == ""
    assert st.strategy.results[first] is None and st.strategy.results[second] is None


async def test_a_restarted_planner_does_not_search_again_when_the_goal_kernel_is_found_wrong_after(planner):
    """k1 reached the goal and ended the search; its showdown was asked; then another campaign found it wrong.
    The goal is no longer reached, but a planner resuming the campaign does not propose again: its search ended."""
    svc = await _caught_up(planner)
    start = _started("cG")
    start.campaign_started.spec.goal_fraction = 0.5
    start.campaign_started.spec.budget_candidates = 40
    _fold(svc, [_started("cA"), start])
    st = svc.campaigns["cG"]
    for k, score in (("k1", 0.40), ("k2", 0.41)):
        _fold(svc, _measured_chain("cG", _kernel("cG", k), score, sol=0.6))
    assert st.goal_reached().candidate.id == "k1" and not svc.driver._budget_left(st)
    req = pb.CompareRequest(candidate=_kernel("cG", "k1"), contenders=[_kernel("cG", "k2")])
    _fold(svc, [ev.make_event("cG", "planner", ev.showdown_key(req), compare_request=req), *_k1_found_wrong_by("cA")])
    assert st.known_wrong == {"k1": "cA"} and st.goal_reached().candidate.id == "k2"
    # without k2 (found wrong as well) no kernel reaches the goal, yet the search stays over
    _fold(svc, [ev.make_event("cA", "benchmarker", "k2:sd", comparison=pb.Comparison(
        shape=SHAPES[0], candidate_id="k1", showdown=True, failed_candidate="k2", failed_reason="WRONG_RESULT"))])
    assert st.goal_reached() is None and st.search_proposed() < 40 and not svc.driver._budget_left(st)


async def test_a_search_that_ended_on_the_goal_goes_on_when_its_kernel_is_found_wrong_meanwhile(planner):
    """k1 reached the goal and ended the search while k2's point was in flight; before any comparison was asked,
    another campaign finds k1 wrong. The live planner searches on (as a planner restarted then would: its
    _budget_left sees no goal and no comparison asked), and raises the screen's threshold past k1."""
    svc = await _caught_up(planner)
    start = _started("cW")
    start.campaign_started.spec.goal_fraction = 0.5
    start.campaign_started.spec.budget_candidates = 6
    start.campaign_started.spec.parallel = 8   # (a submitted spec gets the planner's default)
    _fold(svc, [_started("cA"), start])
    st = svc.campaigns["cW"]
    _fold(svc, [_proposed(st, "p-" + k)[0] for k in ("k1", "k2")])
    _fold(svc, _measured_chain("cW", _kernel("cW", "k1"), 0.4, sol=0.6))
    assert st.goal_reached().candidate.id == "k1" and st.in_flight() == 1 and st.search_proposed() == 2
    await svc.claims.cache_put(best_key("cW"), b"0.4")   # the screen's threshold, as the benchmarker left it
    task = asyncio.ensure_future(svc.driver._search_to_end(st))
    try:
        await asyncio.sleep(0.2)
        assert not task.done()   # waiting for k2
        _fold(svc, [*_k1_found_wrong_by("cA"), *_measured_chain("cW", _kernel("cW", "k2"), 0.5)])
        async with asyncio.timeout(20):
            while st.search_proposed() < 6:   # the search goes on to its candidate budget
                await asyncio.sleep(0.05)
        assert st.goal_reached() is None and st.known_wrong == {"k1": "cA"}
        # the search raised the screen's threshold past k1 (0.4) to k2 (0.5): a cheater's score would screen out
        # every honest kernel slower than screen_factor times it
        assert best_of(await svc.claims.cache_get(best_key("cW"))) == 0.5 and not st.threshold_stale
    finally:
        task.cancel()


def test_the_screens_threshold_is_the_best_kernel_that_can_be_a_result():
    """CampaignState.screen_threshold (what the planner writes back) and best_of (how the benchmarker reads it)."""
    st = CampaignState("cT", pb.CampaignSpec(problem="softmax", target="cpu"), pb.DeviceInfo(), None)
    assert st.apply(_started("cT", known=(_known("k1", "cA"),))) == ""
    assert math.isinf(st.screen_threshold()) and not st.threshold_stale
    for k, score in (("k1", 0.1), ("k2", 0.5), ("k3", 0.6)):
        for e in _measured_chain("cT", _kernel("cT", k), score):
            assert st.apply(e) == ""
    assert st.threshold_stale and st.screen_threshold() == 0.5   # k1 was measured: the benchmarker took it
    st.threshold_stale = False
    st.learn_wrong("k2", "cB")
    assert st.threshold_stale and st.screen_threshold() == 0.6
    st.learn_wrong("k3", "cB")
    assert math.isinf(st.screen_threshold())
    # read back: infinity and anything unreadable are no threshold (no screen), as an absent key
    assert best_of(repr(math.inf).encode()) is None and best_of(b"junk") is None and best_of(None) is None
    assert best_of(b"0.5") == 0.5 and best_of(b"-1.0") is None


async def test_a_showdown_whose_kernel_is_learned_wrong_meanwhile_ends_at_once(planner):
    """The driver waits for the showdown of k1; another campaign finds k1 wrong: the driver stops waiting (the
    answer no longer matters) and reports the search's best out, so the next best (k2) is the one to compare."""
    svc = await _caught_up(planner)
    _fold(svc, [_started("cA"), _started("cS")])
    st = svc.campaigns["cS"]
    for k, score in (("k1", 0.40), ("k2", 0.41), ("k3", 0.42)):
        _fold(svc, _measured_chain("cS", _kernel("cS", k), score))
    task = asyncio.ensure_future(svc.driver._showdown(st))
    while not st.showing_down:
        await asyncio.sleep(0.02)
    _fold(svc, _k1_found_wrong_by("cA"))
    assert await asyncio.wait_for(task, 10) is True   # COMPARE_WAIT_S is minutes
    assert st.search_best().candidate.id == "k2"


def test_a_late_answer_about_a_kernel_already_out_takes_no_final_try():
    """k1's final comparison was asked, k1 was learned wrong meanwhile, and the benchmarker's answer (k1 wrong)
    comes after: it is not counted against FINAL_TRIES."""
    st = CampaignState("cL", pb.CampaignSpec(problem="softmax", target="cpu"), pb.DeviceInfo(), None)
    assert st.apply(_started("cL")) == ""
    for e in _measured_chain("cL", _kernel("cL", "k1"), 0.40):
        assert st.apply(e) == ""
    st.learn_wrong("k1", "cA")
    late = pb.Comparison(shape=SHAPES[0], candidate_id="k1", failed_candidate="k1", failed_reason="WRONG_RESULT")
    assert st.apply(ev.make_event("cL", "benchmarker", "k1:late", comparison=late)) == ""
    assert st.final_wrong == set() and st.known_wrong == {"k1": "cA"}


async def test_a_restarted_planner_learns_the_same_whatever_the_order_of_a_finish_and_a_comparison(planner):
    """The live planner applies a campaign's finish before publishing it, so a comparison another campaign
    published meanwhile is folded after the finish live, and before it on the stream (what a restart replays).
    Both orders leave the finished campaign knowing the same."""
    svc = await _caught_up(planner)
    finish = ev.make_event("cF", "planner", "finish", campaign_finished=pb.CampaignFinished(state="completed"))
    found = _k1_found_wrong_by("cA")
    states = []
    for order in ([finish, *found], [*found, finish]):
        svc.campaigns.clear()
        svc.replay.wrong.clear()
        _fold(svc, [_started("cA"), _started("cF"), *_measured_chain("cF", _kernel("cF", "k1"), 0.4), *order])
        st = svc.campaigns["cF"]
        assert st.finished is not None
        states.append((dict(st.known_wrong), set(st.disqualified)))
    assert states[0] == states[1] == ({"k1": "cA"}, {"k1"})


def test_a_start_carries_the_most_recently_found_kernels_at_most():
    from kfactory.observability.log import get_logger
    from kfactory.services.planner.priors import KNOWN_WRONG_MAX, capped

    found = [_known(f"k{i}", "cA") for i in range(5)]
    with capture_logs() as logs:
        assert capped(found, get_logger("test"), most=2) == found[3:]
    assert [e["found"] for e in logs] == [5]
    assert capped(found, get_logger("test")) == found and capped([], get_logger("test"), most=0) == []
    # a start carrying the most, with ids as long as they come (a sha256 and a campaign id), stays far under the
    # bus's limit on an event
    most = tuple(pb.KnownWrong(candidate_id=f"{i:064x}", campaign_id="c" + "1" * 12, reason="WRONG_RESULT")
                 for i in range(KNOWN_WRONG_MAX))
    start = _started("c" + "0" * 12, known=most)
    assert len(start.SerializeToString()) < ev.MAX_EVENT_BYTES / 2


def test_a_report_whose_every_measured_kernel_is_out_says_so():
    """Every kernel measured was found wrong (here known at the start): the report says none can be the result,
    not that none was measured, and its leaderboard marks the kernel."""
    start = _started("cX", known=(_known("k1", "cA"),))
    finish = ev.make_event("cX", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed", summary_json=json.dumps({"best": None})))
    md = report.markdown([start, *_measured_chain("cX", _kernel("cX", "k1"), 0.1)[-1:], finish])
    assert "No measured candidate can be the result" in md and "No candidate was measured" not in md
    assert "found wrong by a comparison: no result" in next(x for x in md.splitlines() if "`k1" in x)

"""A campaign bounded by device time (Settings.device_seconds, issue 23 deliverable 3): its search stops proposing
once its verifications, screens and measurements have held the device for the budget less a reserve for its
showdown and final comparison (what earlier campaigns' held it for, else a share), and its summary reports the
device seconds it used, its comparisons' apart, per candidate too."""
from __future__ import annotations

import json
import math

from types import SimpleNamespace

from kfactory.judge import order as pipeline
from kfactory.bus import events as ev
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from test_campaign import _campaign


def _state(device_s: float, done: int, in_flight: int, parallel: int = 4, compare_s: float = 0.0,
           reserve_s: float = 0.0, reference_s: float = 0.0):
    """A campaign that held the device `device_s`: `compare_s` its comparisons, `reference_s` its reference
    kernel, the rest its `done` searched candidates."""
    return SimpleNamespace(spec=pb.CampaignSpec(parallel=parallel), search_done=lambda: done,
                           device_s=device_s, compare_device_s=compare_s, search_device_s=device_s - compare_s,
                           searched_device_s=device_s - compare_s - reference_s, compare_reserve_s=reserve_s,
                           in_flight=lambda: in_flight)


def _stopped_for_device_time(st, budget: float) -> None:
    """The campaign's search ended because its device time could not pay for another candidate: it spent the
    budget less the comparisons' reserve, or what was left of that was less than its searched candidates'
    average device time (a first candidate that took 0.99 s of a 1 s share ends it short, as room() means it
    to). The search's device time: the showdown and the final comparison come after it, out of the reserve."""
    search_s, share, done = st.search_device_s, budget - st.compare_reserve_s, st.search_done()
    assert search_s > 0 and 0 < st.compare_reserve_s <= budget / 2, (st.counts, st.compare_reserve_s)
    assert search_s >= share or done and share - search_s < st.searched_device_s / done, (search_s, share, done)


def test_room_in_flight_is_what_the_device_time_left_pays_for():
    assert pipeline.room(_state(0.0, 0, 0), 0.0) == 4                  # no budget: the spec's parallel
    assert pipeline.room(_state(0.0, 0, 0), 10.0) == 1                 # no average yet: one at a time
    assert pipeline.room(_state(4.0, 2, 1), 10.0) == 3                 # 2 s a candidate, 6 s left
    assert pipeline.room(_state(4.0, 2, 1), 100.0) == 4                # never more than parallel
    assert pipeline.room(_state(9.0, 3, 0), 10.0) == 0                 # 3 s a candidate, 1 s left
    assert pipeline.room(_state(6.0, 2, 0, compare_s=4.0), 10.0) == 4  # 1 s a candidate: comparisons are none's
    assert pipeline.device_budget_spent(_state(9.0, 3, 0), 10.0)       # nothing in flight, no room: done
    assert not pipeline.device_budget_spent(_state(9.0, 3, 1), 10.0)   # its work in flight may still end
    assert pipeline.device_budget_spent(_state(10.5, 3, 1), 10.0)      # spent
    assert not pipeline.device_budget_spent(_state(99.0, 3, 0), 0.0)   # no budget
    # the reference kernel's device time is the campaign's, but its average is no searched candidate's: 3 s of
    # a reference and one 0.5 s candidate leave 4 s of 7.5 s, room for 8 at 0.5 s; none searched yet, one
    assert pipeline.room(_state(3.5, 1, 0, reserve_s=2.5, reference_s=3.0), 10.0) == 4
    assert pipeline.room(_state(3.0, 0, 0, reserve_s=1.25, reference_s=3.0), 5.0) == 1
    assert not pipeline.device_budget_spent(_state(3.0, 0, 0, reserve_s=1.25, reference_s=3.0), 5.0)
    # the comparisons' reserve is not the search's: 4 s of 10 s left to it is 2 s at 2 s a candidate
    assert pipeline.room(_state(4.0, 2, 0, reserve_s=4.0), 10.0) == 1
    assert pipeline.device_budget_spent(_state(6.0, 3, 1, reserve_s=4.0), 10.0)      # its share spent
    assert not pipeline.device_budget_spent(_state(5.0, 5, 0, reserve_s=4.0), 10.0)  # 1 s left, 1 s a candidate
    assert pipeline.device_budget_spent(_state(5.5, 5, 0, reserve_s=4.0), 10.0)      # 0.5 s left: no room
    assert not pipeline.device_budget_spent(_state(5.5, 5, 0), 10.0)                 # without the reserve, room


def _costs(*pairs: tuple[float, float]) -> list[spb.ComparisonCost]:
    """Earlier campaigns' (showdown's, final comparison's) device seconds, as memory answers them."""
    return [spb.ComparisonCost(campaign_id=f"c{i}", showdown_s=sd, final_s=final)
            for i, (sd, final) in enumerate(pairs)]


def test_the_comparisons_reserve_is_what_earlier_campaigns_held_else_a_share():
    reserve = pipeline.compare_reserve
    assert reserve(0.0, _costs((0.0, 5.0)), 0.25) == (0.0, 0)             # no budget: nothing kept
    assert reserve(40.0, [], 0.25) == (10.0, 0)                           # no evidence: the share
    # the median final comparison, and the median showdown of the campaigns that had one
    assert reserve(40.0, _costs((0.0, 3.0), (5.0, 9.0), (7.0, 4.0)), 0.25) == (4.0 + 6.0, 3)
    assert reserve(40.0, _costs((0.0, 3.0), (5.0, 9.0), (7.0, 4.0)), 0.25, showdown=False) == (4.0, 3)
    assert reserve(40.0, _costs((0.0, 3.0), (0.0, 5.0)), 0.25) == (4.0, 2)  # none had a showdown
    assert reserve(40.0, _costs((15.0, 15.0), (0.0, 27.0)), 0.25) == (20.0, 2)  # never more than half the budget
    # numbers only: no final comparison, or a figure no device time can be, is no campaign's
    assert reserve(40.0, _costs((0.0, math.nan), (0.0, -1.0), (0.0, 0.0), (math.inf, 2.0), (-1.0, 2.0),
                                (1.0, 6.0)), 0.25) == (7.0, 1)
    assert reserve(40.0, _costs((0.0, math.inf)), 0.25) == (10.0, 0)
    assert reserve(40.0, [], 0.9) == (20.0, 0)                            # a share past half is half
    # a start's reserve kept of a larger budget than the planner's now: the search still has half
    assert pipeline.search_budget(_state(0.0, 0, 0, reserve_s=8.0), 10.0) == 5.0


def test_the_device_time_each_event_reports():
    cand = pb.Candidate(id="a" * 64)
    verified = ev.make_event("c1", "verifier", cand.id, verified=pb.Verified(candidate=cand, seconds=1.5))
    measured = ev.make_event("c1", "benchmarker", cand.id, measured=pb.Measured(candidate=cand, seconds=2.0))
    cached = ev.make_event("c1", "benchmarker", cand.id, measured=pb.Measured(candidate=cand, seconds=2.0, cached=True))
    by_verifier = pb.Rejected(candidate=cand, stage="verifier")
    by_verifier.figures["verify_seconds"] = 0.25
    by_benchmarker = pb.Rejected(candidate=cand, stage="benchmarker")
    by_benchmarker.figures["device_seconds"] = 0.5
    compared = pb.Comparison(candidate_id=cand.id, shape="4x4", seconds=0.75)
    got = [pipeline.device_seconds(e) for e in (
        verified, measured, cached, ev.make_event("c1", "verifier", cand.id, rejected=by_verifier),
        ev.make_event("c1", "benchmarker", cand.id, rejected=by_benchmarker),
        ev.make_event("c1", "compiler", cand.id, compiled=pb.Compiled(candidate=cand)),
        ev.make_event("c1", "benchmarker", "cmp", comparison=compared))]
    assert got == [1.5, 2.0, 0.0, 0.25, 0.5, 0.0, 0.75]


async def test_a_campaign_stops_proposing_when_its_device_time_is_spent(memory_bus_settings, small_softmax):
    budget = 1.0
    settings = memory_bus_settings.model_copy(update={"device_seconds": budget})
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=200, strategy="random", seed=3,
                           parallel=2, warm_start=0)
    st, _ = await _campaign(settings, spec)
    assert st.finished.state == "completed"
    summary = json.loads(st.finished.summary_json)
    outcomes = st.counts.measured + st.counts.rejected + st.counts.compile_failed
    # spent, or too little left for one more at its average (room() above), far short of the candidate budget
    _stopped_for_device_time(st, budget)
    assert summary["device_seconds_budget"] == budget
    assert st.counts.proposed < 40, st.counts
    assert summary["device_seconds"] == round(st.device_s, 3)
    assert summary["device_seconds_per_candidate"] == round((st.device_s - st.compare_device_s) / outcomes, 3)


def test_a_campaigns_own_device_budget_wins_over_the_planners(settings):
    assert pipeline.device_budget(pb.CampaignSpec(budget_device_seconds=2.5), 10.0) == 2.5
    assert pipeline.device_budget(pb.CampaignSpec(), 10.0) == 10.0
    assert pipeline.device_budget(pb.CampaignSpec(), 0.0) == 0.0
    # the planner's is written into a spec that sets none at submission: the campaign's from its start, whatever a
    # restarted planner is configured with (its comparisons' reserve was kept of that budget)
    from kfactory.problems import load_problem
    from kfactory.services.planner.specs import validate
    from kfactory.targets import get_target

    planner = settings.model_copy(update={"device_seconds": 30.0})
    for own, want in ((0.0, 30.0), (2.5, 2.5)):
        spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=4, budget_device_seconds=own)
        assert validate(spec, planner, load_problem, lambda t: get_target(t, planner))[0].budget_device_seconds == want


def test_run_device_seconds_fills_the_spec_and_a_bad_value_is_refused(capsys):
    import pytest

    from kfactory.cli.main import _spec, build_parser

    args = build_parser().parse_args(["run", "softmax", "--device-seconds", "30"])
    assert _spec(args).budget_device_seconds == 30.0
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "softmax", "--device-seconds", "-1"])
    assert exc.value.code == 2 and "--device-seconds" in capsys.readouterr().err


async def test_the_specs_device_budget_stops_a_campaign_the_planner_does_not_bound(memory_bus_settings,
                                                                                   small_softmax):
    budget = 1.0
    assert memory_bus_settings.device_seconds == 0   # the planner itself has no device-time limit
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=200, strategy="random", seed=3,
                           parallel=2, warm_start=0, budget_device_seconds=budget)
    st, _ = await _campaign(memory_bus_settings, spec)
    summary = json.loads(st.finished.summary_json)
    assert st.finished.state == "completed" and summary["device_seconds_budget"] == budget
    _stopped_for_device_time(st, budget)
    assert st.counts.proposed < 40, st.counts


def test_points_in_flight_by_default_follow_the_target_and_the_agents(settings):
    """A spec without `parallel` gets the planner's default: on cpu three (each further point in flight is one the
    search chooses knowing less, bench/search_parallel.py) plus one per agent persona; elsewhere one per core plus
    two; KFACTORY_DEFAULT_PARALLEL, or the spec's own, overrides it."""
    import os

    from kfactory.problems import load_problem
    from kfactory.services.planner import coders
    from kfactory.services.planner.specs import validate
    from kfactory.targets import get_target

    def parallel(settings, **fields) -> int:
        spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=4, **fields)
        return validate(spec, settings, load_problem, lambda t: get_target(t, settings))[0].parallel

    assert parallel(settings) == 3
    personas = coders.personas(pb.CampaignSpec())
    # agents asked for without a model are off (the spec's note says so): they hold no slots
    assert parallel(settings, coders=["template", "agent"]) == 3
    model = settings.model_copy(update={"llm_base_url": "http://127.0.0.1:9/v1", "llm_model": "no-such-model"})
    assert len(personas) >= 2 and parallel(model, coders=["template", "agent"]) == 3 + len(personas)
    assert parallel(model, coders=["template", "agent"], personas=personas[:1]) == 4
    assert parallel(settings, parallel=7) == 7
    assert parallel(settings.model_copy(update={"default_parallel": 5})) == 5
    assert pipeline.default_parallel(settings, "cuda") == (os.cpu_count() or 1) + 2
    assert pipeline.default_parallel(settings, "replay") == (os.cpu_count() or 1) + 2


def test_the_strategy_keeps_its_own_slots_while_agents_hold_theirs(settings):
    """While agents may take work, the template coder's points in flight stay within the planner's default without
    agents (on cpu three: the slots default_parallel added per persona are the agents'), whatever `parallel` the
    campaign has; with agents off, or on another target whose default adds no agent slots, `parallel` is all
    the search's."""
    import os

    from kfactory.services.planner import coders

    def state(parallel: int, agent: bool, tokens: int = 0, paused: bool = False, target: str = "cpu"):
        spec = pb.CampaignSpec(parallel=parallel, coders=["template", "agent"] if agent else ["template"],
                               personas=["memory_bound", "compute_bound"], token_budget=100, target=target)
        return SimpleNamespace(spec=spec, agent_note="",
                               coders=SimpleNamespace(endpoint_paused=lambda: paused, tokens=lambda: tokens))

    assert coders.template_slots(state(5, agent=False), settings) == 5
    assert coders.template_slots(state(5, agent=True), settings) == 3              # 3 + 2 personas: 3 the search's
    assert coders.template_slots(state(2, agent=True), settings) == 2              # an explicit 2 stays the search's
    assert coders.template_slots(state(5, agent=True, tokens=100), settings) == 5  # tokens spent: every slot
    assert coders.template_slots(state(5, agent=True, paused=True), settings) == 5  # endpoint paused: every slot
    cores = (os.cpu_count() or 1) + 2
    assert coders.template_slots(state(cores, agent=True, target="cuda"), settings) == cores
    assert coders.template_slots(state(5, agent=True), settings.model_copy(update={"default_parallel": 4})) == 4

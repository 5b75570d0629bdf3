"""A device budget keeps a reserve for the campaign's showdown and final comparison (judge.order.compare_reserve):
the search stops at the budget less what a final comparison, and a showdown where there was one, held the device
for in recent campaigns of the problem on the device (memory's ComparisonCost), else less a share of it, so that
the comparisons fit the budget too (where the search stops: tests/test_device_budget.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kfactory.bus import events as ev
from kfactory.services.memory.archive import COMPARISON_COST_CAMPAIGNS, Archive
from kfactory.services.memory.queries import InvalidRequest, Queries
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

sys.path.insert(0, str(Path(__file__).parent))
from evidence_chain import chain  # noqa: E402
from test_campaign import _campaign  # noqa: E402


def _campaign_events(cid: str, split: tuple | None = None, problem: str = "softmax", target: str = "cpu",
                     device: str = "EPYC", state: str = "completed", held_s: float | None = None,
                     summary_json: str | None = None) -> list[pb.Event]:
    """A finished campaign of `problem` on `device` with one measured kernel whose showdown and final comparison
    held the device `split` (None: a summary from before those figures, with `held_s`, its comparisons' total)."""
    cand = pb.Candidate(id="k" + cid, campaign_id=cid, point_id="p" + cid, problem=problem, target=target,
                        family="cpu_c", origin="template:cpu_c", params_json="{}")
    summary: dict = {} if held_s is None else {"device_seconds_comparisons": held_s}
    if split is not None:
        summary["device_seconds_showdown"], summary["device_seconds_final_comparison"] = split
    return [ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(
                spec=pb.CampaignSpec(problem=problem, target=target), device=pb.DeviceInfo(model=device))),
            *chain(cid, cand, 0.5),
            ev.make_event(cid, "planner", "finish", campaign_finished=pb.CampaignFinished(
                state=state, best_candidate_id=cand.id,
                summary_json=json.dumps(summary) if summary_json is None else summary_json))]


def test_memory_answers_the_latest_campaigns_comparisons_of_the_problem_on_the_device(tmp_path):
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        held = (0.0, 7.0)
        events = [*_campaign_events("c1", (0.0, 9.0)), *_campaign_events("c2", (5.0, 3.5)),
                  *_campaign_events("o1", held, problem="rmsnorm"),          # another problem
                  *_campaign_events("o2", held, problem="/pkgs/softmax"),    # a package of the same name
                  *_campaign_events("o3", held, device="Xeon"),              # another device
                  *_campaign_events("o4", held, target="cuda:sm_90a"),       # another target
                  *_campaign_events("o5", held, state="cancelled"),          # not a completed one's
                  *_campaign_events("o6", held_s=7.0),        # from before the figures: a total says no split
                  *_campaign_events("o7", (0.0, 0.0)),                       # no final comparison
                  *_campaign_events("o8", (0.0, "7")), *_campaign_events("o9", ("5", 3.0)),  # no number
                  *_campaign_events("o10", summary_json="not json")]
        for e in events:
            assert archive.record(e), ev.kind_of(e)
        # the most recent first
        assert archive.comparison_cost("softmax", "cpu", "EPYC") == [("c2", 5.0, 3.5), ("c1", 0.0, 9.0)]
        for i in range(COMPARISON_COST_CAMPAIGNS + 1):
            for e in _campaign_events(f"n{i}", (0.0, 1.0 + i)):
                assert archive.record(e)
        latest = [(f"n{n}", 0.0, 1.0 + n) for n in range(COMPARISON_COST_CAMPAIGNS, 0, -1)]
        assert archive.comparison_cost("softmax", "cpu", "EPYC") == latest
        queries = Queries(archive)
        got = queries.comparison_cost(spb.ComparisonCostRequest(problem="softmax", target="cpu", device="EPYC"))
        assert [(c.campaign_id, c.showdown_s, c.final_s) for c in got.campaigns] == latest
        with pytest.raises(InvalidRequest, match="device model"):
            queries.comparison_cost(spb.ComparisonCostRequest(problem="softmax", target="cpu"))
        assert archive.comparison_cost("/pkgs/softmax", "cpu", "EPYC") == [("o2", 0.0, 7.0)]
    finally:
        archive.close()


async def test_a_campaign_keeps_for_its_comparisons_what_the_last_ones_held(memory_bus_settings, small_softmax):
    """The first campaign knows no earlier one: its search leaves Settings.compare_reserve of the budget. The
    second, on the same services' archive, leaves what the first's comparisons held (at most half the budget).
    Both end at their candidate budget, so that the first surely compares a result (test_device_budget.py shows
    a search that stops for device time at the budget less the reserve)."""
    budget = 40.0
    settings = memory_bus_settings.model_copy(update={"device_seconds": budget})
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=2, strategy="random", seed=3,
                           parallel=2, warm_start=0)
    first, _ = await _campaign(settings, spec)
    told = json.loads(first.finished.summary_json)
    assert first.finished.state == "completed" and told["best"] is not None, told
    assert (told["device_seconds_reserve"], told["device_seconds_reserve_campaigns"]) == \
        (settings.compare_reserve * budget, 0)
    showdown, final = told["device_seconds_showdown"], told["device_seconds_final_comparison"]
    assert final > 0 and showdown + final == pytest.approx(told["device_seconds_comparisons"], abs=2e-3), told

    spec.seed = 4
    second, _ = await _campaign(settings, spec)
    again = json.loads(second.finished.summary_json)
    assert second.finished.state == "completed", again
    assert (second.compare_reserve_s, second.compare_reserve_campaigns) == \
        (pytest.approx(min(showdown + final, budget / 2)), 1)
    assert again["device_seconds_reserve_campaigns"] == 1

"""A campaign with a goal (`kfactory run --goal FRACTION`, CampaignSpec.goal_fraction; issue 24: "campaigns until
each reaches 90% of the measured copy bandwidth"): its search stops once a candidate measured in full reaches that
fraction of the device's measured ceiling at every shape it was timed at, and its summary names that candidate."""
from __future__ import annotations

import json

import pytest

from kfactory.v1 import events_pb2 as pb
from test_campaign import _campaign


async def test_a_reached_goal_stops_the_search_and_the_summary_names_the_candidate(memory_bus_settings,
                                                                                    small_softmax):
    goal = 1e-6   # any measured softmax kernel moves its bytes faster than this fraction of the host's bandwidth
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=200, strategy="random", seed=5,
                           parallel=2, warm_start=0, goal_fraction=goal)
    st, _ = await _campaign(memory_bus_settings, spec)
    summary = json.loads(st.finished.summary_json)
    assert st.finished.state == "completed"
    reached = summary["goal"]["reached_by"]
    assert summary["goal"]["fraction"] == goal and reached in st.measured and reached != st.reference_id
    m = st.measured[reached]
    assert not m.screened_out and m.timings and all(t.sol_fraction >= goal for t in m.timings)
    # the search stopped at the first such candidate: what was in flight then still finished, nothing more
    assert st.counts.proposed <= 1 + spec.parallel + 2, st.counts


async def test_a_campaign_without_a_goal_runs_its_budget(memory_bus_settings, small_softmax):
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=6, strategy="random", seed=5,
                           parallel=2, warm_start=0)
    st, _ = await _campaign(memory_bus_settings, spec)
    summary = json.loads(st.finished.summary_json)
    assert "goal" not in summary and st.goal_reached() is None
    assert st.counts.proposed >= 6, st.counts   # its 6 search points (and the reference kernel)


@pytest.mark.parametrize("value, ok", [("0.9", True), ("0", True), ("1.5", False), ("-0.1", False), ("nan", False)])
def test_run_goal_fills_the_spec_and_a_bad_value_is_refused(capsys, value, ok):
    from kfactory.cli.main import _spec, build_parser

    if ok:
        assert _spec(build_parser().parse_args(["run", "softmax", "--goal", value])).goal_fraction == float(value)
        return
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "softmax", "--goal", value])
    assert exc.value.code == 2 and "--goal" in capsys.readouterr().err

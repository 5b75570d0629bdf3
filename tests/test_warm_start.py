"""Warm starts: a campaign asks memory for the best points of earlier campaigns of the same problem (here the
same recorded kernel on another GPU), proposes them first, and records what it used in its evidence."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from kfactory.evidence import report
from kfactory.cli.main import main as cli_main
from kfactory.strategies import Point

from kfactory.v1 import events_pb2 as pb
from test_campaign import _campaign
from tuning_synth import write_spaces


@pytest.fixture(scope="module")
def spaces(tmp_path_factory):
    return write_spaces(tmp_path_factory.mktemp("spaces"))


@pytest.fixture
def spec_for(spaces):
    return lambda device, warm, budget=30: _spec(spaces[device], warm, budget)


def _spec(path, warm: int, budget: int) -> pb.CampaignSpec:
    target = f"replay:{path}"
    return pb.CampaignSpec(problem=target, target=target, budget_candidates=budget, strategy="random", seed=3,
                           warm_start=warm, parallel=4)


async def test_a_campaign_on_another_gpu_starts_from_what_memory_learned(memory_bus_settings, spec_for):
    first, running = await _campaign(memory_bus_settings, spec_for(0, warm=0))
    archive = running.services["memory"].archive
    offered = archive.priors("synthetic_conv", limit=5)
    assert len(offered) == 5 and offered[0].relative == 1.0 and "GPU0" in offered[0].device
    assert [p.relative for p in offered] == sorted(p.relative for p in offered)
    assert offered[0].params_json == first.best().candidate.params_json

    second, running = await _campaign(memory_bus_settings, spec_for(1, warm=5))
    events = running.services["memory"].archive.events(campaign=second.id)
    started = next(e.campaign_started for e in events if e.HasField("campaign_started"))
    # the evidence of the start: every measurement of the earlier campaign's searched points, best first
    measured = running.services["memory"].archive.priors("synthetic_conv", exclude_campaign=second.id, limit=1000)
    assert [p.params_json for p in started.priors] == [p.params_json for p in measured]
    assert [p.params_json for p in started.priors[:5]] == [p.params_json for p in offered]
    assert len(started.priors) > 5 and started.priors[-1].relative > 1.0
    proposed = [e.point_proposed for e in events if e.HasField("point_proposed")]
    warm = [p for p in proposed if p.origin.startswith("warm:")]
    assert [p.params_json for p in warm] == [p.params_json for p in offered]
    assert proposed.index(warm[0]) < min(i for i, p in enumerate(proposed) if p.origin.startswith("template:"))
    # the priors count against the search budget like any searched point
    assert sum(p.origin.startswith(("warm:", "template:")) for p in proposed) == 30


async def test_a_cold_start_asks_for_nothing(memory_bus_settings, spec_for):
    st, running = await _campaign(memory_bus_settings, spec_for(0, warm=0, budget=5))
    events = running.services["memory"].archive.events(campaign=st.id)
    assert not next(e.campaign_started for e in events if e.HasField("campaign_started")).priors
    assert not any(e.point_proposed.origin.startswith("warm:") for e in events if e.HasField("point_proposed"))


async def test_a_warm_strategy_learns_each_source_and_says_how_far_it_trusted_it(memory_bus_settings, spec_for,
                                                                                  monkeypatch, capsys):
    """A warm campaign's strategy learns the earlier campaign's landscape, and judges it as results come: the
    campaign's summary and report list each source (an earlier campaign) with its device, its agreement with this
    campaign's results and the weight it ended with; `kfactory priors` then names the sources a new campaign
    would learn from, the weight each starts with, why, and what this campaign measured of them."""
    first, _ = await _campaign(memory_bus_settings, spec_for(0, warm=0))
    spec = spec_for(1, warm=3, budget=14)
    spec.strategy, spec.parallel = "default", 1  # one result at a time: the trust is judged after each
    second, running = await _campaign(memory_bus_settings, spec)
    w = json.loads(second.finished.summary_json)["warm_start"]
    [src] = w["sources"]
    assert src["source"] == first.id and "GPU0" in src["device"]
    assert src["points"] == len(_started(running, second.id).priors)
    # the default portfolio's evidence-led member learned the first campaign's landscape: on the points that
    # campaign measured, its prior mean is that campaign's own ranking
    lead = second.strategy.members[second.strategy.led[0]]
    prior, idx = lead.prior, lead.idx
    assert prior.sources == [first.id] and prior.M.shape == (1, len(idx))
    rows = [idx.pos[Point(p.family, p.params_json)] for p in _started(running, second.id).priors]
    assert list(np.argsort(prior.M[0, rows], kind="stable")) == list(range(len(rows)))
    trust = second.strategy.trust()  # what the strategy ended with is what the summary says
    measured = sum(v is not None for v in second.strategy.results.values())  # failures rank nothing
    assert w["measured"] and w["results_judged"] == trust.results == measured >= 10
    assert src["agreement"] == round(trust.sources[0].tau, 3) and src["weight"] == round(trust.sources[0].weight, 3)
    lo, hi = src["interval_90"]
    assert -1 <= lo <= src["agreement"] <= hi <= 1
    assert w["evidence_say"] + w["own_model_weight"] == pytest.approx(1.0, abs=2e-3)
    assert 1 <= w["priors_proposed"] <= 3

    md, _ = report.build(running.services["memory"].archive.events(campaign=second.id))
    section = md.split("## Warm start: how far each source was trusted", 1)[1].split("\n## ", 1)[0]
    assert f"| {first.id} | {src['device']} | {src['points']} | {src['agreement']:+.2f} [{lo:+.2f}, {hi:+.2f}] | " \
           f"{src['weight']:.2f} |" in section

    monkeypatch.delenv("KFACTORY_MEMORY_ADDR", raising=False)
    monkeypatch.delenv("KFACTORY_PLANNER_ADDR", raising=False)
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(memory_bus_settings.data_dir))
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, ["priors", spec.problem, "--json"]) == 0  # it runs its own loop
    view = json.loads(capsys.readouterr().out)["trust"]
    assert {s["source"] for s in view["sources"]} == {first.id, second.id}
    assert all(s["start_weight"] == 0.5 for s in view["sources"]) and "same weight" in view["why"]
    [seen] = view["measured_before"]  # the second campaign judged the first
    assert seen["campaign"] == second.id and seen["sources"][0]["weight"] == src["weight"]
    assert await asyncio.to_thread(cli_main, ["priors", spec.problem]) == 0
    text = capsys.readouterr().out
    assert "a new campaign would learn from 2 source(s)" in text and f"  {second.id} on " in text


def _started(running, cid):
    events = running.services["memory"].archive.events(campaign=cid)
    return next(e.campaign_started for e in events if e.HasField("campaign_started"))


def test_memory_shares_a_warm_starts_evidence_among_its_source_campaigns(tmp_path):
    """Every source's priors, capped: each campaign's best point first, then each one's second, and so on, so a
    campaign whose points are all near its best (a flat space) cannot crowd the others out of the cap, as one
    ranking of every campaign's points by closeness to its own best did."""
    from evidence_chain import chain
    from kfactory.bus import events as ev
    from kfactory.services.memory.archive import Archive

    archive = Archive(tmp_path / "archive.sqlite")
    relative = {"flat": [1.0 + 0.001 * i for i in range(10)], "peaked": [1.0, 1.5, 2.0, 3.0], "slow": [1.0, 4.0]}
    try:
        for cid, scores in relative.items():
            spec = pb.CampaignSpec(problem="softmax", target="cpu")
            archive.record(ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec)))
            for i, r in enumerate(scores):
                cand = pb.Candidate(id=f"{cid}-{i}", problem="softmax", target="cpu", origin="template:cpu_c",
                                    family="cpu_c", params_json=json.dumps({"unroll": i}))
                for e in chain(cid, cand, 0.001 * r, device=pb.DeviceInfo(model=cid)):
                    assert archive.record(e)
        capped = archive.priors("softmax", limit=6, every_source=True)
        whole = archive.priors("softmax", limit=100, every_source=True)
        one = archive.priors("softmax", limit=3)
    finally:
        archive.close()
    assert [(p.campaign_id, round(p.relative, 3)) for p in capped] == [
        ("flat", 1.0), ("peaked", 1.0), ("slow", 1.0), ("flat", 1.001), ("peaked", 1.5), ("slow", 4.0)]
    assert len(whole) == 16 and {p.campaign_id for p in whole[:3]} == {"flat", "peaked", "slow"}
    # one entry per point across campaigns (not every_source): the closest first, as before
    assert [round(p.relative, 3) for p in one] == [1.0, 1.001, 1.002]

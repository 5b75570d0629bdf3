"""Warm starts: a campaign asks memory for the best points of earlier campaigns of the same problem (here the
same recorded kernel on another GPU), proposes them first, and records what it used in its evidence."""
from __future__ import annotations

import numpy as np
import pytest

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


async def test_a_campaign_on_another_gpu_starts_from_what_memory_learned(bus_settings, spec_for):
    first, running = await _campaign(bus_settings, spec_for(0, warm=0))
    archive = running.services["memory"].archive
    offered = archive.priors("synthetic_conv", limit=5)
    assert len(offered) == 5 and offered[0].relative == 1.0 and "GPU0" in offered[0].device
    assert [p.relative for p in offered] == sorted(p.relative for p in offered)
    assert offered[0].params_json == first.best().candidate.params_json

    second, running = await _campaign(bus_settings, spec_for(1, warm=5))
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


async def test_a_cold_start_asks_for_nothing(bus_settings, spec_for):
    st, running = await _campaign(bus_settings, spec_for(0, warm=0, budget=5))
    events = running.services["memory"].archive.events(campaign=st.id)
    assert not next(e.campaign_started for e in events if e.HasField("campaign_started")).priors
    assert not any(e.point_proposed.origin.startswith("warm:") for e in events if e.HasField("point_proposed"))


async def test_a_model_based_strategy_learns_the_other_campaigns_landscape(bus_settings, spec_for):
    await _campaign(bus_settings, spec_for(0, warm=0))
    spec = spec_for(1, warm=3, budget=12)
    spec.strategy = "surrogate"
    second, running = await _campaign(bus_settings, spec)
    prior = second.strategy.prior  # transfer.PriorMean, fitted from the first campaign's measurements
    assert prior is not None and prior.sources and prior.M.shape[1] == len(second.strategy.idx)
    # on the points the first campaign measured, the prior mean is that campaign's own ranking
    started = _started(running, second.id)
    idx = second.strategy.idx
    rows = [idx.pos[Point(p.family, p.params_json)] for p in started.priors]
    assert list(np.argsort(prior.M[0, rows], kind="stable")) == list(range(len(rows)))


def _started(running, cid):
    events = running.services["memory"].archive.events(campaign=cid)
    return next(e.campaign_started for e in events if e.HasField("campaign_started"))

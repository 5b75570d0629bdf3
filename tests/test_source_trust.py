"""Warm starts that never hurt: each source of a warm start is trusted as far as it ranks this device's results
(kfactory/strategies/agreement.py), and the priors proposed first, the prior mean and the default portfolio's
evidence-led share follow that trust. Hand-made devices (tests/tuning_synth.py): `bowl` is the device searched;
`agreeing` ranks its space the same way, `upside_down` the other way round."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

from kfactory.targets.replay import load_space
from kfactory.strategies import Point, Space, make_strategy
from kfactory.strategies.agreement import SourceAgreement, Trust, judge
from kfactory.strategies.base import Evidence
from kfactory.strategies.transfer import WarmPriors
from tuning_synth import LANDSCAPES, write_spaces

SEEDS = range(5)
#: evaluations a run may take before it counts as never within 5% of the optimum
CAP = 60


@pytest.fixture(scope="module")
def devices(tmp_path_factory):
    paths = write_spaces(tmp_path_factory.mktemp("trust"), kernel="trust", devices=tuple(LANDSCAPES),
                         landscapes=LANDSCAPES)
    return {p.name.removesuffix(".json.gz").split("-", 1)[1]: load_space(p) for p in paths}


def _evidence(devices, name: str) -> list[Evidence]:
    """What memory holds from a campaign on `name` that measured every point but the one that is best on `bowl`
    (so the warm start has to find it, not just propose it): relative scores."""
    rs, target = devices[name], devices["bowl"]
    best, hidden = rs.optimum_ms(), min(target.records.values(), key=lambda r: r.time_ms).params
    return [Evidence(Point.of(rs.family().name, r.params), r.time_ms / best, name) for r in rs.records.values()
            if r.params != hidden]


def _search(devices, evidence: list[Evidence], seed: int, evals: int = CAP, until_hit: bool = True):
    """A campaign on `bowl` as the planner runs it: up to 8 of the evidence's points first while the strategy
    trusts their sources (WarmPriors), then the default strategy's. Returns (evaluations to within 5% of the
    optimum, CAP + 1 when never; the strategy; the warm start's priors)."""
    rs = devices["bowl"]
    space, opt = Space([rs.family()]), rs.optimum_ms()
    s = make_strategy("default", space, seed=seed)
    if evidence:
        s.warm(evidence)
    priors = WarmPriors(evidence, 8)
    hit = evals + 1
    for n in range(1, evals + 1):
        p = priors.next(s.trust(), lambda c: c in s.seen)
        if p is None:
            p = s.ask()
            assert p is not None
        else:
            s.seen.add(p)
        t = rs.lookup(p.params).time_ms
        s.tell(p, t)
        if t <= 1.05 * opt and hit > evals:
            hit = n
            if until_hit:
                break
    return hit, s, priors


@pytest.fixture(scope="module")
def cold(devices):
    return [_search(devices, [], seed)[0] for seed in SEEDS]


def test_an_agreeing_source_makes_the_warm_start_win(devices, cold):
    """The source measured every point but this device's best: its best points, proposed first, and the
    evidence-led member that trusts it find the optimum in well under the evaluations a cold start needs."""
    warm = [_search(devices, _evidence(devices, "agreeing"), seed)[0] for seed in SEEDS]
    assert statistics.median(warm) <= 0.6 * statistics.median(cold), (warm, cold)


def test_an_upside_down_source_loses_its_say_and_the_search_is_as_good_as_cold(devices, cold):
    """The source's best points are this device's worst: it soon has no weight, the warm start's own proposals
    stop once that is sure, and the cold members (never drawn to where the evidence pointed) find the optimum in
    about the evaluations a cold start needs (within a few of it: the priors tried, and the seeds' noise)."""
    runs = [_search(devices, _evidence(devices, "upside_down"), seed) for seed in SEEDS]
    warm = [hit for hit, _, _ in runs]
    assert statistics.median(warm) <= statistics.median(cold) + 6, (warm, cold)
    for (hit, s, priors), cold_hit in zip(runs, cold):
        assert priors.proposed <= 5 and "against this device" in priors.stopped
        trust = s.trust()
        assert trust.evidence == 0.0 and trust.sources[0].tau < 0
        # the cold members searched as a cold start does: the warm start cost the evaluations the evidence led
        assert hit <= cold_hit + priors.proposed + sum(s.asks[i] for i in s.led), (hit, cold_hit, s.asks)


def test_of_two_sources_the_misleading_one_loses_its_weight(devices):
    evidence = _evidence(devices, "agreeing") + _evidence(devices, "upside_down")
    _, s, _ = _search(devices, evidence, seed=1, evals=16, until_hit=False)
    trust = s.trust()
    by = {a.source: a for a in trust.sources}
    assert by["upside_down"].weight == 0.0 and by["upside_down"].tau < 0
    assert by["agreeing"].tau > 0.5 and by["agreeing"].weight > 0
    assert by["agreeing"].low <= by["agreeing"].tau <= by["agreeing"].high
    assert by["upside_down"].low <= by["upside_down"].tau <= by["upside_down"].high < 0


def test_trust_is_shared_equally_before_there_is_anything_to_judge():
    rng = np.random.default_rng(0)
    one = judge(np.array([[0.0]]), np.array([0.0]), np.array([1.0]), ["a"], rng)
    assert one == Trust.equal(["a"], 1) and one.evidence == 1.0
    # two sources, four points: one orders them as measured, one reversed, and the own model knows nothing
    y = np.array([0.0, 1.0, 2.0, 3.0])
    t = judge(np.vstack([y, -y]), np.zeros(4), y, ["same", "reversed"], rng)
    assert [round(a.tau, 6) for a in t.sources] == [1.0, -1.0]
    assert t.sources[0].weight == 1.0 and t.sources[1].weight == 0.0 and t.own == 0.0


def test_the_priors_follow_the_weights():
    a, b, c, d = (Point.of("f", {"x": i}) for i in range(4))
    evidence = [Evidence(a, 1.0, "s1"), Evidence(b, 3.0, "s1"), Evidence(c, 2.0, "s1"), Evidence(d, 1.5, "s1"),
                Evidence(a, 3.0, "s2"), Evidence(b, 1.0, "s2"), Evidence(c, 2.0, "s2"), Evidence(d, 1.5, "s2")]
    taken: set = set()

    def trust(w1: float, w2: float, high: float = 1.0, results: int = 6) -> Trust:
        return Trust(results, (SourceAgreement("s1", high - 0.5, high - 1.0, high, w1),
                               SourceAgreement("s2", high - 0.5, high - 1.0, high, w2)), 1.0 - w1 - w2)

    def nxt(t: Trust):
        p = priors.next(t, taken.__contains__)
        taken.add(p)
        return p

    priors = WarmPriors(evidence, 4)
    assert nxt(trust(0.6, 0.0)) == a  # only s1 has a say: its best
    assert nxt(trust(0.0, 0.7)) == b  # now only s2 has
    assert nxt(trust(0.0, 0.0)) == d  # neither has (this device's own model has it all): they count the same
    # every source orders this device's results against it, but on too few results to be sure: go on
    assert priors.next(trust(0.0, 0.0, high=-0.1, results=4), taken.__contains__) == c
    priors = WarmPriors(evidence, 4)
    assert priors.next(trust(0.0, 0.0, high=-0.1), set().__contains__) is None
    assert priors.proposed == 0 and "every source ordered them against this device" in priors.stopped


def test_evidence_that_stops_finding_better_points_hands_its_share_back(devices):
    """The evidence-led share is the say halved per STALE_HALF evidence-led results in a row without a new best
    (portfolio module docstring): told 12 evidence-led results that improve nothing, it is the say x 0.5^(12/8);
    one that improves the best restores the whole say; a cold member's result does not touch the count."""
    from kfactory.strategies.portfolio import STALE_HALF
    rs = devices["bowl"]
    s = make_strategy("default", Space([rs.family()]), seed=3)
    s.warm(_evidence(devices, "agreeing"))
    records = sorted((r for r in rs.records.values()), key=lambda r: r.time_ms)
    points = [Point.of(rs.family().name, r.params) for r in records]
    s.seen.add(points[1])
    s.tell(points[1], records[1].time_ms)  # the priors' way: told without a member asking, evidence-led
    assert s._say() == pytest.approx(s.trust().evidence)
    for p, r in zip(points[-12:], records[-12:]):  # the slowest points: none is a new best
        s.seen.add(p)
        s.tell(p, r.time_ms)
    assert s.led_stale == 12
    assert s._say() == pytest.approx(s.trust().evidence * 0.5 ** (12 / STALE_HALF))
    cold_point = s.ask()
    while s.owner.get(cold_point, -1) in s.led:  # a cold member's ask
        s.tell(cold_point, rs.lookup(cold_point.params).time_ms)
        cold_point = s.ask()
    before = s.led_stale
    s.tell(cold_point, rs.lookup(cold_point.params).time_ms)
    assert s.led_stale == before
    s.seen.add(points[0])
    s.tell(points[0], records[0].time_ms)  # the optimum, evidence-led: a new best
    assert s.led_stale == 0 and s._say() == pytest.approx(s.trust().evidence)


def test_a_source_the_strategy_could_not_judge_is_shown_with_no_weight():
    """The summary's sources: a source the strategy judged carries its agreement and weight; one it could not
    (too few of its points in this space to predict from) had no say and shows weight 0, not an equal share;
    without a strategy's trust every source counted the same."""
    from kfactory.evidence.warm_sources import campaign_section
    pts = [Point.of("f", {"x": i}) for i in range(6)]
    evidence = [Evidence(p, 1.0 + i, "judged") for i, p in enumerate(pts)] + [Evidence(pts[0], 1.0, "sparse")]
    priors = WarmPriors(evidence, 2)
    trust = Trust(6, (SourceAgreement("judged", 0.6, 0.2, 0.9, 0.7),), 0.3)
    rows = {r["source"]: r for r in campaign_section(trust, priors, {})["sources"]}
    assert rows["judged"]["weight"] == 0.7 and rows["judged"]["agreement"] == 0.6
    assert rows["sparse"]["weight"] == 0.0 and rows["sparse"]["agreement"] is None
    rows = {r["source"]: r for r in campaign_section(None, priors, {})["sources"]}
    assert rows["judged"]["weight"] == rows["sparse"]["weight"] == 0.5

"""The engine campaign's showdown (kfactory/engines/showdown.py): which designs contend, the order they are timed
in, and a winner decided by per-round ratios, so that a drift of the host's load between two designs' timings
cannot pick the slower one; the record and best.json name the showdown's winner."""
from __future__ import annotations

import json

import pytest

from kfactory.engines.campaign import DesignResult, report_text, write_record
from kfactory.engines.design import SPIN_MARGIN, EngineDesign
from kfactory.engines.showdown import Rule, Showdown, schedule, spins_of

A, B, C = EngineDesign(), EngineDesign(threads=2, wait="bounded"), EngineDesign(threads=2, spin=True)


def _timed(design: EngineDesign, *decodes: float) -> DesignResult:
    r = DesignResult(design.as_dict(), design.design_id(), "verified")
    for d in decodes:
        r.add_timing(d, 500.0)
    return r


def test_contenders_are_those_within_the_margin_the_fastest_first():
    results = [_timed(A, 100.0), _timed(B, 120.0), _timed(C, 110.0),
               DesignResult(A.as_dict(), "broken", "rejected")]
    rule = Rule(rounds=3, margin=1.15)
    assert [r.design_id for r in rule.contenders(results)] == [B.design_id(), C.design_id()]   # 120/100 > 1.15
    assert [r.design_id for r in Rule(rounds=3, margin=1.25).contenders(results)] == \
        [B.design_id(), C.design_id(), A.design_id()]
    # the campaign's noise figure widens the margin: a host that moved a figure x0.8 cannot tell 120 from 100
    assert len(rule.contenders(results, {"decode_ratio": 0.8})) == 3
    assert len(rule.contenders(results, {"decode_ratio": 1.25})) == 3
    assert len(Rule(rounds=3, size=2, margin=2.0).contenders(results)) == 2   # at most `size`
    # nothing to decide: one design within reach, one verified, or no rounds asked for
    assert Rule(rounds=3, margin=1.05).contenders(results) == []
    assert rule.contenders([_timed(A, 100.0)]) == []
    assert Rule(rounds=0, margin=2.0).contenders(results) == []


def test_each_contender_goes_first_in_turn():
    assert schedule(["a", "b", "c"], 4) == [(0, "a"), (0, "b"), (0, "c"), (1, "b"), (1, "c"), (1, "a"),
                                            (2, "c"), (2, "a"), (2, "b"), (3, "a"), (3, "b"), (3, "c")]


@pytest.mark.parametrize("rule, field", [(dict(rounds=-1), "rounds"), (dict(size=1), "contenders"),
                                         (dict(margin=0.9), "margin")])
def test_a_rule_outside_its_range_says_which(rule, field):
    with pytest.raises(ValueError, match=field):
        Rule(**rule)


def test_per_round_ratios_decide_where_the_load_drifted():
    # the load falls over the rounds; b is x1.05 of a in three rounds and was hit by a burst of load in the two
    # fast early ones, so a has the higher median of its own timings (100 against 95) and b the higher ratio
    sd = Showdown(["a", "b"], 5)
    timings = [(200, 80), (190, 70), (100, 105), (95.2, 99.96), (90.5, 95.025)]
    for k, (a, b) in enumerate(timings):
        sd.add("a", k, a, 500.0)
        sd.add("b", k, b, 510.0)
    assert sorted(a for a, _ in timings)[2] > sorted(b for _, b in timings)[2]
    ratios = sd.ratios()
    assert ratios["a"] == {"decode_ratio": 1.0, "prefill_ratio": 1.0, "rounds": 5}
    assert ratios["b"]["decode_ratio"] == pytest.approx(1.05) and ratios["b"]["prefill_ratio"] == pytest.approx(1.02)
    assert sd.ranked({}) == ("b", "b")
    # a contender that faults is out; the next one still in becomes the reference
    sd.fault("a")
    assert sd.standing == ["b"] and sd.ratios() == {"b": {"decode_ratio": 1.0, "prefill_ratio": 1.0, "rounds": 5}}
    assert sd.as_dict({})["reference"] == "b" and sd.as_dict({})["faulted"] == ["a"]


@pytest.mark.parametrize("lead, spinning_wins", [(1.05, False), (SPIN_MARGIN + 0.02, True)])
def test_the_spin_rule_applies_to_the_showdowns_ratios(tmp_path, lead, spinning_wins):
    # by the campaign's figures the calm design is ahead; in the showdown the spinning one leads by `lead`
    results = [_timed(A, 100.0), _timed(B, 190.0), _timed(C, 185.0)]
    sd = Showdown([B.design_id(), C.design_id()], 3)
    for k in range(3):
        load = 1.0 - 0.2 * k
        sd.add(B.design_id(), k, 180.0 * load, 500.0)
        sd.add(C.design_id(), k, 180.0 * load * lead, 500.0)
    record = write_record(tmp_path, {"model": "m", "target": "cpu", "started": "t"}, results, {},
                          showdown=sd.as_dict(spins_of(results)))
    want = C if spinning_wins else B
    assert record["best"]["design_id"] == want.design_id()
    assert json.loads((tmp_path / "best.json").read_text())["design_id"] == want.design_id()
    assert record["fastest"]["design_id"] == C.design_id()       # the showdown's fastest, not the figures'
    text = report_text({**record, "effects": {}})
    assert f"showdown: 2 closest designs timed alternately in 3 rounds (median per-round decode ratio to " \
           f"{B.design_id()})" in text
    assert f"decode x{lead:.3f}, prefill x1.000 (3 rounds)" in text
    winner_line = next(line for line in text.splitlines() if line.endswith("<- winner"))
    assert want.design_id() in winner_line
    if not spinning_wins:
        assert f"passed over: {C.design_id()} decodes x{lead:.3f} faster but spins" in text


def test_without_a_showdown_the_figures_decide(tmp_path):
    results = [_timed(A, 100.0), _timed(B, 190.0)]
    record = write_record(tmp_path, {"model": "m", "target": "cpu", "started": "t"}, results, {})
    assert record["showdown"] is None and record["best"]["design_id"] == B.design_id()
    assert "showdown" not in report_text({**record, "effects": {}})

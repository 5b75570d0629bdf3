"""Through the services an engine campaign's re-timings are planned by the planner from the campaign's events and
folded back from them (kfactory/engines/finale.py, kfactory/engines/pipeline.py): the noise timing, then the
showdown's requests among the designs within reach, each contender first in turn; a contender whose showdown
timing is rejected (or dead-lettered) is out, and the winner is decided by the per-round ratios. Events as the
services publish them."""
from __future__ import annotations

import json

import pytest

from kfactory.bus import events as ev
from kfactory.bus.base import DLQ_PAYLOAD_MAX, dead_letter_of
from kfactory.engines.finale import EngineFinale, requests, showdown_requests
from kfactory.engines import pipeline
from kfactory.engines.design import EngineDesign
from kfactory.engines.showdown import Rule
from kfactory.v1 import events_pb2 as pb

import evidence_chain

CID = "c1"
FAST, NEAR, FAR = EngineDesign(threads=2, wait="bounded"), EngineDesign(threads=2, spin=True), EngineDesign()


def _cand(design: EngineDesign) -> pb.Candidate:
    return pb.Candidate(id=design.design_id(), point_id="p-" + design.design_id(), campaign_id=CID,
                        params_json=json.dumps(design.as_dict()))


def _measured(design: EngineDesign, decode: float, round_: int = 0) -> pb.Event:
    """The benchmarker's Measured of `design` at `decode` tok/s (prefill 500 tok/s), in timing round `round_`."""
    m = pb.Measured(candidate=_cand(design), score_s=1 / decode, round=round_,
                    timings=[evidence_chain.timing(1 / decode, "128"), evidence_chain.timing(1 / 500, "prefill_128")])
    key = design.design_id() + (f":round{round_}" if round_ else "")
    return ev.make_event(CID, "benchmarker", key, measured=m)


def _campaign() -> list[pb.Event]:
    """Three designs proposed, verified and measured once: FAST 200 tok/s, NEAR 190, FAR 100."""
    events = []
    for design, decode in ((FAR, 100.0), (FAST, 200.0), (NEAR, 190.0)):
        events.append(ev.make_event(CID, "planner", design.design_id(), point_proposed=pb.PointProposed(
            point_id="p-" + design.design_id(), params_json=json.dumps(design.as_dict()))))
        events += evidence_chain.links(CID, _cand(design)) + [_measured(design, decode)]
    return events


def test_the_showdown_is_planned_from_the_archived_rounds():
    events = _campaign()
    # one timing round: the noise timing of the first design proposed, round 2
    assert [(r.candidate.id, r.round) for r in requests(events, 1)] == [(FAR.design_id(), 2)]
    events.append(_measured(FAR, 100.0, 2))
    # the two within x1.15 of the fastest, the fastest first, each first in turn over rounds 3..5
    plan = showdown_requests(events, 1, Rule(rounds=3, margin=1.15))
    assert [(d, r.round) for d, r in plan] == [(FAST.design_id(), 3), (NEAR.design_id(), 3),
                                               (NEAR.design_id(), 4), (FAST.design_id(), 4),
                                               (FAST.design_id(), 5), (NEAR.design_id(), 5)]
    assert all(r.candidate.id == d and r.artifact_digest == "a" * 64 for d, r in plan)
    assert showdown_requests(events, 1, Rule(rounds=0)) == []
    # a noise timing that moved x0.5 widens the margin to x2: FAR contends too (at most 3)
    events[-1] = _measured(FAR, 50.0, 2)
    assert {d for d, _ in showdown_requests(events, 1, Rule(rounds=1, margin=1.15))} == \
        {FAST.design_id(), NEAR.design_id(), FAR.design_id()}


@pytest.mark.parametrize("fault", ["rejected", "dead_letter", "cut_dead_letter"])
def test_the_showdown_is_folded_back_and_decides(tmp_path, fault):
    events = [*_campaign(), _measured(FAR, 100.0, 2)]
    # NEAR beats FAST x1.05 in every round although its first timing was slower; it spins, and x1.05 is within
    # SPIN_MARGIN, so the calm FAST wins; then the same with FAST faulting in round 4: out, NEAR wins
    for r, (fast, near) in enumerate(((150.0, 157.5), (160.0, 168.0), (170.0, 178.5)), 3):
        events += [_measured(FAST, fast, r), _measured(NEAR, near, r)]
    rule = Rule(rounds=3, margin=1.15)
    before = pipeline.results_of(events, None, 1, showdown=False)
    sd = pipeline.showdown_of(events, before, 1, rule)
    assert sd["contenders"] == [FAST.design_id(), NEAR.design_id()] and sd["faulted"] == []
    assert sd["ratios"][NEAR.design_id()]["decode_ratio"] == pytest.approx(1.05)
    assert (sd["fastest"], sd["winner"]) == (NEAR.design_id(), FAST.design_id())
    record = pipeline.write(events, "m", tmp_path, tmp_path, pb.CampaignSpec(target="cpu", budget_candidates=3),
                            1e-4, started="t", rounds=1, showdown=rule)
    assert record["best"]["design_id"] == FAST.design_id() and record["showdown_rule"] == rule.as_dict()
    by_id = {r["design_id"]: r for r in record["results"]}
    assert [t[0] for t in by_id[FAST.design_id()]["timings"]] == pytest.approx([200.0, 150.0, 160.0, 170.0])
    assert len(by_id[FAR.design_id()]["timings"]) == 1     # its noise timing is not one of its rounds
    # FAST's round-4 timing faults (the benchmarker's Rejected), or its request is dead-lettered
    faulted = [e for e in events if not (e.HasField("measured") and e.measured.round >= 4
                                         and e.measured.candidate.id == FAST.design_id())]
    if fault == "rejected":
        faulted.append(ev.make_event(CID, "benchmarker", FAST.design_id() + ":round4", rejected=pb.Rejected(
            stage="benchmarker", reason=pb.CRASHED, message="bench failed: engine fault", candidate=_cand(FAST),
            figures={"round": 4})))
    else:   # as the bus letters it; a request over the letters' payload limit is cut, and no longer decodes
        request = pb.Verified(candidate=_cand(FAST), artifact_digest="a" * 64, round=4)
        if fault == "cut_dead_letter":
            request.checks.add(note="x" * DLQ_PAYLOAD_MAX)
        data = ev.make_event(CID, "planner", FAST.design_id() + ":round4", verified=request).SerializeToString()
        letter = dead_letter_of("benchmarker", "work.benchmarker", data, "lock held", 5, pb.HARNESS_FAILED)
        assert (ev.decoded(letter.payload) is None) == (fault == "cut_dead_letter")
        faulted.append(ev.make_event(CID, "benchmarker", "dl", dead_letter=letter))
        # and a cut letter of a request for a candidate this campaign never measured: no design to name, no crash
        stranger = pb.Verified(candidate=pb.Candidate(id="k-unknown", point_id="p-unknown"), round=4)
        stranger.checks.add(note="x" * DLQ_PAYLOAD_MAX)
        data = ev.make_event(CID, "planner", "k-unknown:round4", verified=stranger).SerializeToString()
        faulted.append(ev.make_event(CID, "benchmarker", "dl2", dead_letter=dead_letter_of(
            "benchmarker", "work.benchmarker", data, "lock held", 5, pb.HARNESS_FAILED)))
    record = pipeline.write(faulted, "m", tmp_path, tmp_path, pb.CampaignSpec(target="cpu", budget_candidates=3),
                            1e-4, started="t2", rounds=1, showdown=rule)
    sd = record["showdown"]
    assert sd["faulted"] == [FAST.design_id()] and sd["reference"] == sd["winner"] == NEAR.design_id()
    # a fault is the design's verdict (a dead letter is the harness's failure: the design keeps its timings)
    verdict = {r["design_id"]: r["verdict"] for r in record["results"]}[FAST.design_id()]
    assert verdict == ("bench_failed" if fault == "rejected" else "verified")
    assert record["best"]["design_id"] == NEAR.design_id()


def _answered_noise() -> list[pb.Event]:
    return [*_campaign(), _measured(FAR, 100.0, 2)]


def _fault(design: EngineDesign, round_: int) -> pb.Event:
    """The benchmarker's Rejected of `design`'s timing in round `round_` (an engine fault)."""
    return ev.make_event(CID, "benchmarker", f"{design.design_id()}:round{round_}", rejected=pb.Rejected(
        stage="benchmarker", reason=pb.CRASHED, message="bench failed: engine fault", candidate=_cand(design),
        figures={"round": round_}))


def test_a_design_whose_timing_faulted_is_timed_in_no_later_round():
    """As the local campaign's retime leaves a bench_failed design out of later rounds: FAST faults in round 2, so
    round 3 times FAR and NEAR alone; the noise timing is the first design still verified (FAR), or, where FAR
    faulted, the next one (FAST), whose round-4 timing the record then reads as its noise figure."""
    events = [*_campaign(), _measured(FAR, 100.0, 2), _fault(FAST, 2), _measured(NEAR, 190.0, 2)]
    plan = [(r.candidate.id, r.round) for r in requests(events, 3)]
    assert plan == [(FAR.design_id(), 2), (FAST.design_id(), 2), (NEAR.design_id(), 2),
                    (FAR.design_id(), 3), (NEAR.design_id(), 3), (FAR.design_id(), 4)]
    events = [*_campaign(), _fault(FAR, 2), _measured(FAST, 200.0, 2), _measured(NEAR, 190.0, 2)]
    plan = [(r.candidate.id, r.round) for r in requests(events, 3)]
    assert plan[3:] == [(FAST.design_id(), 3), (NEAR.design_id(), 3), (FAST.design_id(), 4)]
    events += [_measured(FAST, 200.0, 3), _measured(NEAR, 190.0, 3), _measured(FAST, 100.0, 4)]
    results = pipeline.results_of(events, None, 3, showdown=False)
    assert pipeline.noise_of(events, results, 3) is not None
    # a fault of the only other design leaves one verified: no noise timing
    events = [*_campaign(), _fault(FAR, 2), _fault(FAST, 2), _measured(NEAR, 190.0, 2)]
    assert [(r.candidate.id, r.round) for r in requests(events, 2)][3:] == []


def test_the_finale_asks_for_the_first_request_still_unanswered():
    """The planner's finale is a function of the events it folded: a planner restarted mid-finale folds them
    from the stream again and goes on with the first request no answer has come for."""
    fin = EngineFinale(1, Rule(rounds=2, margin=1.15))
    for e in _campaign():
        fin.fold(e)
    assert (fin.next().candidate.id, fin.next().round) == (FAR.design_id(), 2)   # the noise timing first
    assert fin.winner() is None                                                  # no showdown timing yet
    fin.fold(_measured(FAR, 100.0, 2))
    assert (fin.next().candidate.id, fin.next().round) == (FAST.design_id(), 3)
    # a restarted planner, folding the same events and the answers so far, asks for the same next request
    fin.fold(_measured(FAST, 150.0, 3))
    again = EngineFinale(1, Rule(rounds=2, margin=1.15))
    for e in [*_answered_noise(), _measured(FAST, 150.0, 3)]:
        again.fold(e)
    assert (again.next().candidate.id, again.next().round) == (NEAR.design_id(), 3)
    # the request's dead letter answers it too (nothing more will come of it); a contender rejected in the
    # showdown is asked no more
    req = again.next()
    dead = ev.make_event(CID, "benchmarker", "dl", dead_letter=pb.DeadLetter(
        stage="benchmarker", payload=ev.make_event(CID, "planner", "r", verified=req).SerializeToString(),
        cause=pb.HARNESS_FAILED))
    again.fold(dead)
    assert (NEAR.design_id(), 3) in again.answered and NEAR.design_id() in again.faulted
    assert (again.next().candidate.id, again.next().round) == (FAST.design_id(), 4)
    again.fold(_measured(FAST, 160.0, 4))
    assert again.next() is None and again.winner() == FAST.design_id()
    # the other, answered throughout: NEAR x1.05 of FAST in both rounds, but it spins and FAST is within x1.10
    for e in (_measured(NEAR, 157.5, 3), _measured(NEAR, 168.0, 4), _measured(FAST, 160.0, 4)):
        fin.fold(e)
    assert fin.next() is None and fin.winner() == FAST.design_id()


def test_a_request_whose_dead_letter_was_cut_is_answered_by_it():
    """A re-timing request over the dead letters' payload limit is kept cut, which no longer decodes; the letter's
    own candidate and round (read from the whole message) still answer the request, so the finale goes on at
    once instead of waiting for an answer that will never come."""
    fin = EngineFinale(1, Rule(rounds=2, margin=1.15))
    for e in _answered_noise():
        fin.fold(e)
    req = fin.next()
    assert (req.candidate.id, req.round) == (FAST.design_id(), 3)
    req.checks.add(note="x" * DLQ_PAYLOAD_MAX)
    data = ev.make_event(CID, "planner", "r", verified=req).SerializeToString()
    letter = dead_letter_of("benchmarker", "work.benchmarker", data, "harness failed", 5, pb.HARNESS_FAILED)
    assert ev.decoded(letter.payload) is None and (letter.candidate_id, letter.round) == (FAST.design_id(), 3)
    fin.fold(ev.make_event(CID, "benchmarker", "dl", dead_letter=letter))
    assert (FAST.design_id(), 3) in fin.answered and FAST.design_id() in fin.faulted
    assert (fin.next().candidate.id, fin.next().round) == (NEAR.design_id(), 3)


def test_without_showdown_rounds_the_finale_times_the_noise_and_decides_nothing():
    fin = EngineFinale(0, Rule(rounds=0))
    for e in _answered_noise():
        fin.fold(e)
    assert fin.rounds == 1 and fin.next() is None and fin.winner() is None


@pytest.mark.parametrize("cut", [False, True])
def test_a_design_whose_work_was_dead_lettered_is_a_harness_error_even_when_the_letter_was_cut(cut):
    """The verifier gave up on FAST's Compiled: its design is the harness's failure, not unfinished. A work message
    over the dead letters' payload limit is kept cut, which no longer decodes; the letter's own point and
    candidate (kfactory.bus.base.Bus.dead_letter reads them from the whole message) still name the design."""
    events = [e for e in _campaign() if not (e.HasField("measured") or e.HasField("verified"))
              or ev.candidate_of(e).id != FAST.design_id()]
    work = next(e for e in events if e.HasField("compiled") and e.compiled.candidate.id == FAST.design_id())
    data = work.SerializeToString()
    letter = pb.DeadLetter(stage="verifier", reason="lock held", deliveries=5, payload=data, payload_bytes=len(data),
                           point_id="p-" + FAST.design_id(), candidate_id=FAST.design_id())
    if cut:
        letter.payload = data[:len(data) // 2]
    events.append(ev.make_event(CID, "verifier", "dl", dead_letter=letter))
    verdicts = {r.design_id: (r.verdict, r.reason) for r in pipeline.results_of(events, None)}
    assert verdicts[FAST.design_id()] == ("harness_error", "verifier: lock held")
    assert verdicts[NEAR.design_id()][0] == verdicts[FAR.design_id()][0] == "verified"

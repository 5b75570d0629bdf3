"""The planner's campaign state is a fold over events: idempotent, and dead letters end their points."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError

from kfactory.bus import events as ev
from kfactory.bus.base import dead_letter_of
from kfactory.bus.deadletters import DeadLetterRecord
from kfactory.bus.events import MAX_EVENT_BYTES as MAX
from kfactory.cli.run import showdown_line
from kfactory.problems import load_problem
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.resends import judge
from kfactory.services.planner.summary import campaign_summary
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
import evidence_chain  # noqa: E402


def _state() -> CampaignState:
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=3, strategy="random", seed=1)
    return CampaignState("c1", spec, pb.DeviceInfo(), Space(list(load_problem("softmax").families.values())))


def _proposed(st: CampaignState, pid: str) -> pb.Event:
    point = st.strategy.ask()
    return ev.make_event("c1", "planner", pid, point_proposed=pb.PointProposed(
        point_id=pid, family=point.family, params_json=point.params_json, origin=f"template:{point.family}"))


def _measured(pid: str, cid: str, score: float) -> list[pb.Event]:
    """Candidate `cid` of point `pid`, created, compiled, verified and measured at `score` s."""
    cand = pb.Candidate(id=cid, point_id=pid, origin="template:cpu_c", params_json="{}")
    return evidence_chain.chain("c1", cand, score)


def _apply_all(st: CampaignState, events: list[pb.Event]) -> None:
    for e in events:
        assert st.apply(e) == "", e


def test_applying_an_event_twice_changes_nothing():
    st = _state()
    p = _proposed(st, "p1")
    m = _measured("p1", "k1", 0.5)
    for e in [p, p, *m, *m]:
        st.apply(e)
    assert st.counts.proposed == 1 and st.counts.measured == 1
    assert st.in_flight() == 0 and st.best().score_s == 0.5


def test_best_excludes_the_reference_and_picks_the_fastest():
    st = _state()
    for pid, cid, score in (("p1", "k1", 0.5), ("p2", "k2", 0.2)):
        st.apply(_proposed(st, pid))
        _apply_all(st, _measured(pid, cid, score))
    ref = pb.Candidate(id="ref", point_id="r", origin="reference")
    _apply_all(st, evidence_chain.chain("c1", ref, 0.01))
    assert st.best().candidate.id == "k2"
    summary = campaign_summary(st, load_problem("softmax"))
    assert summary["best"]["candidate_id"] == "k2" and summary["counts"]["measured"] == 3


def test_a_dead_lettered_point_is_finished_and_told_as_a_failure():
    st = _state()
    p = _proposed(st, "p1")
    st.apply(p)
    assert st.in_flight() == 1
    dl = pb.DeadLetter(stage="coder", reason="poison", deliveries=5, payload=p.SerializeToString())
    st.apply(ev.make_event("c1", "coder", "dl1", dead_letter=dl))
    assert st.in_flight() == 0 and st.counts.rejected == 1
    point = next(iter(st.strategy.results))
    assert st.strategy.results[point] is None and json.loads(point.params_json)


def test_a_dead_letter_whose_payload_was_cut_still_finishes_its_point():
    """A work message over the dead letters' payload limit is kept cut, which no longer decodes: the point and
    candidate the letter names (read from the whole message when it was dead-lettered) end the point, and a
    duplicate waiting on the candidate learns it failed; without them the point stayed in flight for ever."""
    st = _state()
    for pid in ("p1", "p2"):
        st.apply(_proposed(st, pid))
    cand = pb.Candidate(id="k1", point_id="p1", origin="template:cpu_c", params_json="x" * 1000)
    compiled = ev.make_event("c1", "compiler", "k1", compiled=pb.Compiled(candidate=cand, artifact_digest="d"))
    st.apply(compiled)
    dup = pb.Candidate(id="k1", point_id="p2", origin="template:cpu_c")
    st.apply(ev.make_event("c1", "coder", "r2", rejected=pb.Rejected(candidate=dup, point_id="p2",
                                                                      reason=pb.DUPLICATE)))
    whole = compiled.SerializeToString()
    dl = pb.DeadLetter(stage="verifier", reason="lock held", deliveries=5, payload=whole[:len(whole) // 2],
                       payload_bytes=len(whole), point_id="p1", candidate_id="k1")
    with pytest.raises(DecodeError):
        pb.Event.FromString(dl.payload)
    assert (st.in_flight(), st.counts.rejected, len(st.strategy.results)) == (1, 1, 0)  # the duplicate's
    st.apply(ev.make_event("c1", "verifier", "dl1", dead_letter=dl))
    assert st.in_flight() == 0 and st.counts.rejected == 2
    assert sorted(st.strategy.results.values(), key=str) == [None, None]


def test_a_dead_lettered_compare_request_is_known_as_one_and_counts_nothing():
    """A showdown's or the final comparison's request that the benchmarker gave up on will get no answer: the state
    names it (the driver stops waiting for it instead of COMPARE_WAIT_S), and its candidate's point, which ended
    when it was measured, is not counted again."""
    st = _state()
    st.apply(_proposed(st, "p1"))
    _apply_all(st, _measured("p1", "k1", 0.5))
    counts = pb.Counts()
    counts.CopyFrom(st.counts)
    cand = st.measured["k1"].candidate
    showdown = pb.CompareRequest(candidate=cand, contenders=[pb.Candidate(id="k2")])
    final = pb.CompareRequest(candidate=cand, reference=pb.Candidate(id="ref"))
    for key, req in ((ev.showdown_key(showdown), showdown), ("compare:k1", final)):
        work = ev.make_event("c1", "planner", key, compare_request=req)
        assert st.apply(work) == ""
        letter = dead_letter_of("benchmarker", "work.benchmarker", work.SerializeToString(), "deliveries exhausted",
                                5, pb.DELIVERIES_EXHAUSTED)
        assert st.apply(ev.make_event("c1", "benchmarker", "dl-" + key, dead_letter=letter)) == ""
        assert work.id in st.dead_compares
    assert st.counts == counts and st.in_flight() == 0 and st.best().candidate.id == "k1"


def test_a_duplicate_of_a_candidate_in_flight_is_told_its_twins_result_when_it_comes():
    st = _state()
    st.apply(_proposed(st, "p1"))
    st.apply(_proposed(st, "p2"))
    dup = pb.Candidate(id="k1", point_id="p2", origin="template:cpu_c")
    st.apply(ev.make_event("c1", "coder", "r2", rejected=pb.Rejected(candidate=dup, point_id="p2",
                                                                      reason=pb.DUPLICATE)))
    assert st.in_flight() == 1 and len(st.strategy.results) == 0 and st.strategy.pending() == 2
    _apply_all(st, _measured("p1", "k1", 0.25))  # the twin's result: both points are told it
    assert st.strategy.pending() == 0 and sorted(st.strategy.results.values()) == [0.25, 0.25]


def test_work_sent_back_after_its_dead_letter_replaces_it_when_it_ends():
    """`kfactory dead-letters --replay` while the campaign runs: the dead letter counted the point as rejected
    and told the strategy it failed; the measurement that comes of the replay counts instead, once."""
    st = _state()
    p = _proposed(st, "p1")
    st.apply(p)
    cand = pb.Candidate(id="k1", point_id="p1", origin="template:cpu_c", params_json="{}")
    compiled = ev.make_event("c1", "compiler", "k1", compiled=pb.Compiled(candidate=cand, artifact_digest="d"))
    st.apply(compiled)
    dl = pb.DeadLetter(stage="verifier", reason="lock held", deliveries=5, payload=compiled.SerializeToString())
    st.apply(ev.make_event("c1", "verifier", "dl1", dead_letter=dl))
    point = next(iter(st.strategy.results))
    assert st.counts.rejected == 1 and st.strategy.results[point] is None and st.best() is None
    m = _measured("p1", "k1", 0.125)
    for e in m + m:  # the replay's result, delivered twice
        st.apply(e)
    assert (st.counts.rejected, st.counts.measured, st.in_flight()) == (0, 1, 0)
    assert st.strategy.results[point] == 0.125 and st.best().score_s == 0.125
    st.apply(ev.make_event("c1", "verifier", "dl2", dead_letter=dl))  # a second dead letter of it, later
    assert (st.counts.rejected, st.counts.measured) == (0, 1)


def test_a_dead_letter_after_the_outcome_changes_nothing():
    st = _state()
    p = _proposed(st, "p1")
    st.apply(p)
    _apply_all(st, _measured("p1", "k1", 0.5))
    dl = pb.DeadLetter(stage="coder", reason="late", deliveries=5, payload=p.SerializeToString())
    st.apply(ev.make_event("c1", "coder", "dl1", dead_letter=dl))
    assert (st.counts.rejected, st.counts.measured) == (0, 1) and st.best().score_s == 0.5


def test_the_report_says_which_dead_letters_were_sent_back_and_how_they_ended():
    from kfactory.evidence import report
    st = _state()
    p1, p2 = _proposed(st, "p1"), _proposed(st, "p2")
    dl1 = pb.DeadLetter(stage="coder", reason="redis down\nmore", deliveries=5, payload=p1.SerializeToString(),
                        cause=pb.DELIVERIES_EXHAUSTED)
    dl2 = pb.DeadLetter(stage="coder", reason="late", deliveries=5, payload=p2.SerializeToString())
    events = [p1, p2, *_measured("p2", "k2", 0.5), ev.make_event("c1", "coder", "dl1", dead_letter=dl1),
              ev.make_event("c1", "coder", "dl2", dead_letter=dl2), *_measured("p1", "k1", 0.25)]
    p3, p4 = _proposed(st, "p3"), _proposed(st, "p4")
    for pid, p in (("p3", p3), ("p4", p4)):
        events += [p, ev.make_event("c1", "coder", f"dl-{pid}", dead_letter=pb.DeadLetter(
            stage="coder", reason="boom", deliveries=5, payload=p.SerializeToString()))]
    events += [ev.make_event("c1", "planner", "3", resend_answered=pb.ResendAnswered(
                   dlq_seq=3, point_id="p3", reason="dead letter 3: campaign c1 is ending (cancelled: by a user)")),
               ev.make_event("c1", "planner", "4", resend_answered=pb.ResendAnswered(
                   dlq_seq=4, point_id="p4", accepted=True))]
    section = report._dead_letters(events)
    assert section[2] == "| stage | cause | deliveries | reason | then |"
    assert section[4:8] == ["| coder | deliveries_exhausted | 5 | redis down | sent back: measured |",  # came after
                            "| coder | unspecified | 5 | late |  |",  # the outcome came first: never sent back
                            "| coder | unspecified | 5 | boom | refused: dead letter 3: campaign c1 is ending "
                            "(cancelled: by a user) |",
                            "| coder | unspecified | 5 | boom | sent back, no outcome yet |"]


def test_duplicates_of_a_dead_lettered_candidate_learn_its_result_when_it_is_sent_back():
    st = _state()
    st.apply(_proposed(st, "p1"))
    st.apply(_proposed(st, "p2"))
    cand = pb.Candidate(id="k1", point_id="p1", origin="template:cpu_c", params_json="{}")
    dup = pb.Candidate(id="k1", point_id="p2", origin="template:cpu_c")
    st.apply(ev.make_event("c1", "coder", "r2", rejected=pb.Rejected(candidate=dup, point_id="p2",
                                                                      reason=pb.DUPLICATE)))
    compiled = ev.make_event("c1", "compiler", "k1", compiled=pb.Compiled(candidate=cand, artifact_digest="d"))
    st.apply(compiled)
    dl = pb.DeadLetter(stage="verifier", reason="lock held", deliveries=5, payload=compiled.SerializeToString())
    st.apply(ev.make_event("c1", "verifier", "dl1", dead_letter=dl))
    assert list(st.strategy.results.values()) == [None, None] and st.strategy.pending() == 0
    _apply_all(st, _measured("p1", "k1", 0.25))  # sent back, then measured: both points learn it
    assert list(st.strategy.results.values()) == [0.25, 0.25]
    assert (st.counts.rejected, st.counts.measured) == (1, 1)  # p2 stays a rejected duplicate


def test_a_finished_campaign_reports_what_it_finished_with():
    """Late events (an expired campaign's work still in flight, work sent back as it ended) are archived by
    memory but change no finished campaign's counts or best."""
    st = _state()
    st.apply(_proposed(st, "p1"))
    st.apply(_proposed(st, "p2"))
    _apply_all(st, _measured("p1", "k1", 0.5))
    assert st.reported()[0].measured == 1 and st.reported()[1].score_s == 0.5  # live while it runs
    fin = pb.CampaignFinished(state="expired", counts=st.counts, best_candidate_id="k1")
    st.apply(ev.make_event("c1", "planner", "finish", campaign_finished=fin))
    _apply_all(st, _measured("p2", "k2", 0.25))  # in flight when it expired
    counts, best = st.reported()
    assert (counts.proposed, counts.measured, best.candidate.id) == (2, 1, "k1")
    assert st.counts.measured == 2  # the fold itself still sees it (a restarted planner replays the same)


def _dead_lettered_compile(st: CampaignState, seq: int) -> tuple[DeadLetterRecord, pb.Event]:
    """Point p1, compiled as k1, whose verification was dead-lettered at `seq` on the DLQ stream."""
    st.apply(_proposed(st, "p1"))
    cand = pb.Candidate(id="k1", point_id="p1", origin="template:cpu_c", params_json="{}")
    compiled = ev.make_event("c1", "compiler", "k1", compiled=pb.Compiled(candidate=cand, artifact_digest="d"))
    st.apply(compiled)
    dl = pb.DeadLetter(stage="verifier", subject=ev.work_subject("verifier", "c1"), reason="lock held",
                       deliveries=5, payload=compiled.SerializeToString(), payload_bytes=compiled.ByteSize())
    st.apply(ev.make_event("c1", "verifier", f"dl{seq}", dead_letter=dl))
    return DeadLetterRecord(seq, "c1", dl), compiled


def _answer(st: CampaignState, answer: pb.ResendAnswered) -> None:
    st.apply(ev.make_event("c1", "planner", str(answer.dlq_seq), resend_answered=answer))


def test_a_resend_the_planner_accepts_keeps_the_campaign_waiting_for_the_new_outcome():
    st = _state()
    record, work = _dead_lettered_compile(st, 7)
    st.apply(ev.make_event("c1", "cli", "7", resend_requested=pb.ResendRequested(dlq_seq=7)))
    assert list(st.resend_requests) == [7] and (st.counts.rejected, st.in_flight()) == (1, 0)
    answer = judge(st, 7, record, "", MAX)
    assert (answer.accepted, answer.point_id, answer.subject) == (True, "p1", ev.work_subject("verifier", "c1"))
    _answer(st, answer)
    # in flight again: the campaign cannot finish before the work's outcome, which counts instead
    assert (st.counts.rejected, st.in_flight(), st.resent, st.resend_requests) == (0, 1, {"p1": 7}, {})
    _apply_all(st, _measured("p1", "k1", 0.125))
    point = next(iter(st.strategy.results))
    assert (st.counts.measured, st.in_flight(), st.resent) == (1, 0, {})
    assert st.strategy.results[point] == 0.125 and st.best().score_s == 0.125
    again = judge(st, 7, record, "", MAX)  # the same dead letter, asked for twice
    assert not again.accepted and "p1 is not ended by a dead letter now" in again.reason


def test_sent_back_work_that_dies_again_is_a_second_dead_letter():
    st = _state()
    record, work = _dead_lettered_compile(st, 7)
    _answer(st, judge(st, 7, record, "", MAX))
    dl = pb.DeadLetter(stage="verifier", subject=record.letter.subject, reason="lock held again", deliveries=5,
                       payload=work.SerializeToString(), payload_bytes=work.ByteSize())
    st.apply(ev.make_event("c1", "verifier", "dl8", dead_letter=dl))
    assert (st.counts.rejected, st.in_flight(), st.dead_lettered) == (1, 0, {"p1"})
    assert judge(st, 8, DeadLetterRecord(8, "c1", dl), "", MAX).accepted  # and may go back again


def test_the_planner_refuses_a_resend_whose_outcome_could_not_count():
    st = _state()
    record, work = _dead_lettered_compile(st, 7)
    cut = pb.DeadLetter(stage="verifier", subject=record.letter.subject, reason="lock held", deliveries=5,
                        payload=record.letter.payload[:10], payload_bytes=20)
    reasons = {
        "ending": judge(st, 7, record, "cancelled: by a user", MAX).reason,
        "gone": judge(st, 7, None, "", MAX).reason,
        "other campaign": judge(st, 7, DeadLetterRecord(7, "c2", record.letter), "", MAX).reason,
        "no work": judge(st, 7, DeadLetterRecord(7, "c1", cut), "", MAX).reason,
    }
    assert reasons == {
        "ending": "dead letter 7: campaign c1 is ending (cancelled: by a user), so nothing more is measured in it",
        "gone": "dead letter 7: it is no longer on the DLQ stream (sent back already, or deleted)",
        "other campaign": "dead letter 7: it belongs to campaign c2, not to c1",
        "no work": "dead letter 7 kept only 10 of its 20 bytes; the message itself is gone"}
    refused = judge(st, 7, None, "", MAX)
    _answer(st, refused)  # a refusal changes nothing
    assert (refused.accepted, st.counts.rejected, st.in_flight(), st.resent) == (False, 1, 0, {})
    st.apply(ev.make_event("c1", "planner", "finish", campaign_finished=pb.CampaignFinished(state="completed")))
    done = judge(st, 7, record, "", MAX)
    assert not done.accepted and done.reason.startswith("dead letter 7: campaign c1 has finished (completed)")


def test_later_timing_rounds_change_no_measurement_count_or_result():
    """An engine campaign's timing rounds and showdown (Measured.round >= 2, and a benchmarker's Rejected of one)
    come after its search: kept apart, they leave the campaign's measurements, counts, search and best as they
    were, while their device time still counts."""
    st = _state()
    p1, p2 = _proposed(st, "p1"), _proposed(st, "p2")
    _apply_all(st, [p1, p2, *_measured("p1", "k1", 0.5), *_measured("p2", "k2", 0.25)])
    counts = pb.Counts()
    counts.CopyFrom(st.counts)
    first = st.measured["k2"]
    device_s = st.device_s
    again = pb.Measured()
    again.CopyFrom(first)
    again.round, again.score_s, again.seconds = 3, 0.125, 2.0
    again.timings[0].median_s = 0.125
    fault = pb.Rejected(stage="benchmarker", reason=pb.CRASHED, message="bench failed", figures={"round": 4},
                        candidate=st.measured["k1"].candidate)
    _apply_all(st, [ev.make_event("c1", "benchmarker", "k2:round3", measured=again),
                    ev.make_event("c1", "benchmarker", "k1:round4", rejected=fault)])
    assert st.counts == counts and st.measured["k2"] is first and st.best() is first
    assert st.device_s == pytest.approx(device_s + 2.0)


def _showdown(pick: str, medians: dict[str, float], error: str = "", failed: str = "", key: str = "") -> pb.Event:
    """A showdown's answer: each kernel's median with a 95% interval of +-0.5%."""
    comp = pb.Comparison(shape="4096x4096", candidate_id=pick, showdown=True, error=error, failed_candidate=failed)
    for cid, med in ({} if error else medians).items():  # a failed showdown has no entries
        comp.entries.append(pb.ComparisonEntry(name="candidate" if cid == pick else "contender", candidate_id=cid,
                                               timing=pb.ShapeTiming(shape="4096x4096", median_s=med, samples=100,
                                                                     ci_low_s=med * 0.995, ci_high_s=med * 1.005)))
    req = pb.CompareRequest(candidate=pb.Candidate(id=pick), contenders=[pb.Candidate(id=c) for c in medians
                                                                         if c != pick])
    return ev.make_event("c1", "benchmarker", ev.showdown_key(req) + key, comparison=comp)


def test_the_showdown_decides_the_best_among_near_ties():
    """Candidates measured alone minutes apart within 5% of each other are timed again interleaved (the driver's
    _showdown): the fastest there is the campaign's result; the final comparisons are not the showdown's."""
    st = _state()
    for pid, cid, score in (("p1", "k1", 0.50), ("p2", "k2", 0.51), ("p3", "k3", 0.52), ("p4", "k4", 0.9)):
        st.apply(_proposed(st, pid))
        _apply_all(st, _measured(pid, cid, score))
    pick = st.search_best()
    assert pick.candidate.id == "k1"
    assert [m.candidate.id for m in st.contenders(pick, 0.05, 5)] == ["k2", "k3"]  # k4 is 80% slower
    assert [m.candidate.id for m in st.contenders(pick, 0.05, 1)] == ["k2"]
    assert st.apply(_showdown("k2", {"k2": 0.3, "k1": 0.4})) == ""  # another pick's showdown decides nothing
    assert st.best().candidate.id == "k1"
    assert st.apply(_showdown("k1", {"k1": 0.49, "k2": 0.47, "k3": 0.50})) == ""
    assert st.best().candidate.id == "k2" and st.search_best().candidate.id == "k1" and st.comparisons == {}
    summary = campaign_summary(st, load_problem("softmax"))
    assert summary["best"]["candidate_id"] == "k2"
    assert summary["showdown"]["winner"] == "k2" and summary["showdown"]["search_best"] == "k1"
    # what `kfactory run` prints under its leaderboard, which ranks k1 first by its own score
    assert showdown_line(summary["showdown"]).endswith("k2 is the result (the search's best was k1)")
    assert summary["showdown"]["timed"]["k2"]["median_seconds"] == 0.47
    # a late answer to another best's showdown changes neither the result nor the summary
    assert st.apply(_showdown("k3", {"k3": 0.2, "k1": 0.4})) == ""
    assert st.best().candidate.id == "k2" and campaign_summary(st, None)["showdown"]["search_best"] == "k1"


def test_inside_the_noise_the_searchs_best_stays():
    st = _state()
    for pid, cid, score in (("p1", "k1", 0.50), ("p2", "k2", 0.51)):
        st.apply(_proposed(st, pid))
        _apply_all(st, _measured(pid, cid, score))
    assert st.apply(_showdown("k1", {"k1": 0.500, "k2": 0.498})) == ""  # intervals overlap
    assert st.best().candidate.id == "k1"


def _timing(shape: str, med: float) -> pb.ShapeTiming:
    return pb.ShapeTiming(shape=shape, median_s=med, samples=100, ci_low_s=med * 0.99, ci_high_s=med * 1.01)


def _measured_at(pid: str, cid: str, scored: float, other: float) -> list[pb.Event]:
    """As _measured, timed at both softmax optimisation shapes (the scored one first), each +-1%."""
    cand = pb.Candidate(id=cid, point_id=pid, origin="template:cpu_c", params_json="{}")
    m = pb.Measured(candidate=cand, score_s=scored, timings=[_timing("4096x4096", scored),
                                                             _timing("1x50257", other)])
    return [*evidence_chain.links("c1", cand), ev.make_event("c1", "benchmarker", cid, measured=m)]


@pytest.mark.parametrize("k2_other, k3_other, winner", [
    (0.10, 0.15, "k2"),    # k2 and k3 both faster at 1x50257 outside the noise: the fastest there
    (0.199, 0.30, "k1"),   # k2 faster inside the noise, k3 slower: the search's best stays
    (0.17, 0.30, "k1"),    # k2 faster outside the noise, but by 1.18x: within what drift between measurements does
    (0.30, 0.15, "k3"),    # k3 is faster there, though it was the slower of the ties at the scored shape
])
def test_a_tie_at_the_scored_shape_goes_to_the_kernel_faster_at_the_other_shapes(k2_other, k3_other, winner):
    """Kernels the showdown cannot tell apart at the scored shape can differ 2x at another optimisation shape (a
    row split over the threads or not): the one faster there outside the noise is the result; a kernel faster at
    the scored shape outside the noise still wins whatever the others."""
    st = _state()
    for pid, cid, scored, other in (("p1", "k1", 0.50, 0.20), ("p2", "k2", 0.51, k2_other),
                                    ("p3", "k3", 0.52, k3_other)):
        st.apply(_proposed(st, pid))
        _apply_all(st, _measured_at(pid, cid, scored, other))
    assert st.apply(_showdown("k1", {"k1": 0.500, "k2": 0.499, "k3": 0.502})) == ""   # all inside the noise
    assert st.best().candidate.id == winner
    summary = campaign_summary(st, load_problem("softmax"))["showdown"]
    assert (summary["winner"], summary["decided"]) == (winner, "stays" if winner == "k1" else "tied, faster elsewhere")
    line = showdown_line(summary)
    assert line.endswith("the search's best stays the result") if winner == "k1" else \
        line.endswith(f"{winner} is the result (the search's best was k1; tied at 4096x4096, it is faster at the other "
                      "optimisation shapes)")
    # outside the noise at the scored shape the fastest there wins, even where it is slower elsewhere
    assert st.apply(_showdown("k1", {"k1": 0.500, "k2": 0.480, "k3": 0.502}, key="again")) == ""
    assert st.showdown_decision(st.search_best()) == ("k2", "faster")


def test_a_kernel_a_showdown_finds_wrong_is_never_the_result():
    st = _state()
    for pid, cid, score in (("p1", "k1", 0.50), ("p2", "k2", 0.51), ("p3", "k3", 0.52)):
        st.apply(_proposed(st, pid))
        _apply_all(st, _measured(pid, cid, score))
    assert st.apply(_showdown("k1", {"k1": 0, "k2": 0}, error="WRONG_RESULT: the output after the timing is wrong",
                              failed="k2")) == ""
    assert st.best().candidate.id == "k1" and st.disqualified == {"k2"}
    assert [m.candidate.id for m in st.contenders(st.search_best(), 0.05, 5)] == ["k3"]
    summary = campaign_summary(st, load_problem("softmax"))
    assert summary["showdown"]["winner"] is None and summary["showdown"]["found_wrong"] == ["k2"]
    assert "found wrong, never the result: k2; the search's best stays" in showdown_line(summary["showdown"])
    # the search's best itself found wrong: the next best is the result
    assert st.apply(_showdown("k1", {"k1": 0, "k3": 0}, error="WRONG_RESULT: timed output wrong", failed="k1")) == ""
    assert st.search_best().candidate.id == "k3" == st.best().candidate.id

"""Memory answers with what the campaigns decided, not only with each kernel's own measurement (Archive.verdicts):
a kernel a showdown or a final comparison found wrong is never a problem's best, a prior or a lesson; without a
shape, a finished campaign's kernel counts only if the campaign finished with it (its showdown may have decided
for another than the fastest by its own score); the leaderboard marks the result and the kernels that are none."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kfactory.bus import events as ev
from kfactory.bus.origins import Origin
from kfactory.cli.client import entry_marks
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.lessons import lessons
from kfactory.services.memory.queries import Queries
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

sys.path.insert(0, str(Path(__file__).parent))
from evidence_chain import chain, links, measured, timing  # noqa: E402


def _cand(cid: str, campaign: str, v: int, origin: str = "template:cpu_c") -> pb.Candidate:
    return pb.Candidate(id=cid, campaign_id=campaign, point_id="p-" + cid, problem="softmax", target="cpu",
                        family="cpu_c", origin=origin, params_json=json.dumps({"v": v}))


def _start(campaign: str) -> pb.Event:
    return ev.make_event(campaign, "planner", "start", campaign_started=pb.CampaignStarted(
        spec=pb.CampaignSpec(problem="softmax", target="cpu")))


def _wrong(campaign: str, judged: str, failed: str, showdown: bool, reason: str = "WRONG_RESULT") -> pb.Event:
    """The benchmarker's comparison (a showdown of `judged`, or its final comparison) that `failed` failed."""
    comp = pb.Comparison(shape="4x4", candidate_id=judged, showdown=showdown, error=f"{reason}: row 3 differs",
                         failed_candidate=failed, failed_reason=reason)
    return ev.make_event(campaign, "benchmarker", f"{judged}:{failed}:{reason}", comparison=comp)


def _c1() -> list[pb.Event]:
    """Finished with k2: k1 (0.50) was the search's best, its showdown found k3 (0.40) wrong and decided for k2
    (0.52), faster in the interleaved timing; s1 was screened out (0.30, a screen's timing), ref is the reference."""
    out = [_start("c1")]
    for cid, v, score in (("k1", 1, 0.50), ("k2", 2, 0.52), ("k3", 3, 0.40)):
        out += chain("c1", _cand(cid, "c1", v), score)
    out += chain("c1", _cand("ref", "c1", 0, Origin.REFERENCE.of()), 0.80)
    out += links("c1", _cand("s1", "c1", 4))[:2] + [measured("c1", _cand("s1", "c1", 4), 0.30, screened_out=True)]
    out.append(_wrong("c1", "k1", "k3", showdown=True))
    out.append(ev.make_event("c1", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed", counts=pb.Counts(measured=5), best_candidate_id="k2")))
    return out


def _running() -> list[pb.Event]:
    """Two campaigns still running: c2 with k4 (0.45); c3 whose k5 (0.20) its final comparison found wrong."""
    return [_start("c2"), *chain("c2", _cand("k4", "c2", 5), 0.45),
            _start("c3"), *chain("c3", _cand("k5", "c3", 6), 0.20), _wrong("c3", "k5", "k5", showdown=False)]


@contextmanager
def _archive(tmp_path, events: list[pb.Event]) -> Iterator[Archive]:
    """An archive holding `events` (each one believed), closed after the block."""
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for e in events:
            assert archive.record(e), ev.kind_of(e)
        yield archive
    finally:
        archive.close()


def test_best_is_what_the_campaigns_decided_and_never_a_kernel_found_wrong(tmp_path):
    with _archive(tmp_path, _c1()) as archive:
        # the fastest by its own score (k3) was found wrong; of the rest, c1 finished with k2, not k1
        assert archive.best("softmax")[0].candidate.id == "k2"
        # at a shape: the fastest there as measured, a kernel found wrong excepted
        assert archive.best("softmax", shape="4x4")[0].candidate.id == "k1"
        for e in _running():
            assert archive.record(e)
        # a running campaign's kernels count as they stand (k4), but not one its final comparison found wrong (k5)
        assert archive.best("softmax")[0].candidate.id == "k4"
        assert archive.best("softmax", shape="4x4")[0].candidate.id == "k4"
        entry = Queries(archive).best(spb.BestRequest(problem="softmax"))
        assert (entry.candidate_id, entry.campaign_id) == ("k4", "c2")


def test_the_leaderboard_marks_the_result_and_the_kernels_that_are_none(tmp_path):
    with _archive(tmp_path, _c1()) as archive:
        board = Queries(archive).leaderboard(spb.LeaderboardRequest(campaign_id="c1")).entries
    marks = {e.candidate_id: (e.result, e.found_wrong, e.screened_out) for e in board}
    assert [e.candidate_id for e in board] == ["s1", "k3", "k1", "k2", "ref"]   # by each one's own score
    assert marks == {"s1": (False, False, True), "k3": (False, True, False), "k1": (False, False, False),
                     "k2": (True, False, False), "ref": (False, False, False)}
    text = {e.candidate_id: entry_marks(e) for e in board}
    assert text["k2"] == "  (the campaign's result)" and text["k1"] == ""
    assert "found wrong" in text["k3"] and "screened out" in text["s1"]


def test_a_kernel_found_wrong_is_no_prior_and_no_lesson(tmp_path):
    with _archive(tmp_path, _c1() + _running()) as archive:
        priors = archive.priors("softmax", every_source=True, limit=20)
        best_lesson = next(x for x in lessons(archive, "softmax") if x.kind == "best")
    points = {(p.campaign_id, json.loads(p.params_json)["v"]): round(p.relative, 4) for p in priors}
    # relative to each campaign's best kernel that is not wrong: k1 in c1; c3 has none left
    assert points == {("c1", 1): 1.0, ("c1", 2): 1.04, ("c2", 5): 1.0}
    # the fastest so far is k1 (0.50 s, 1.6x its reference), not k3 (0.40 s, wrong)
    assert best_lesson.value == 0.50 and '"v": 1' in best_lesson.text


def test_the_report_and_kfactory_runs_table_note_the_same(tmp_path):
    import io

    from rich.console import Console

    from kfactory.cli.run import leaderboard_table
    from kfactory.evidence import report

    events = _c1()
    board = report.markdown(events, noise_bound=0.03).split("## Leaderboard", 1)[1].split("##", 1)[0]
    rows = {line.split("|")[2].strip(" `"): line.split("|")[6].strip() for line in board.splitlines()
            if line.startswith("| ") and line[2].isdigit()}
    assert rows == {"s1": "screened out: too slow in a short timing, never measured in full",
                    "k3": "found wrong by a comparison: no result", "k1": "", "k2": "the campaign's result", "ref": ""}
    with _archive(tmp_path, events) as archive:
        measured = [m for m, _ in archive.leaderboard("c1")]
        out = io.StringIO()
        Console(file=out, width=250).print(leaderboard_table({"campaign_id": "c1"}, measured, archive.verdicts(["c1"])))
    lines = {line.split("│")[2].strip(): line for line in out.getvalue().splitlines() if line.count("│") > 7}
    assert "the campaign's result" in lines["k2"] and "found wrong" in lines["k3"] and "screened out" in lines["s1"]
    assert "result" not in lines["k1"] and "wrong" not in lines["k1"]


def test_a_comparison_says_nothing_against_a_kernel_it_did_not_find_wrong(tmp_path):
    """Only wrongness counts, and in a final comparison only the compared kernel's own: the reference kernel
    failing there (its id is the same in every campaign of the problem), or a timeout or a crash that may be the
    host's, leave every kernel as it was. A showdown's crash (k4's, here) takes it out of that campaign's result
    only (the planner's CampaignState.disqualified), not out of memory's answers or export."""
    k4 = _cand("k4", "c1", 7)
    events = _c1()[:-1] + [*chain("c1", k4, 0.60), _wrong("c1", "k2", "ref", showdown=False),
                           _wrong("c1", "k2", "k2", False, "TIMEOUT"), _wrong("c1", "k2", "k2", False, "CRASHED"),
                           _wrong("c1", "k1", "k4", True, "CRASHED"), _c1()[-1]]
    with _archive(tmp_path, events) as archive:
        assert set(archive.verdicts(["c1"]).wrong) == {"k3"}
        assert archive.best("softmax")[0].candidate.id == "k2"
        board = Queries(archive).leaderboard(spb.LeaderboardRequest(campaign_id="c1")).entries
        assert [e.candidate_id for e in board if e.found_wrong] == ["k3"]


def test_a_kernel_found_wrong_on_one_device_is_no_best_on_another(tmp_path):
    """`kfactory best P --device X` asks for X's measurements; a kernel found wrong in any campaign stays out."""
    again = _start("c4")
    k3 = _cand("k3", "c4", 3)
    events = _c1() + [again, *links("c4", k3), measured("c4", k3, 0.40, device=pb.DeviceInfo(model="other cpu"))]
    with _archive(tmp_path, events) as archive:
        assert archive.best("softmax", device="other") is None
        assert archive.best("softmax", shape="4x4", device="other") is None


def test_the_reports_best_section_shows_the_results_own_comparison(tmp_path):
    """A result found wrong in its final comparison, then the next best's: the report shows the next best's
    figures, and names the one found wrong."""
    from kfactory.evidence import report

    first = _wrong("c1", "k1", "k1", showdown=False)
    first.comparison.speedups["reference"] = 1.5   # timings taken before the failure
    held = pb.Comparison(shape="4x4", candidate_id="k2", speedups={"reference": 1.6})
    held.entries.append(pb.ComparisonEntry(name="reference", candidate_id="ref", timing=timing(0.83)))
    summary = {"best": {"candidate_id": "k2", "origin": "template:cpu_c", "compile_flags": "", "params": {"v": 2}}}
    fin = ev.make_event("c1", "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed", best_candidate_id="k2", summary_json=json.dumps(summary)))
    md = report.markdown(_c1()[:-1] + [first, ev.make_event("c1", "benchmarker", "k2:4x4", comparison=held), fin],
                         noise_bound=0.03)
    section = md.split("## Interleaved comparison", 1)[1].split("## Verification", 1)[0]
    assert section.count("### 4x4") == 1 and "| reference | 830 ms" in section
    assert "Found wrong in its final comparison before this one became the result (no result): `k1`: WRONG_RESULT" \
        in section and "Not measured" not in section


def test_a_kernel_found_wrong_is_not_exported_even_by_its_id(tmp_path):
    """A comparison is archived under no candidate: the candidate's evidence brings the showdown's both to the
    kernel it was timed for (k1) and to the one it found wrong (k3); export refuses k3."""
    from kfactory.export.errors import ExportError
    from kfactory.export.evidence import judged

    with _archive(tmp_path, _c1()) as archive:
        queries = Queries(archive)
        k3 = queries.candidate(spb.CandidateRequest(id="k3"))
        k1 = queries.candidate(spb.CandidateRequest(id="k1"))
    assert [ev.kind_of(e) for e in k3.events][-1] == "comparison"
    with pytest.raises(ExportError, match="k3 was found wrong by a showdown at 4x4 in campaign c1 .WRONG_RESULT"):
        judged(k3)
    assert [e.comparison.failed_candidate for e in k1.events if e.HasField("comparison")] == ["k3"]


def test_an_export_quotes_the_final_comparisons_on_its_measurements_device_and_refuses_one_found_wrong():
    from kfactory.export.errors import ExportError
    from kfactory.export.evidence import Judged, judged, measurement_summary

    cand = _cand("k2", "c1", 2)
    m = measured("c1", cand, 0.52, device=pb.DeviceInfo(model="this cpu")).measured
    here = [pb.Comparison(shape="4x4", candidate_id="k2", device=pb.DeviceInfo(model="this cpu"),
                          speedups={"reference": r, "candidate": 1.0}) for r in (1.5, 1.6)]   # in two campaigns here
    there = pb.Comparison(shape="4x4", candidate_id="k2", device=pb.DeviceInfo(model="other cpu"),
                          speedups={"reference": 9.9})
    lines = measurement_summary(Judged(cand, "", [], measured=[m], comparisons=[here[0], there, here[1]]))
    assert [x for x in lines if "speedup" in x] == ["  speedup at 4x4: 1.60x reference (interleaved)"]
    # its final comparison found it wrong: refused by its id, naming the campaign
    evidence = spb.CandidateEvidence(candidate=cand, events=[*chain("c1", cand, 0.52),
                                                             _wrong("c1", "k2", "k2", showdown=False)])
    with pytest.raises(ExportError, match="k2 was found wrong by its final comparison at 4x4 in campaign c1"):
        judged(evidence)


def test_the_verdicts_query_reads_its_partial_index(tmp_path):
    from kfactory.services.memory import archive as archive_mod

    with _archive(tmp_path, _c1()) as archive:
        plan = " ".join(str(r) for r in archive.q("EXPLAIN QUERY PLAN " + archive_mod.DECISIONS, ("c1",)))
        others = " ".join(str(r) for r in archive.q("EXPLAIN QUERY PLAN SELECT payload FROM events WHERE campaign=? "
                                                    "ORDER BY seq", ("c1",)))
        problem = " ".join(str(r) for r in archive.q("EXPLAIN QUERY PLAN " + archive_mod.PROBLEM_COMPARISONS,
                                                     ("comparison", "softmax")))
    assert "USING INDEX events_verdicts" in plan
    assert "events_verdicts" not in others   # a campaign's whole history still reads events_campaign
    # a problem's comparisons: its campaigns from the measurements' index, then each one's from the partial index
    assert "USING INDEX events_verdicts" in problem and "INDEX measurements_problem" in problem


def test_a_running_campaigns_status_names_no_kernel_found_wrong_or_screened_out_as_its_best(tmp_path):
    s1 = _cand("s2", "c3", 8)
    events = _running() + links("c3", s1)[:2] + [measured("c3", s1, 0.10, screened_out=True)]
    with _archive(tmp_path, events) as archive:
        queries = Queries(archive)
        c3 = queries.status(spb.GetCampaignRequest(id="c3"))
        c2 = queries.status(spb.GetCampaignRequest(id="c2"))
    # c3's fastest timings are a screen's (0.10) and a kernel its final comparison found wrong (0.20): no best
    assert (c3.best_candidate_id, c3.best_score_s) == ("", 0.0)
    assert (c2.best_candidate_id, c2.best_score_s) == ("k4", 0.45)

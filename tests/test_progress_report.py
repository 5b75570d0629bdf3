"""What a person sees of a campaign (issue 21, deliverable 5) and of a kfactory bug (deliverable 3's last part):
progress with n/budget, the best so far and its speedup, the time left and the final comparison; parameters as
`key=value`; a report titled by the problem's name, warning of noisy timings, with one plot per optimisation
shape of every candidate (failures by reason) beside the best so far; and an unexpected exception reported as
kfactory's bug, with a log file holding its traceback and exit status 70.

The report and the progress are built from event lists made here, as the services would publish them, and from
the planner's own fold over them: no campaign runs."""
from __future__ import annotations

import io
import json
import shutil
import struct
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from kfactory.cli import main as cli
from kfactory.evidence import plots
from kfactory.cli import progress
from kfactory.evidence import report
from kfactory.bus import events as ev
from kfactory.cli.crash import EXIT_BUG, redacted, report_unexpected
from kfactory.problems import BUILTIN_DIR, load_problem
from kfactory.services.memory.archive import Archive
from kfactory.services.planner.campaign import CampaignState
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
import evidence_chain  # noqa: E402

CID = "cprogress1"
SHAPES = ("64x128", "1x1000")
PARAMS = '{"block":256,"exp":"poly","unroll":4}'


# -- events as the services publish them -----------------------------------------------------------------------
def _cand(cid: str, origin: str = "template:cpu_c", params: str = PARAMS, problem: str = "softmax") -> pb.Candidate:
    return pb.Candidate(id=cid, campaign_id=CID, problem=problem, target="cpu", family="cpu_c", point_id=f"p-{cid}",
                        params_json=params, origin=origin, compile_flags="-O3 -fopenmp")


def _timing(shape: str, median: float, noise: float) -> pb.ShapeTiming:
    """A timing whose relative IQR is `noise`."""
    return pb.ShapeTiming(shape=shape, median_s=median, q1_s=median * (1 - noise / 2), q3_s=median * (1 + noise / 2),
                          samples=20, noise=noise, ci_low_s=median * 0.99, ci_high_s=median * 1.01)


def _measured(cand: pb.Candidate, medians: tuple[float, ...], noise: float = 0.01, **fields) -> list[pb.Event]:
    timings = [_timing(s, m, noise) for s, m in zip(SHAPES, medians)]
    return evidence_chain.links(CID, cand) + [ev.make_event(CID, "benchmarker", cand.id, measured=pb.Measured(
        candidate=cand, timings=timings, score_s=medians[0], device=pb.DeviceInfo(target="cpu"), **fields))]


def _rejected(cand: pb.Candidate, reason: pb.RejectReason) -> list[pb.Event]:
    return evidence_chain.links(CID, cand)[:2] + [ev.make_event(CID, "verifier", cand.id, rejected=pb.Rejected(
        candidate=cand, stage="verifier", reason=reason, message="planted"))]


def _compile_failed(cand: pb.Candidate) -> list[pb.Event]:
    return [ev.make_event(CID, "coder", cand.id, candidate_created=pb.CandidateCreated(candidate=cand)),
            ev.make_event(CID, "compiler", cand.id, compile_failed=pb.CompileFailed(
                candidate=cand, reason=pb.COMPILE_ERROR, message="error: planted"))]


def _campaign(problem: str = "softmax", noisy: float = 0.01) -> list[pb.Event]:
    """A finished campaign: the reference kernel, then six candidates in this order: k1 measured, k2 wrong,
    k3 does not compile, k4 measured (the best; its timing at the first shape has relative IQR `noisy`), k5
    timed out, k6 screened out after a short timing at the first shape only; then the final comparison."""
    spec = pb.CampaignSpec(problem=problem, target="cpu", budget_candidates=6, strategy="random", threads=2)
    events = [ev.make_event(CID, "planner", "start", campaign_started=pb.CampaignStarted(
        spec=spec, device=pb.DeviceInfo(model="test cpu", target="cpu")))]
    events += _measured(_cand("ref0", "reference", "{}", problem), (0.8e-3, 0.08e-3))
    events += _measured(_cand("k1", problem=problem), (0.5e-3, 0.05e-3))
    events += _rejected(_cand("k2", problem=problem), pb.WRONG_RESULT)
    events += _compile_failed(_cand("k3", problem=problem))
    k4 = _cand("k4", params='{"block":128,"exp":"poly","unroll":8}', problem=problem)
    events += _measured(k4, (0.2e-3, 0.04e-3))
    events[-1].measured.timings[0].CopyFrom(_timing(SHAPES[0], 0.2e-3, noisy))
    events += _rejected(_cand("k5", problem=problem), pb.TIMEOUT)
    k6 = _cand("k6", problem=problem)
    events += evidence_chain.links(CID, k6) + [ev.make_event(CID, "benchmarker", "k6", measured=pb.Measured(
        candidate=k6, timings=[_timing(SHAPES[0], 0.9e-3, 0.3)], score_s=0.9e-3, screened_out=True))]
    for shape, (c, r) in zip(SHAPES, ((0.2e-3, 0.8e-3), (0.04e-3, 0.08e-3))):
        events.append(ev.make_event(CID, "benchmarker", f"cmp-{shape}", comparison=pb.Comparison(
            shape=shape, candidate_id="k4", speedups={"reference": r / c, "candidate": 1.0},
            entries=[pb.ComparisonEntry(name="candidate", candidate_id="k4", timing=_timing(shape, c, 0.01)),
                     pb.ComparisonEntry(name="reference", candidate_id="ref0", timing=_timing(shape, r, 0.01))])))
    summary = {"counts": {"proposed": 6, "measured": 3}, "best": {
        "candidate_id": "k4", "origin": "template:cpu_c", "compile_flags": "-O3 -fopenmp",
        "params": json.loads(k4.params_json)}}
    events.append(ev.make_event(CID, "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed", best_candidate_id="k4", summary_json=json.dumps(summary))))
    return events


def _png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


# -- progress --------------------------------------------------------------------------------------------------
def test_time_left_is_estimated_from_the_rate_so_far():
    assert progress.eta_seconds(10, 40, 50.0) == pytest.approx(150.0)  # 10 in 50 s: 30 more take 150 s
    assert progress.eta_seconds(10, 40, 50.0, budget_s=80.0) == pytest.approx(30.0)  # the time budget ends it first
    assert progress.eta_seconds(0, 40, 5.0) is None  # no outcome yet: no rate
    assert progress.eta_seconds(0, 40, 5.0, budget_s=60.0) == pytest.approx(55.0)
    assert progress.eta_seconds(40, 40, 90.0) == 0.0
    assert [progress.duration(s) for s in (45, 150, 3720)] == ["45s", "2m30s", "1h02m"]
    assert progress.eta_text(progress.Snapshot(done=0, budget=40, elapsed_s=3.0)) == "time left: estimating"
    assert progress.eta_text(progress.Snapshot(done=10, budget=40, elapsed_s=50.0)) == \
        "about 2m30s left, then the final comparison"


def _state(budget: int = 3) -> CampaignState:
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=budget, strategy="random", seed=1)
    return CampaignState(CID, spec, pb.DeviceInfo(), Space(list(load_problem("softmax").families.values())))


def _fold(st: CampaignState, events: list[pb.Event]) -> None:
    for e in events:
        assert st.apply(e) == "", e


def _searched(st: CampaignState, pid: str, cid: str, score: float, **measured) -> None:
    """The strategy's next point proposed as `pid`, and its kernel `cid` measured at `score` s in full."""
    point = st.strategy.ask()
    _fold(st, [ev.make_event(CID, "planner", pid, point_proposed=pb.PointProposed(
        point_id=pid, family=point.family, params_json=point.params_json, origin=f"template:{point.family}"))])
    cand = pb.Candidate(id=cid, point_id=pid, origin="template:cpu_c", params_json=PARAMS)
    _fold(st, evidence_chain.chain(CID, cand, score, **measured))


def test_progress_shows_n_of_budget_the_best_its_speedup_and_the_final_comparison():
    st = _state()
    st.started_wall = time.time() - 20.0  # two outcomes in 20 s: the third takes about 10 s more
    for pid, cid, score in (("p1", "k1", 0.5e-3), ("p2", "k2", 0.2e-3)):
        _searched(st, pid, cid, score)
    _fold(st, evidence_chain.chain(CID, pb.Candidate(id="ref0", point_id="r", origin="reference"), 0.8e-3))

    snap = progress.snapshot(st, shapes=2)
    assert (snap.done, snap.budget, snap.best_id) == (2, 3, "k2")  # the reference does not count against the budget
    assert progress.speedup(snap) == pytest.approx(4.0)
    counts, _ = st.reported()
    text = progress.line(snap, counts)
    assert " 2/3 proposed 2 " in text and " verified 3 " in text, text
    assert text.endswith("; best 0.200 ms (4.00x the reference); about 10s left, then the final comparison"), text

    # the planner's request for the final comparison, folded as the planner folds it: progress says so
    req = pb.CompareRequest(candidate=st.measured["k2"].candidate, reference=st.candidates["ref0"])
    _fold(st, [ev.make_event(CID, "planner", "compare:k2", compare_request=req)])
    says = "final comparison: timing k2 against the reference kernel and baselines, interleaved"
    assert progress.eta_text(progress.snapshot(st, 2)) == f"{says} (0/2 shapes)"
    _fold(st, [ev.make_event(CID, "benchmarker", "cmp", comparison=pb.Comparison(shape=SHAPES[0], candidate_id="k2"))])
    assert progress.eta_text(progress.snapshot(st, 2)) == f"{says} (1/2 shapes)"

    out = io.StringIO()
    Console(file=out, width=220).print(progress.table("campaign", progress.snapshot(st, 2), counts, st.in_flight()))
    assert "2/3" in out.getvalue() and "4.00x" in out.getvalue() and f"{says} (1/2" in out.getvalue(), out.getvalue()


def test_under_a_device_budget_time_left_is_when_the_searchs_share_is_spent():
    """`kfactory run --device-seconds 20` whose search leaves 5 s for the comparisons: 9 s of device time held in
    20 s (two candidates at 2 s, the reference kernel's 5 s) leave 6 s of the search's 15 s: 30 s at the rate the
    searched candidates held it (the reference kernel's cost is none of theirs), long before 38 more candidates;
    once the share is spent, progress says the comparisons are next."""
    st = _state(budget=40)
    _fold(st, [ev.make_event(CID, "planner", "start", campaign_started=pb.CampaignStarted(
        spec=st.spec, compare_reserve_s=5.0))])
    _fold(st, evidence_chain.chain(CID, pb.Candidate(id="ref0", point_id="r", origin="reference"), 0.8e-3,
                                   seconds=5.0))
    st.started_wall = time.time() - 20.0
    assert progress.eta_text(progress.snapshot(st, 2, 20.0)) == "time left: estimating (device 5.0 of 15.0 s)"
    for pid, cid in (("p1", "k1"), ("p2", "k2")):
        _searched(st, pid, cid, 0.5e-3, seconds=2.0)
    st.started_wall = time.time() - 20.0
    snap = progress.snapshot(st, shapes=2, device_budget_s=20.0)
    assert (snap.device_s, snap.device_share_s, snap.searched_s) == (9.0, 15.0, 4.0)
    assert progress.eta_seconds(2, 40, 20.0, 0.0, 9.0, 15.0, 4.0) == pytest.approx(30.0)
    assert progress.eta_text(snap) == "about 30s left (device 9.0 of 15.0 s), then the final comparison"
    assert progress.snapshot(st, shapes=2).device_share_s == 0.0   # no device budget: no device figure
    _searched(st, "p3", "k3", 0.5e-3, seconds=7.0)
    assert progress.eta_text(progress.snapshot(st, 2, 20.0)) == ("the search's device time is spent (device 16.0 "
                                                                 "of 15.0 s); what is in flight ends, the final "
                                                                 "comparison is next")


def test_the_run_says_what_device_time_the_campaign_held_and_kept_for_its_comparisons():
    from kfactory.cli.run import device_line

    summary = {"device_seconds": 58.25, "device_seconds_comparisons": 14.0, "device_seconds_per_candidate": 1.475}
    assert device_line(summary) == ("device time 58.2 s: 44.2 s the candidates' (1.475 s each), 14.0 s the "
                                    "showdown and final comparison")
    budgeted = summary | {"device_seconds_budget": 60.0, "device_seconds_reserve": 15.0,
                          "device_seconds_reserve_campaigns": 0}
    assert device_line(budgeted).endswith("; budget 60 s, of which 15.0 s kept for the comparisons (a share of "
                                          "the budget)")
    budgeted |= {"device_seconds_reserve": 13.5, "device_seconds_reserve_campaigns": 1}
    assert device_line(budgeted).endswith("of which 13.5 s kept for the comparisons (from 1 earlier campaign)")
    budgeted |= {"device_seconds_reserve_campaigns": 3}
    assert device_line(budgeted).endswith("(from 3 earlier campaigns)")
    assert device_line({}) == ""
    engine = {"device_seconds": 3.0, "device_seconds_budget": 5.0, "device_seconds_reserve": 0.0}
    assert device_line(engine) == "device time 3.0 s: 3.0 s the candidates', no comparison; budget 5 s, none of it " \
        "kept for comparisons"


# -- parameters as key=value -----------------------------------------------------------------------------------
def test_parameters_print_as_compact_key_value():
    assert report.format_params(PARAMS) == "block=256 exp=poly unroll=4"
    assert report.format_params('{"tile":[16,32],"fast":true,"note":"a b","x":1.5,"e":""}') == \
        'tile=[16,32] fast=true note="a b" x=1.5 e=""'
    assert report.format_params("{}") == report.format_params("") == "-"
    assert report.format_params({"vec": 8}) == "vec=8"

    from kfactory.cli.run import leaderboard_table

    rows = [e.measured for e in _campaign() if e.HasField("measured") and not e.measured.screened_out]
    out = io.StringIO()
    Console(file=out, width=220).print(leaderboard_table({}, rows))
    assert "block=128 exp=poly unroll=8" in out.getvalue() and '{"' not in out.getvalue(), out.getvalue()

    md = report.markdown(_campaign(), noise_bound=0.03)
    board = md.split("## Leaderboard", 1)[1].split("##", 1)[0]
    assert "| 1 | `ref0` |" not in board and "| `block=128 exp=poly unroll=8` | -O3 -fopenmp |" in board, board
    assert "parameters: `block=128 exp=poly unroll=8`" in md and '{"' not in md


def local_workspace(tmp_path: Path, monkeypatch) -> Path:
    """A workspace whose archive holds _campaign(), named by KFACTORY_DATA_DIR, with no factory configured: the
    query commands answer from it."""
    data = tmp_path / "data"
    archive = Archive(data / "archive.sqlite")
    for e in _campaign():
        archive.record(e)
    archive.close()
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    for name in ("KFACTORY_MEMORY_ADDR", "KFACTORY_PLANNER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    return data


def test_best_prints_parameters_as_key_value(tmp_path, monkeypatch, capsys):
    local_workspace(tmp_path, monkeypatch)
    assert cli.main(["best", "--campaign", CID[:5]]) == 0
    board = capsys.readouterr().out
    assert "k4" in board and "block=128 exp=poly unroll=8" in board and '{"' not in board, board
    assert cli.main(["best", "softmax"]) == 0
    best = capsys.readouterr().out
    assert best.startswith("k4 0.200 ms") and "(template:cpu_c block=128 exp=poly unroll=8; campaign" in best, best


def test_a_damaged_archive_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    """A file that is no archive, and an archive whose stored event no longer decodes: every local query
    (best here, export alike) says which file in one line and exits 1, instead of an internal error."""
    data = local_workspace(tmp_path, monkeypatch)
    import sqlite3
    db = sqlite3.connect(data / "archive.sqlite")
    db.execute("UPDATE events SET payload = X'0a05ffffffff' WHERE campaign = ?", (CID,))
    db.commit()
    db.close()
    assert cli.main(["report", CID[:5], "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read the archive" in err and "DecodeError" in err, err
    (data / "archive.sqlite").write_bytes(b"junk" * 100)
    for name in ("archive.sqlite-wal", "archive.sqlite-shm"):
        (data / name).unlink(missing_ok=True)
    assert cli.main(["best", "softmax"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read the archive" in err and "DatabaseError" in err, err


# -- the report ------------------------------------------------------------------------------------------------
def test_the_report_is_titled_by_the_problems_name(tmp_path):
    pkg = tmp_path / "pkgs" / "a_copy"
    shutil.copytree(BUILTIN_DIR / "softmax", pkg)
    spec = pkg / "problem.yaml"
    spec.write_text(spec.read_text().replace("name: softmax", "name: my_softmax", 1))
    md = report.markdown(_campaign(problem=str(pkg)), noise_bound=0.03)
    assert md.splitlines()[0] == f"# Campaign {CID}: my_softmax on cpu", md[:300]
    assert f"- problem: my_softmax, from `{pkg}`" in md
    gone = str(tmp_path / "deleted_since")  # a package removed since: its locator is all there is
    assert report.markdown(_campaign(problem=gone), noise_bound=0.03).startswith(f"# Campaign {CID}: {gone} on cpu")


def test_the_report_warns_of_a_timing_noisier_than_the_bound(monkeypatch):
    md = report.markdown(_campaign(noisy=0.12), noise_bound=0.03)
    warning = [line for line in md.splitlines() if "noisy measurements" in line]
    # 8 timings looked at: the reference's, k1's and k4's two shapes each, and the comparison's two per shape;
    # not k6's screening timing (noisy, but short by design)
    assert len(warning) == 1 and "1 of 10 timings had a relative IQR over the noise bound of 3%" in warning[0] \
        and "the noisiest: 12% (candidate k4 at 64x128)." in warning[0] \
        and "Busy host: rerun on an idle machine" in warning[0], warning
    quiet = report.markdown(_campaign(noisy=0.02), noise_bound=0.03)
    assert "noisy" not in quiet.lower() and "Busy host" not in quiet
    # without a bound given, the benchmarker's own (KFACTORY_MEASURE_NOISE) is the one
    monkeypatch.setenv("KFACTORY_MEASURE_NOISE", "0.2")
    assert "Busy host" not in report.markdown(_campaign(noisy=0.12))
    monkeypatch.setenv("KFACTORY_MEASURE_NOISE", "0.05")
    assert "noise bound of 5%" in report.markdown(_campaign(noisy=0.12))


def test_the_report_plots_every_candidate_per_optimisation_shape_beside_the_best_so_far():
    events = _campaign()
    panels = plots.panels(events)
    assert [p.shape for p in panels] == list(SHAPES)
    first, second = panels
    # x: the order results came, the reference kernel not counted (it is the dashed line)
    assert first.times == [(1, 0.5e-3), (4, 0.2e-3)] and first.screened == [(6, 0.9e-3)]
    assert second.times == [(1, 0.05e-3), (4, 0.04e-3)] and second.screened == []
    for p in panels:  # failures have no time at any shape: every plot marks them, by reason
        assert p.failures == {"WRONG_RESULT": [2], "COMPILE_ERROR": [3], "TIMEOUT": [5]}
    # the best so far after each result, failures included, to the last
    assert first.best == [(1, 0.5e-3), (2, 0.5e-3), (3, 0.5e-3), (4, 0.2e-3), (5, 0.2e-3), (6, 0.2e-3)]
    assert [s for _, s in second.best][-1] == 0.04e-3
    assert (first.reference_s, second.reference_s) == (0.8e-3, 0.08e-3)

    # one plot per shape, stacked in the one PNG a report carries: 3.4 in (340 px) of height each
    md, png = report.build(events, noise_bound=0.03)
    assert _png_size(png) == (1000, 730) and _png_size(plots.render(panels[:1], "one")) == (1000, 390)
    assert "One plot per optimisation shape (64x128, 1x1000)" in md and "![every candidate" in md
    # a campaign where nothing was timed still plots its failures
    (only,) = plots.panels([e for e in events if not e.HasField("measured")])
    assert only.shape == "" and only.times == [] and only.best == [] and only.failures["TIMEOUT"] == [3]


def test_the_reports_tables_have_one_separator_per_cell_and_its_budget_says_each_limit():
    """A campaign where nothing was measured had a leaderboard header of 7 cells over 6 separators (no shape to
    name), and its budget read "10 candidates, no s"."""
    def tables(md: str) -> list[tuple[int, int, set[int]]]:
        """(header cells, separators, the cell counts of its rows) of each table."""
        lines, found = md.splitlines(), []
        for i, line in enumerate(lines[:-1]):
            if line.startswith("| ") and lines[i + 1].startswith("|---"):
                rows = [r for r in lines[i + 2:] if r.startswith("|")]
                rows = rows[:next((k for k, r in enumerate(lines[i + 2:]) if not r.startswith("|")), len(rows))]
                found.append((line.count("|") - 1, lines[i + 1].count("---"),
                              {r.replace("\\|", "").count("|") - 1 for r in rows}))
        return found

    full = report.markdown(_campaign())
    assert tables(full) and all(cells == seps and rows <= {cells} for cells, seps, rows in tables(full)), tables(full)
    untimed = _campaign()   # measured, no timing to name a shape by (no column of shapes)
    for e in untimed:
        if e.HasField("measured"):
            del e.measured.timings[:]
    assert all(cells == seps and rows <= {cells} for cells, seps, rows in tables(report.markdown(untimed)))
    assert "- strategy: random; budget: 6 candidates; threads: 2" in full
    nothing = report.markdown([e for e in _campaign() if not e.HasField("measured")])
    assert "## Leaderboard\n\nNothing was measured.\n" in nothing
    assert all(cells == seps and rows <= {cells} for cells, seps, rows in tables(nothing)), tables(nothing)
    start = _campaign()[0]
    start.campaign_started.spec.budget_seconds, start.campaign_started.spec.budget_device_seconds = 90, 12.5
    assert "budget: 6 candidates, 90 s, 12.5 device s;" in report.markdown([start])
    start.campaign_started.spec.budget_candidates, start.campaign_started.spec.budget_seconds = 0, 2592000
    assert "budget: 2592000 s, 12.5 device s;" in report.markdown([start])


# -- a kfactory bug --------------------------------------------------------------------------------------------
def test_an_unexpected_exception_is_reported_as_kfactorys_bug_with_its_log(tmp_path, monkeypatch, capsys):
    """A fault planted in `kfactory run` after its checks pass (starting the services raises): one line naming
    it as kfactory's bug, the exception, and a log file under KFACTORY_DATA_DIR/logs with the traceback; exit 70."""
    import kfactory.cli.run

    data = tmp_path / "data"
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    monkeypatch.setenv("KFACTORY_REPORT_DIR", str(tmp_path / "reports"))

    async def planted(*args, **kwargs):
        raise RuntimeError("planted fault\nsecond line")

    monkeypatch.setattr(kfactory.cli.run, "start_services", planted)
    code = cli.main(["run", "softmax", "--budget", "2", "--quiet", "--llm-api-key", "sk-secret"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BUG == 70
    assert len(err) == 1 and err[0].startswith("kfactory run: internal error (a bug in kfactory, not in your "
                                               "input): RuntimeError: planted fault second line; the full "
                                               "traceback is in "), err
    log = Path(err[0].split("the full traceback is in ")[1].split(";")[0])
    assert log.parent == data / "logs" and log.name.startswith("bug-"), log
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "in run_campaign" in text and "in planted" in text
    assert "RuntimeError: planted fault" in text and "command: kfactory run softmax --budget 2" in text
    assert "sk-secret" not in text and "--llm-api-key ***" in text
    assert redacted(["--llm-api-key=x", "--budget", "3"]) == ["--llm-api-key=***", "--budget", "3"]
    # a reader that went away (`kfactory best | head -1`) is no bug: a quiet end, as SIGPIPE would be
    assert report_unexpected(BrokenPipeError(32, "Broken pipe"), ["best"], "best") == 141
    assert capsys.readouterr().err == "" and len(list((data / "logs").iterdir())) == 1


def test_a_file_that_cannot_be_written_is_not_called_a_bug(tmp_path, monkeypatch, capsys):
    local_workspace(tmp_path, monkeypatch)
    (tmp_path / "a_file").write_text("")
    code = cli.main(["report", CID, "--out", str(tmp_path / "a_file" / "sub")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "internal error" not in err[0], err
    assert err[0].startswith(f"kfactory report: cannot use {tmp_path / 'a_file' / 'sub'}: ") \
        and ": Not a directory; details in " in err[0], err
    log = Path(err[0].split("; details in ")[1])
    assert log.parent == tmp_path / "data" / "logs" and log.name.startswith("error-"), log
    assert "NotADirectoryError" in log.read_text()

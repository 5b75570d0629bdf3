"""Evidence that travels (issue 24, deliverable 2): a campaign's evidence exported from one workspace and imported
into an empty one answers `kfactory priors softmax` and `kfactory lessons softmax --target cpu` as the source does,
also after the problem package it ran from is gone; a second import changes nothing; a conflicting id is refused
with the reason; regression inputs travel; a memory service imports and exports the same bundle (the Evidence
service's ImportBundle and ExportBundle) and answers Best by target and Report with the campaign's id."""
from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import grpc
import pytest

from kfactory.bus import events as ev
from kfactory.evidence import bundle as eb
from kfactory.platform.app import start_services
from kfactory.cli.main import main
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import Queries, problem_name
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from kfactory.evidence.workspace import Workspace

from evidence_chain import links  # tests/ is on the path (pytest inserts a test file's directory)
from tiny_campaign import run_campaign, tiny_package

SERVICE_ADDRS = ("KFACTORY_MEMORY_ADDR", "KFACTORY_PLANNER_ADDR")


@pytest.fixture(scope="module")
def source(tmp_path_factory, host_ceilings) -> dict:
    """A real softmax campaign on the cpu target (budget 2, tiny shapes, so it takes seconds) run from a package
    copied under a temporary directory: its workspace, the package's path, and the campaign's id."""
    root = tmp_path_factory.mktemp("evidence-source")
    return run_campaign(root, tiny_package(root / "softmax_tiny"), host_ceilings)


def _cli(monkeypatch, capsys, data: Path, *argv: str, memory: str = "") -> tuple[int, str, str]:
    """`kfactory ARGV` in this process, on the workspace `data` (or the memory service at `memory`)."""
    for name in SERVICE_ADDRS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    if memory:
        monkeypatch.setenv("KFACTORY_MEMORY_ADDR", memory)
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0, (rc, out, err)
    return out


def _snapshot(data: Path) -> dict:
    """Every row of every table of a workspace's archive, and its object store's names."""
    db = sqlite3.connect(data / "archive.sqlite")
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master "
                                       "WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    rows = {t: sorted(map(repr, db.execute(f"SELECT * FROM {t}"))) for t in tables}
    db.close()
    return {**rows, "objects": sorted(p.name for p in (data / "objects").iterdir())}


def test_imported_evidence_answers_priors_and_lessons_as_the_source_and_a_second_import_changes_nothing(
        source, tmp_path, monkeypatch, capsys):
    src = source["data"]
    asks = {"priors": ("priors", "softmax", "--json"), "lessons": ("lessons", "softmax", "--target", "cpu", "--json"),
            "best": ("best", "softmax", "--target", "cpu", "--json")}
    before = {k: json.loads(_ok(_cli(monkeypatch, capsys, src, *a))) for k, a in asks.items()}
    assert len(before["priors"]["priors"]) == 2 and before["lessons"]["text"].startswith("- best: fastest so far")
    bundle = tmp_path / "softmax.json.gz"
    out = _ok(_cli(monkeypatch, capsys, src, "evidence", "export", "--problem", "softmax", "--target", "cpu",
                   "--out", str(bundle)))
    assert out.startswith(f"{bundle}: 1 campaigns, ") and bundle.read_bytes()[:2] == b"\x1f\x8b"

    gone = source["pkg"].with_name("moved-away")  # the package the campaign ran from is not on the other machine
    source["pkg"].rename(gone)
    try:
        dst = tmp_path / "empty"
        out = _ok(_cli(monkeypatch, capsys, dst, "evidence", "import", str(bundle)))
        events = sum(1 for _ in Archive.reader(src / "archive.sqlite").events(campaign=source["campaign"]))
        assert f"1 campaigns: {events} events added, 0 already here; 3 sources added" in out, out
        after = {k: json.loads(_ok(_cli(monkeypatch, capsys, dst, *a))) for k, a in asks.items()}
        assert after == before
        first = _snapshot(dst)
        out = _ok(_cli(monkeypatch, capsys, dst, "evidence", "import", str(bundle)))
        assert f"0 events added, {events} already here; 0 sources added; 0 regression inputs added" in out, out
        assert _snapshot(dst) == first
        # and what the importer exports is the bundle it imported, byte for byte
        again = tmp_path / "again.json.gz"
        _ok(_cli(monkeypatch, capsys, dst, "evidence", "export", "--problem", "softmax", "--target", "cpu",
                 "--out", str(again)))
        assert again.read_bytes() == bundle.read_bytes()
        # the winner's source came along: `best --candidate` shows it with no service and no package here
        shown = json.loads(_ok(_cli(monkeypatch, capsys, dst, "best", "--candidate",
                                    before["best"]["candidate_id"][:12], "--json")))
        assert "kernel" in shown["source"]
    finally:
        gone.rename(source["pkg"])


def _spec() -> pb.CampaignSpec:
    return pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=2)


def _start(cid: str, spec: pb.CampaignSpec | None = None) -> pb.Event:
    return ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec or _spec()))


def _wrong(cid: str, cand: pb.Candidate) -> list[pb.Event]:
    """A kernel that passed elsewhere, found wrong here on a seeded input: a regression input."""
    check = pb.Check(shape="3x17", distribution="normal", seed=4242, max_abs_err=1.0, passed=False)
    return [ev.make_event(cid, "coder", cand.id, candidate_created=pb.CandidateCreated(candidate=cand)),
            ev.make_event(cid, "compiler", cand.id, compiled=pb.Compiled(candidate=cand, artifact_digest="a" * 64)),
            ev.make_event(cid, "verifier", cand.id, rejected=pb.Rejected(
                candidate=cand, stage="verifier", reason=pb.WRONG_RESULT, message="wrong at 3x17", checks=[check]))]


def test_regression_inputs_travel_and_a_conflicting_id_is_refused_whole(tmp_path, monkeypatch, capsys):
    src = Archive(tmp_path / "src" / "archive.sqlite")
    cand = pb.Candidate(id="e" * 64, problem="softmax", target="cpu", family="cpu_c", origin="template:cpu_c",
                        params_json='{"vec": 4}', point_id="p1")
    for event in [_start("c1"), *links("c1", cand), _start("c2"), *_wrong("c2", cand)]:
        src.record(event)
    held = Queries(src).regression_inputs(spb.RegressionRequest(problem="softmax"))
    assert [(r.shape, r.seed, r.campaign_id) for r in held.inputs] == [("3x17", 4242, "c2")]
    bundle = eb.export_bundle(src, Workspace(tmp_path / "src").get, "softmax", "cpu")
    assert [c["id"] for c in bundle["campaigns"]] == ["c1", "c2"] and len(bundle["regressions"]) == 1

    ws = Workspace(tmp_path / "dst")
    dst = Archive(ws.archive_path)
    result = eb.import_bundle(dst, ws, eb.loads(eb.dumps(bundle)))
    assert not result.refused and result.events_added == 8 and result.campaigns == 2
    assert Queries(dst).regression_inputs(spb.RegressionRequest(problem="softmax")) == held

    # another archive where c1 started differently: the same event id with other content
    other_ws = Workspace(tmp_path / "other")
    other = Archive(other_ws.archive_path)
    other.record(_start("c1", pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=99)))
    result = eb.import_bundle(other, other_ws, bundle)
    assert result.events_added == 0 and len(result.refused) == 1, result
    assert "c1:campaign_started:start" in result.refused[0] and "another event under that id" in result.refused[0]
    assert other.q("SELECT COUNT(*) FROM events") == [(1,)] and other.regressions("softmax") == []  # nothing of it
    for a in (src, dst, other):
        a.close()
    path = tmp_path / "b.json.gz"
    eb.write(path, bundle)
    rc, out, err = _cli(monkeypatch, capsys, tmp_path / "other", "evidence", "import", str(path))
    assert rc == 1 and not out and "refused, nothing imported:" in err and "another event under that id" in err


def test_what_is_no_bundle_is_refused_before_anything_is_imported(tmp_path, monkeypatch, capsys):
    good = eb.export_bundle(Archive(tmp_path / "a.sqlite"), lambda d: None)
    newer = {**good, "version": eb.VERSION + 1}
    forged = {**good, "objects": {"0" * 64: {"text": "int kernel;"}}}
    cases = {"newer.json.gz": (eb.dumps(newer), "written by a newer kfactory"),
             "forged.json.gz": (eb.dumps(forged), "do not hash to its name"),
             "plain.txt": (b"hello", "not gzip-compressed JSON"),
             "other.json": (b'{"format": "something-else"}', "not a kfactory evidence bundle"),
             # true is an int to Python: it read as version 1
             "true.json.gz": (eb.dumps({**good, "version": True}), "version True is no bundle version"),
             # an event that is a string: 'has no field named "a"'
             "string.json.gz": (eb.dumps({**good, "events": ["abc"]}), "events[0] is str, not an object: the "
                                                                        "bundle is damaged or no bundle")}
    for name, (data, why) in cases.items():
        (tmp_path / name).write_bytes(data)
        rc, out, err = _cli(monkeypatch, capsys, tmp_path / "ws", "evidence", "import", str(tmp_path / name))
        assert rc == 2 and why in err and "Traceback" not in err, (name, err)
    assert not (tmp_path / "ws" / "objects").exists()


async def test_a_memory_service_imports_and_exports_the_bundle_and_answers_best_by_target(
        source, bus_settings, tmp_path, monkeypatch, capsys):
    src = Archive.reader(source["data"] / "archive.sqlite", problem_name)  # the package path names softmax
    bundle = eb.dumps(eb.export_bundle(src, Workspace(source["data"]).get, "softmax", "cpu"))
    src.close()
    path = tmp_path / "softmax.json.gz"
    path.write_bytes(bundle)
    running = await start_services(bus_settings.model_copy(update={"data_dir": tmp_path / "memory"}),
                                   names=("memory",))
    try:
        memory = running.services["memory"]
        async with asyncio.timeout(20):
            while not memory.grpc_port:
                await asyncio.sleep(0.05)
        addr = f"127.0.0.1:{memory.grpc_port}"

        def cli(*argv):
            return _cli(monkeypatch, capsys, tmp_path / "client", *argv, memory=addr)

        imported = json.loads(_ok(await asyncio.to_thread(cli, "evidence", "import", str(path), "--json")))
        assert imported["events_added"] > 0 and imported["objects_added"] == 3 and not imported["refused"], imported
        again = json.loads(_ok(await asyncio.to_thread(cli, "evidence", "import", str(path), "--json")))
        assert again["events_added"] == 0 and again["events_present"] == imported["events_added"]
        exported = tmp_path / "from-memory.json.gz"
        _ok(await asyncio.to_thread(cli, "evidence", "export", "--problem", "softmax", "--target", "cpu",
                                    "--out", str(exported)))
        assert exported.read_bytes() == bundle
        # a problem that is none: refused by the service too, not an empty bundle
        rc, _, err = await asyncio.to_thread(cli, "evidence", "export", "--problem", "nosuch", "--out",
                                             str(tmp_path / "none.json.gz"))
        assert rc == 2 and "INVALID_ARGUMENT" in err and "no problem 'nosuch'" in err, err
        assert not (tmp_path / "none.json.gz").exists()
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = sgrpc.EvidenceStub(ch)
            best = await stub.Best(spb.BestRequest(problem="softmax", target="cpu"))
            with pytest.raises(grpc.aio.AioRpcError) as none:
                await stub.Best(spb.BestRequest(problem="softmax", target="cuda"))
            report = await stub.Report(spb.ReportRequest(campaign_id=source["campaign"][:5]))
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.ImportBundle(iter([spb.BundleChunk(data=b"not a bundle")]))
            with pytest.raises(grpc.aio.AioRpcError) as gpu:   # a mistyped target: not an empty bundle either
                [c async for c in stub.ExportBundle(spb.ExportRequest(target="gpu"))]
        assert gpu.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown target 'gpu'" in gpu.value.details()
        assert best.campaign_id == source["campaign"] and none.value.code() == grpc.StatusCode.NOT_FOUND
        assert report.campaign_id == source["campaign"] and report.markdown
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not imported" in bad.value.details()
        rc, out, _ = await asyncio.to_thread(cli, "report", source["campaign"][:5], "--json", "--out",
                                             str(tmp_path / "r"))
        assert rc == 0 and json.loads(out) == {"campaign_id": source["campaign"],
                                               "report": str(tmp_path / "r" / "report.md")}
        assert running.failed() is None
    finally:
        await running.shutdown()


def _small_bundle(tmp_path) -> dict:
    """A bundle of one softmax campaign c1 (a candidate verified and measured), from an archive of its own."""
    src = Archive(tmp_path / "src" / "archive.sqlite")
    cand = pb.Candidate(id="f" * 64, problem="softmax", target="cpu", family="cpu_c", origin="template:cpu_c",
                        params_json='{"vec": 4}', point_id="p1")
    for event in [_start("c1"), *links("c1", cand)]:
        src.record(event)
    bundle = eb.export_bundle(src, Workspace(tmp_path / "src").get, "softmax", "cpu")
    src.close()
    return bundle


def test_a_bundle_may_not_rename_a_problem_name_nor_bring_ids_no_command_can_name(tmp_path):
    """Found by a probe of the services: problem_names {'softmax': 'other'} went in with exit 0 and hid every
    softmax campaign here from best, priors and lessons for good (and refused genuine bundles after); campaign ids
    such as '../../x' went in and no command could name them. Both refuse the bundle whole; an archive a bundle
    renamed a name in before reads the name as itself again."""
    bundle = _small_bundle(tmp_path)
    ws = Workspace(tmp_path / "dst")
    dst = Archive(ws.archive_path)
    renamed = {**bundle, "problem_names": {"softmax": "other"}}
    result = eb.import_bundle(dst, ws, eb.loads(eb.dumps(renamed)))
    assert result.events_added == 0 and any("'softmax' is a problem's name; the bundle names it 'other'" in r
                                             for r in result.refused), result
    odd = json.loads(json.dumps(bundle).replace('"c1', '"../../x'))
    result = eb.import_bundle(dst, ws, eb.loads(eb.dumps(odd)))
    assert result.events_added == 0 and any("its campaign id '../../x' is not one" in r for r in result.refused)
    assert dst.q("SELECT COUNT(*) FROM events") == [(0,)]
    dst.db.execute("INSERT INTO problem_names VALUES ('softmax', 'other')")   # as the import once let in
    dst.close()
    healed = Archive(ws.archive_path)
    assert healed.problem_name("softmax") == "softmax"
    assert not eb.import_bundle(healed, ws, eb.loads(eb.dumps(bundle))).refused
    healed.close()


@pytest.mark.parametrize("out", ["dir", ""])
def test_export_to_a_directory_is_refused_and_leaves_nothing(tmp_path, monkeypatch, capsys, out):
    """`--out DIR` left the whole bundle in .DIR.tmp (and `--out /tmp` in /.tmp.tmp); `--out ""` was an internal
    error."""
    bundle = _small_bundle(tmp_path)
    ws = Workspace(tmp_path / "ws")
    eb.import_bundle(Archive(ws.archive_path), ws, eb.loads(eb.dumps(bundle)))
    (tmp_path / "dir").mkdir()
    monkeypatch.chdir(tmp_path)
    rc, _, err = _cli(monkeypatch, capsys, tmp_path / "ws", "evidence", "export", "--out", out)
    assert rc == 2 and "a directory; name the bundle file to write" in err and "internal error" not in err, err
    assert not list(tmp_path.glob(".*tmp")) and not list((tmp_path / "dir").iterdir())


def test_a_bad_file_among_several_is_named_and_the_others_still_go_in(tmp_path, monkeypatch, capsys):
    """`evidence import good bad more`: the bad one's reason came without its name, and `more` was skipped."""
    bundle = _small_bundle(tmp_path)
    good, bad, more = tmp_path / "good.json.gz", tmp_path / "bad.json.gz", tmp_path / "more.json.gz"
    eb.write(good, bundle)
    bad.write_bytes(eb.dumps(bundle)[:40])
    eb.write(more, {**bundle, "regressions": []})
    rc, out, err = _cli(monkeypatch, capsys, tmp_path / "ws", "evidence", "import", str(good), str(bad), str(more),
                        str(tmp_path / "gone.json.gz"))
    assert rc == 2 and f"kfactory evidence: {bad}: not gzip-compressed JSON" in err, err
    assert f"kfactory evidence: {tmp_path / 'gone.json.gz'}: cannot read it: No such file" in err, err
    assert f"{good}: " in out and f"{more}: " in out, out   # both read: the second one added nothing new

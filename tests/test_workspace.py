"""The local workspace (issue 21, deliverable 1): what a campaign made (the archive, every candidate's source,
compiled artifacts, reports) stays under KFACTORY_DATA_DIR when its services and its nats-server are gone; the
query commands answer from it with no service running, and give the same answers through a memory service; every
id they take may be a unique prefix."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grpc
import pytest

from kfactory.cli import client
from kfactory.bus import events as ev
from kfactory.platform.app import start_services
from kfactory.platform.config import Settings
from kfactory.bus.natsd import EmbeddedNats
from kfactory.cli.run import _memory_ready
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import Ambiguous, InvalidRequest, NotFound, Queries
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from kfactory.evidence.workspace import Workspace

sys.path.insert(0, str(Path(__file__).parent))
from tuning_synth import write_spaces  # noqa: E402

#: the addresses that would make a query command ask a service instead of the workspace
SERVICE_ADDRS = ("KFACTORY_MEMORY_ADDR", "KFACTORY_PLANNER_ADDR")


def _env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ADDRS}
    return {**env, "KFACTORY_DATA_DIR": str(data), **extra}


async def _cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """A fresh `python -m kfactory.cli.main` process (asynchronous, so that several run at once, and so that services
    of this event loop keep answering)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kfactory.cli.main", *args, env=env, cwd=cwd,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None  # communicate() waited for the exit
    return proc.returncode, out.decode(), err.decode()


def _ok(result: tuple[int, str, str]) -> str:
    rc, out, err = result
    assert rc == 0 and "Traceback" not in err, (rc, out, err)
    return out


# -- the object store ------------------------------------------------------------------------------------------
def test_objects_are_content_addressed_idempotent_and_checked(tmp_path):
    ws = Workspace(tmp_path / "data")
    assert ws.get("0" * 64) is None and not ws.has("0" * 64)
    digest = ws.put(b"kernel source")
    assert digest == hashlib.sha256(b"kernel source").hexdigest() == ev.sha256_hex(b"kernel source")
    assert ws.put(b"kernel source") == digest and ws.get(digest) == b"kernel source"
    assert [p.name for p in ws.objects.iterdir()] == [digest]  # no temporary file left behind
    (ws.objects / digest).write_bytes(b"kernel sourcE")  # damaged on disk: never served as the artifact
    assert ws.get(digest) is None
    for bad in ("../archive.sqlite", "", "A" * 64, digest[:63]):  # no digest names a path
        assert ws.get(bad) is None and not ws.has(bad)


def test_a_workspace_where_no_campaign_ran_says_so_in_one_line(tmp_path):
    async def ask() -> tuple[tuple[int, str, str], tuple[int, str, str]]:
        env = _env(tmp_path / "nothing-here")
        return await asyncio.gather(_cli(env, "status"), _cli(env, "best", "--candidate", "abc", "--json"))

    for rc, out, err in asyncio.run(ask()):
        assert rc == 1 and not out, (rc, out, err)
        assert err.count("\n") == 1 and "no campaign has run here yet" in err, err
        assert str(tmp_path / "nothing-here" / "archive.sqlite") in err


# -- id prefixes -----------------------------------------------------------------------------------------------
def _archive_with(path: Path, candidates: list[str], campaigns: list[str]) -> Archive:
    """An archive holding one bare event per candidate id (of campaigns[0]) and per campaign id."""
    arch = Archive(path)
    for i, cid in enumerate(candidates):
        arch.db.execute("INSERT INTO events (id, campaign, kind, candidate, payload) VALUES (?,?,?,?,?)",
                        (f"e{i}", campaigns[0], "candidate_created", cid, b""))
        arch.db.execute("INSERT INTO candidates (campaign, id, origin, params_json) VALUES (?,?,?,?)",
                        (campaigns[0], cid, "template:f", f'{{"i": {i}}}'))
    for cp in campaigns:
        arch.db.execute("INSERT INTO events (id, campaign, kind, payload) VALUES (?,?,?,?)",
                        (f"s-{cp}", cp, "campaign_started", b""))
    return arch


def test_a_unique_prefix_names_its_id_an_ambiguous_one_lists_the_matches(tmp_path):
    ids = ["ab12", "ab34", "abc", "b0"] + [f"d{i:02d}" for i in range(12)]
    q = Queries(_archive_with(tmp_path / "a.sqlite", ids, ["c1aa", "c1ab", "c2"]))
    assert q.resolve_candidate("b") == "b0" and q.resolve_candidate("ab1") == "ab12"
    assert q.resolve_candidate("abc") == "abc"  # an exact id wins, even where it is a prefix of others
    assert q.resolve_campaign("c2") == "c2" and q.resolve_campaign("c1ab") == "c1ab"
    with pytest.raises(Ambiguous) as amb:
        q.resolve_candidate("ab")
    assert isinstance(amb.value, InvalidRequest) and len(amb.value.matches) == 3
    assert str(amb.value).startswith("candidate prefix 'ab' is ambiguous; it matches 3:\n  ab12  template:f")
    with pytest.raises(Ambiguous) as amb:  # 12 matches: the first 10 listed, and that there are more
        q.resolve_candidate("d")
    assert len(amb.value.matches) == 10 and "more than 10" in str(amb.value) and str(amb.value).endswith("...")
    with pytest.raises(Ambiguous, match="campaign prefix 'c1' is ambiguous"):
        q.resolve_campaign("c1")
    with pytest.raises(NotFound, match="no candidate 'e' in the archive"):
        q.resolve_candidate("e")
    with pytest.raises(NotFound, match="no campaign 'c3' in the archive"):
        q.resolve_campaign("c3")
    with pytest.raises(NotFound):  # case-sensitive, and no SQL pattern
        q.resolve_candidate("AB")
    with pytest.raises(NotFound):
        q.resolve_campaign("c_")
    with pytest.raises(NotFound):  # no id holds anything but ASCII
        q.resolve_candidate("ab\udcff")
    with pytest.raises(InvalidRequest, match="name a candidate"):
        q.resolve_candidate("")


# -- a campaign outlives its services --------------------------------------------------------------------------
async def _until_finished(running, cid: str, timeout: float = 120) -> None:
    st = running.services["planner"].campaigns[cid]
    archive = running.services["memory"].archive
    async with asyncio.timeout(timeout):
        while st.finished is None or not archive.q(
                "SELECT 1 FROM campaigns WHERE id=? AND finished_ns IS NOT NULL", (cid,)):
            assert running.failed() is None, running.failed()
            await asyncio.sleep(0.2)


async def _grpc_addr(service) -> str:
    async with asyncio.timeout(20):
        while not service.grpc_port:
            await asyncio.sleep(0.05)
    return f"127.0.0.1:{service.grpc_port}"


def _ambiguous_one_char(archive: Archive) -> str:
    """A first character that more than one candidate id starts with."""
    firsts = defaultdict(list)
    for (cid,) in archive.q("SELECT DISTINCT candidate FROM events WHERE candidate IS NOT NULL"):
        firsts[cid[0]].append(cid)
    return next(c for c, ids in sorted(firsts.items()) if len(ids) > 1)


#: the commands asked both of the workspace and of a memory service, whose JSON must agree
def _queries(winner: str, cpu_campaign: str) -> dict[str, tuple[str, ...]]:
    return {"best": ("best", "softmax", "--json"),
            "candidate": ("best", "--candidate", winner[:12], "--json"),
            "leaderboard": ("best", "--campaign", cpu_campaign[:6], "--json"),
            "priors": ("priors", "softmax", "--json"),
            "lessons": ("lessons", "softmax", "--target", "cpu", "--json")}


async def test_a_campaign_outlives_its_services_and_answers_the_same_with_or_without_them(settings, small_softmax,
                                                                                          tmp_path, monkeypatch):
    data = settings.data_dir
    for name in SERVICE_ADDRS:
        monkeypatch.delenv(name, raising=False)
    nats = EmbeddedNats(tmp_path / "nats")
    on_bus = settings.model_copy(update={"nats_url": nats.start()})
    try:
        running = await start_services(on_bus)  # the planner and memory answer gRPC on free ports
        try:
            await _memory_ready(running)
            planner = running.services["planner"]
            cpu = await planner.submit(pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=1,
                                                       strategy="random", seed=3, warm_start=0))
            # a replayed campaign beside it: many candidates quickly, so a one-character prefix is ambiguous
            space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
            replay = await planner.submit(pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}",
                                                          budget_candidates=20, strategy="random", seed=5,
                                                          parallel=4, warm_start=0))
            await asyncio.gather(_until_finished(running, cpu), _until_finished(running, replay))
            winner = planner.campaigns[cpu].finished.best_candidate_id
            archive = running.services["memory"].archive
            [(digest,)] = archive.q("SELECT source_digest FROM candidates WHERE id=?", (winner,))
            rendered = (await running.ctx.bus.get_artifact(digest)).decode()  # what the coder put on the bus
            planner_env = _env(data, KFACTORY_PLANNER_ADDR=await _grpc_addr(planner))
            listed, by_prefix = await asyncio.gather(_cli(planner_env, "status", "--json"),
                                                     _cli(planner_env, "status", cpu[:5]))  # the planner, by prefix
            by_planner = json.loads(_ok(listed))
            one_char = _ambiguous_one_char(archive)
        finally:
            await running.shutdown()
    finally:
        nats.stop()

    # no service and no nats-server now: the workspace answers
    env = _env(data)
    asks = _queries(winner, cpu)
    local_runs = await asyncio.gather(*(_cli(env, *args) for args in asks.values()),
                                      _cli(env, "best", "--candidate", one_char), _cli(env, "status", "--json"),
                                      _cli(env, "status", cpu[:5]), _cli(env, "report", cpu[:6], cwd=tmp_path))
    local = {name: json.loads(_ok(r)) for name, r in zip(asks, local_runs)}
    ambiguous, status_json, status_line, report = local_runs[len(asks):]

    assert local["candidate"]["source"] == rendered and rendered.strip()
    assert local["candidate"]["candidate"]["id"] == winner and local["best"]["candidate_id"] == winner
    assert [e["candidate_id"] for e in local["leaderboard"]["entries"]][0] == winner
    assert local["priors"]["priors"] and local["lessons"]["text"]

    rc, out, err = ambiguous
    assert rc == 2 and not out and "Traceback" not in err, ambiguous
    assert f"candidate prefix {one_char!r} is ambiguous; it matches" in err and err.count(f"\n  {one_char}") >= 2

    # status: the planner's answer, read back from the archive
    mine = {s["id"]: s for s in json.loads(_ok(status_json))["campaigns"]}
    for theirs in by_planner["campaigns"]:
        ours = mine[theirs["id"]]
        assert (ours["source"], theirs["source"]) == ("archive", "planner")   # where each was read
        assert ours["elapsed_s"] == pytest.approx(theirs["elapsed_s"], abs=1e-3)
        assert {**ours, "elapsed_s": 0, "source": ""} == {**theirs, "elapsed_s": 0, "source": ""}
    line = _ok(status_line).strip()
    assert _ok(by_prefix).strip() == f"{line}  [planner]"   # marked: status read the archive beside the planner
    assert line.startswith(f"{cpu} {small_softmax}/cpu completed ") and f"best {winner[:12]} " in line, line
    written = tmp_path / "reports" / cpu / "report.md"  # named by the full id, not the prefix asked
    assert _ok(report).strip() == str(Path("reports") / cpu / "report.md") and written.is_file()
    # what `kfactory export` calls, from the workspace (asyncio.run inside: in a thread of its own)
    here = Settings(data_dir=data)
    found = await asyncio.to_thread(client.candidate_evidence, here, winner[:12])
    assert found.source == rendered and found.candidate.id == winner
    assert (await asyncio.to_thread(client.best_entry, here, "softmax", "", "cpu")).candidate_id == winner
    with pytest.raises(client.ClientError) as none:
        await asyncio.to_thread(client.best_entry, here, "softmax", "", "cuda")
    assert none.value.code == 1 and "no measurement of 'softmax'" in str(none.value)

    # the same commands through a memory service (on a fresh, empty nats-server): the same answers
    nats = EmbeddedNats(tmp_path / "nats2")
    on_bus = settings.model_copy(update={"nats_url": nats.start()})
    try:
        running = await start_services(on_bus, names=("memory",))
        try:
            addr = await _grpc_addr(running.services["memory"])
            remote_env = _env(data, KFACTORY_MEMORY_ADDR=addr)
            there = Settings(data_dir=tmp_path / "elsewhere", memory_addr=addr)  # the service's workspace answers
            assert await asyncio.to_thread(client.candidate_evidence, there, winner[:12]) == found
            assert (await asyncio.to_thread(client.best_entry, there, "softmax", "", "cpu")).candidate_id == winner
            remote_runs = await asyncio.gather(
                *(_cli(remote_env, *args) for args in asks.values()),
                _cli(remote_env, "best", "--candidate", one_char),
                _cli(remote_env, "report", cpu[:6], "--out", str(tmp_path / "remote-report")))
            assert running.failed() is None
        finally:
            await running.shutdown()
    finally:
        nats.stop()
    remote = {name: json.loads(_ok(r)) for name, r in zip(asks, remote_runs)}
    assert remote == local  # the source too: memory serves it from the workspace, the bus has none now
    rc, out, err = remote_runs[len(asks)]
    assert rc == 2 and f"INVALID_ARGUMENT: candidate prefix {one_char!r} is ambiguous" in err, remote_runs[len(asks)]
    _ok(remote_runs[-1])
    assert (tmp_path / "remote-report" / "report.md").read_text() == written.read_text()


async def test_memory_archives_an_event_whose_artifact_the_bus_lacks(bus_settings):
    """A candidate whose source is in no store is archived all the same (memory warns), with no source."""
    running = await start_services(bus_settings, names=("memory",))
    try:
        memory = running.services["memory"]
        cand = pb.Candidate(id="f" * 64, campaign_id="cgone", point_id="p1", problem="softmax", target="cpu",
                            origin="template:cpu_c", params_json="{}", source_digest="b" * 64)
        spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=1)
        for event in (ev.make_event("cgone", "planner", "start", campaign_started=pb.CampaignStarted(spec=spec)),
                      ev.make_event("cgone", "coder", cand.id, candidate_created=pb.CandidateCreated(candidate=cand)),
                      ev.make_event("cgone", "compiler", cand.id,
                                    compiled=pb.Compiled(candidate=cand, artifact_digest="d" * 64))):
            await running.ctx.bus.publish(event)
        async with asyncio.timeout(20):
            while len(memory.archive.events(campaign="cgone")) < 3:
                assert running.failed() is None, running.failed()
                await asyncio.sleep(0.1)
        async with grpc.aio.insecure_channel(await _grpc_addr(memory)) as ch:
            found = await sgrpc.EvidenceStub(ch).Candidate(spb.CandidateRequest(id="fff"))
        assert found.candidate.id == cand.id and found.source == ""
        assert not memory.workspace.has("b" * 64) and running.failed() is None
    finally:
        await running.shutdown()


def test_kfactory_run_leaves_sources_artifacts_and_a_report_in_the_workspace(tmp_path, host_ceilings,
                                                                            small_softmax):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(host_ceilings, data / "ceilings.json")  # the host's ceilings, measured once per test session
    env = _env(data, KFACTORY_THREADS="2", KFACTORY_MEASURE_MIN_S="0.05", KFACTORY_MEASURE_MAX_S="0.2",
               KFACTORY_COMPARE_MAX_S="0.4")
    run = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "run", small_softmax, "--budget", "1",
                          "--strategy", "random", "--seed", "3", "--warm", "0", "--quiet", "--json", "out.json"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "out.json").read_text())
    cid, best = summary["campaign_id"], summary["best"]["candidate_id"]

    ws = Workspace(data)
    archive = Archive.reader(ws.archive_path)
    sources = archive.q("SELECT id, source_digest FROM candidates WHERE campaign=?", (cid,))
    compiled = [e.compiled.artifact_digest for e in archive.events(campaign=cid) if e.HasField("compiled")]
    archive.close()
    assert len(sources) == 2 and len(compiled) == 2  # the searched point and the reference kernel
    assert all(ws.get(d) for _, d in sources) and all(ws.get(d) for d in compiled)
    kept = ws.report_dir(cid)
    assert (kept / "report.md").read_text() == (tmp_path / "reports" / cid / "report.md").read_text()
    assert (kept / "plot.png").read_bytes().startswith(b"\x89PNG")

    shown = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "best", "--candidate", best[:12], "--json"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["source"] == ws.get(dict(sources)[best]).decode()

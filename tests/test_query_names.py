"""How the query commands read what a person types, found by a probe of the CLI: a problem name that is nothing
(no built-in, no package, no campaign of it) is a usage error naming it, where lessons and priors answered "no
lessons" with exit 0; `export NAME` takes the bare directory name of a package a campaign ran (`kfactory run
./famok`, then `kfactory export famok` from anywhere), and says which paths to pass when packages of several
problems share it, while a built-in's name stays the built-in; an empty --out is refused, not the working
directory; and `status` against a planner lists the archive's campaigns too (the local one's, imported or run
here, or a memory service's when one is configured: what best and report find), each once, marked where it came
from."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from kfactory.bus import events as ev
from kfactory.bus.natsd import EmbeddedNats
from kfactory.cli.main import main
from kfactory.cli.run import _memory_ready
from kfactory.platform.app import start_services
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import InvalidRequest, Queries, UnknownProblem, problem_name
from kfactory.services.memory.service import MemoryService
from kfactory.services.planner.service import PlannerService
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

from tiny_campaign import run_campaign, tiny_package  # tests/ is on the path (pytest inserts a test file's directory)
from tuning_synth import write_spaces

KFACTORY = [sys.executable, "-m", "kfactory.cli.main"]
SERVICE_ADDRS = ("KFACTORY_MEMORY_ADDR", "KFACTORY_PLANNER_ADDR")
UNKNOWN = ("kfactory: no problem 'nosuch': it is no built-in problem (kfactory problems list), no problem package "
           "directory that loads, and no campaign in the archive ran a problem of that name (kfactory status lists "
           "the campaigns)")


@pytest.fixture(scope="module")
def famok(tmp_path_factory, host_ceilings) -> dict:
    """A real campaign (budget 2, tiny shapes: seconds) of a user's package `famok` (the problem famok), run from
    its directory as `kfactory run ./famok` records it (an absolute path): the workspace, the package, the id."""
    root = tmp_path_factory.mktemp("famok-source")
    return run_campaign(root, tiny_package(root / "famok", "famok"), host_ceilings)


def _workspace(famok: dict, where: Path) -> Path:
    """A copy of the campaign's workspace (a test that adds to it leaves the module's as it was)."""
    shutil.copytree(famok["data"], where)
    return where


def _env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ADDRS}
    return {**env, "KFACTORY_DATA_DIR": str(data), **extra}


def _cli(monkeypatch, capsys, data: Path, *argv: str) -> tuple[int, str, str]:
    """`kfactory ARGV` in this process, on the workspace `data`, with no service configured."""
    for name in SERVICE_ADDRS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


async def _acli(env: dict[str, str], *argv: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """A fresh `kfactory` process (asynchronous: the services of this event loop keep answering)."""
    proc = await asyncio.create_subprocess_exec(*KFACTORY, *argv, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


# -- 1. a problem name that is nothing -------------------------------------------------------------------------
def test_an_unknown_problem_is_a_usage_error_and_a_known_one_answers(famok, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)   # `famok` is no directory here: the archive alone knows it
    data = famok["data"]
    for command in ("lessons", "priors", "best"):
        rc, out, err = _cli(monkeypatch, capsys, data, command, "nosuch")
        assert (rc, out, err) == (2, "", UNKNOWN + "\n"), (command, rc, out, err)
    # the package's problem by its name, though no package of it is here: its campaign's evidence
    rc, out, err = _cli(monkeypatch, capsys, data, "lessons", "famok", "--target", "cpu")
    assert rc == 0 and out.startswith("- best: fastest so far"), (rc, out, err)
    rc, out, err = _cli(monkeypatch, capsys, data, "priors", "famok", "--json")
    assert rc == 0 and len(json.loads(out)["priors"]) == 2, (rc, out, err)
    # a built-in no campaign ran is a problem all the same: nothing learned of it yet
    rc, out, err = _cli(monkeypatch, capsys, data, "lessons", "softmax")
    assert (rc, out) == (0, "no lessons yet: no campaign of softmax is in memory\n"), (rc, out, err)
    # a service asking for its own campaign's problem (the planner's warm start, an agent's lessons) does not ask
    # for it to be known: the first campaign of a problem has nothing archived yet
    archive = Archive.reader(data / "archive.sqlite", problem_name)
    try:
        q = Queries(archive)
        assert not q.priors(spb.PriorsRequest(problem="nosuch")).priors
        assert not q.lessons(spb.LessonsRequest(problem="nosuch")).lessons
        with pytest.raises(UnknownProblem):
            q.lessons(spb.LessonsRequest(problem="nosuch", require_known=True))
    finally:
        archive.close()


@pytest.mark.parametrize("argv, said", [
    (("lessons", "famok", "--target", "gpu"), "argument --target: unknown target 'gpu'; known targets: cpu, cuda"),
    (("best", "famok", "--target", "cpux"), "argument --target: unknown target 'cpux'"),
    (("best", "famok", "--target", "cuda:sm90"), "malformed cuda architecture 'sm90'"),
    (("priors", "famok", "--target", "cpu:avx"), "the cpu target takes no option (got 'cpu:avx')"),
    (("best", "famok", "--shape", "abc"), "argument --shape: malformed shape 'abc'"),
    (("export", "famok", "--shape", "64x", "--format", "c", "--name", "k", "--out", "k"), "malformed shape '64x'"),
    (("export", "famok", "--target", "gpu", "--format", "c", "--name", "k", "--out", "k"), "unknown target 'gpu'"),
    (("evidence", "export", "--target", "gpu", "--out", "k"), "unknown target 'gpu'"),
    (("best", "famok", "--shape", "prefill_"), "malformed shape 'prefill_'"),
])
def test_a_mistyped_target_or_shape_is_a_usage_error_not_no_measurement(famok, monkeypatch, capsys, tmp_path, argv,
                                                                        said):
    """A target or shape no campaign can have matched nothing: "no lessons yet" with exit 0, or "no measurement"
    with exit 1, as if the workspace lacked it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        _cli(monkeypatch, capsys, famok["data"], *argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and said in err.splitlines()[-1], err
    assert not (tmp_path / "k").exists()
    # well formed, the same filters answer: a target of no campaign has nothing, one architecture is a filter
    rc, out, _ = _cli(monkeypatch, capsys, famok["data"], "lessons", "famok", "--target", "cuda:sm_90a")
    assert (rc, out) == (0, "no lessons yet: no campaign of famok on cuda:sm_90a is in memory\n")
    rc, out, _ = _cli(monkeypatch, capsys, famok["data"], "lessons", "famok", "--target", "cpu:")   # get_target's cpu
    assert rc == 0 and out.startswith("- best: fastest so far"), out
    # an engine's timings are named by its decode context and its prefill: shapes too
    rc, _, err = _cli(monkeypatch, capsys, famok["data"], "best", "famok", "--shape", "prefill_128")
    assert rc == 1 and err.startswith("kfactory: no measurement of 'famok' prefill_128, or none"), err
    # the best's median is named by its shape: a package's shapes may change between its campaigns
    rc, out, _ = _cli(monkeypatch, capsys, famok["data"], "best", "famok")
    assert rc == 0 and re.match(r"[0-9a-f]{64} \d+\.\d{3} ms at \d+x\d+ on ", out), out
    # a service (a gRPC client) is refused alike, not answered with nothing
    archive = Archive.reader(famok["data"] / "archive.sqlite", problem_name)
    try:
        q = Queries(archive)
        with pytest.raises(InvalidRequest, match="unknown target 'gpu'"):
            q.lessons(spb.LessonsRequest(problem="famok", target="gpu"))
        with pytest.raises(InvalidRequest, match="malformed shape 'abc'"):
            q.best(spb.BestRequest(problem="famok", shape="abc"))
        assert q.best(spb.BestRequest(problem="famok", target="cpu")).candidate_id
        assert q.lessons(spb.LessonsRequest(problem="famok", target="cpu")).lessons
    finally:
        archive.close()


# -- 2. an empty --out -----------------------------------------------------------------------------------------
def test_an_empty_out_is_a_usage_error_not_the_working_directory(famok, tmp_path):
    here = tmp_path / "cwd"
    here.mkdir()
    env = _env(famok["data"])
    for argv in (["report", famok["campaign"], "--out", ""],
                 ["export", str(famok["pkg"]), "--format", "c", "--name", "fam", "--out", ""]):
        out = subprocess.run([*KFACTORY, *argv], capture_output=True, text=True, env=env, cwd=here, timeout=60)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out
        assert out.stderr.splitlines()[-1].endswith("argument --out: an empty path: name the directory to write "
                                                    "into ('.' for the working directory)"), out.stderr
        assert not list(here.iterdir()), list(here.iterdir())
    out = subprocess.run([*KFACTORY, "report", famok["campaign"][:6], "--out", "."], capture_output=True, text=True,
                         env=env, cwd=here, timeout=60)
    assert out.returncode == 0 and (here / "report.md").is_file(), out   # asked for in so many words


def test_an_evidence_export_of_a_problem_that_is_none_is_a_usage_error(famok, monkeypatch, capsys, tmp_path):
    """It wrote an empty bundle and exited 0, its note on stderr alone."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = _cli(monkeypatch, capsys, famok["data"], "evidence", "export", "--problem", "nosuch", "--out",
                        str(tmp_path / "none.json.gz"))
    assert (rc, out) == (2, "") and err == f"kfactory evidence: --problem: {UNKNOWN[len('kfactory: '):]}\n", err
    assert not (tmp_path / "none.json.gz").exists()
    rc, out, _ = _cli(monkeypatch, capsys, famok["data"], "evidence", "export", "--problem", "famok", "--out",
                      str(tmp_path / "famok.json.gz"))
    assert rc == 0 and out.startswith(f"{tmp_path / 'famok.json.gz'}: 1 campaigns"), out


def test_a_report_is_not_written_over_the_users_own_files(famok, monkeypatch, capsys, tmp_path):
    """`report ID --out DIR` replaced a report.md of the user's (and wrote plot.png beside it); an earlier report
    there is written over, as before."""
    mine = tmp_path / "myproj"
    mine.mkdir()
    (mine / "report.md").write_text("# my notes\n")
    rc, out, err = _cli(monkeypatch, capsys, famok["data"], "report", famok["campaign"], "--out", str(mine))
    assert (rc, out) == (2, "") and err == (f"kfactory: {mine} holds report.md, which no report wrote: the report "
                                            "would write over it; choose another --out\n"), err
    assert [p.name for p in mine.iterdir()] == ["report.md"] and (mine / "report.md").read_text() == "# my notes\n"
    (mine / "report.md").write_text("# Campaign notes: what I tried\n")   # a title of its own, like a report's
    assert _cli(monkeypatch, capsys, famok["data"], "report", famok["campaign"], "--out", str(mine))[0] == 2
    (mine / "report.md").unlink()
    (mine / "plot.png").write_bytes(b"my plot")
    assert _cli(monkeypatch, capsys, famok["data"], "report", famok["campaign"], "--out", str(mine))[0] == 2
    (mine / "plot.png").unlink()
    for _ in range(2):   # the second writes over the first's
        rc, out, err = _cli(monkeypatch, capsys, famok["data"], "report", famok["campaign"], "--out", str(mine))
        assert rc == 0 and (mine / "report.md").read_text().startswith(f"# Campaign {famok['campaign']}"), err


# -- 3. export by the package's directory name -----------------------------------------------------------------
def _ran(data: Path, cid: str, package: Path) -> None:
    """Archive the start of a campaign of `package` (as memory records one from the stream)."""
    archive = Archive(data / "archive.sqlite", problem_name)
    try:
        assert archive.record(ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(
            spec=pb.CampaignSpec(problem=str(package), target="cpu", budget_candidates=1))))
    finally:
        archive.close()


def test_export_takes_a_packages_bare_directory_name_and_a_builtins_name_stays_the_builtin(famok, monkeypatch,
                                                                                          capsys, tmp_path):
    data = _workspace(famok, tmp_path / "data")
    monkeypatch.chdir(tmp_path)   # no ./famok here

    def export(name: str, *more: str) -> tuple[int, str, str]:
        out = tmp_path / "out" / name
        return _cli(monkeypatch, capsys, data, "export", name, *more, "--format", "c", "--name", "fam", "--out",
                    str(out), "--json")

    rc, out, err = export(str(famok["pkg"]))
    assert rc == 0, (rc, out, err)
    winner = json.loads(out)["candidate_id"]
    rc, out, err = export("famok")   # "no candidate 'famok' in the archive", exit 1, before
    assert rc == 0 and json.loads(out)["candidate_id"] == winner, (rc, out, err)
    assert (tmp_path / "out" / "famok" / "fam.h").is_file()

    # a package directory of another name, of the same problem: its directory name finds it
    packages = tmp_path / "packages"
    _ran(data, "cfamdir", tiny_package(packages / "c" / "famdir", "famok"))
    rc, out, err = export("famdir")
    assert rc == 0 and json.loads(out)["candidate_id"] == winner, (rc, out, err)
    # one directory name, packages of two problems: which paths (and problems) to pass instead
    _ran(data, "ckern1", tiny_package(packages / "a" / "kern", "famok"))
    _ran(data, "ckern2", tiny_package(packages / "b" / "kern", "kern_two"))
    rc, out, err = export("kern")
    assert rc == 2 and not out, (rc, out, err)
    assert err == ("kfactory: 'kern' is the directory of packages of 2 problems campaigns ran; name one by its "
                   f"problem's name or its package's path:\n  {packages / 'a' / 'kern'}  (problem famok)\n"
                   f"  {packages / 'b' / 'kern'}  (problem kern_two)\n"), err
    assert not (tmp_path / "out" / "kern").exists()
    # a package in a directory called softmax: `softmax` is still the built-in, of which nothing was measured
    _ran(data, "csoft", tiny_package(packages / "d" / "softmax", "famok"))
    rc, out, err = export("softmax")
    assert (rc, out) == (1, "") and err.startswith("kfactory: no measurement of 'softmax'"), (rc, out, err)
    # best reads a bare name the same way
    rc, out, err = _cli(monkeypatch, capsys, data, "best", "famdir", "--json")
    assert rc == 0 and json.loads(out)["candidate_id"] == winner, (rc, out, err)


# -- 5. status against a planner, and a memory service's answer to an unknown problem ---------------------------
async def test_status_lists_the_planners_and_the_local_archives_campaigns_once_each(famok, settings, tmp_path):
    data = _workspace(famok, tmp_path / "ws")
    space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
    nats = EmbeddedNats(tmp_path / "nats")
    on_bus = settings.model_copy(update={"nats_url": nats.start(), "data_dir": data})
    try:
        running = await start_services(on_bus, names=("planner", "memory"))
        try:
            await _memory_ready(running)
            planner = cast(PlannerService, running.services["planner"])
            memory = cast(MemoryService, running.services["memory"])
            cid = await planner.submit(pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}",
                                                       budget_candidates=2, strategy="random", seed=3, warm_start=0))
            async with asyncio.timeout(30):   # in the archive too: listed once, as the planner has it
                while not memory.archive.q("SELECT 1 FROM campaigns WHERE id=?", (cid,)):
                    await asyncio.sleep(0.1)
                while not planner.grpc_port or not memory.grpc_port:
                    await asyncio.sleep(0.05)
            env = _env(data, KFACTORY_PLANNER_ADDR=f"127.0.0.1:{planner.grpc_port}")
            remote = _env(data, KFACTORY_MEMORY_ADDR=f"127.0.0.1:{memory.grpc_port}")
            junk = tmp_path / "junk"   # a workspace whose archive is no archive: the planner's list still answers
            junk.mkdir()
            (junk / "archive.sqlite").write_bytes(b"not a database" * 100)
            damaged = {**env, "KFACTORY_DATA_DIR": str(junk)}
            both = {**env, "KFACTORY_MEMORY_ADDR": f"127.0.0.1:{memory.grpc_port}"}
            text, listed, one, ambiguous, planner_only, with_memory, memory_one, memory_only, *unknown = \
                await asyncio.gather(
                    _acli(env, "status"), _acli(env, "status", "--json"), _acli(env, "status", famok["campaign"][:6]),
                    _acli(env, "status", "c"), _acli(damaged, "status"), _acli(both, "status"),
                    _acli(both, "status", famok["campaign"][:6]), _acli(remote, "status", "--json"),
                    *(_acli(remote, command, "nosuch") for command in ("lessons", "priors")))
        finally:
            await running.shutdown()
    finally:
        nats.stop()

    rc, out, err = text
    assert rc == 0, text
    lines = out.splitlines()
    assert len(lines) == 2, lines   # only the planner's, before
    assert lines[0].startswith(f"{cid} replay:{space}/replay:{space} running ") and lines[0].endswith("  [planner]")
    assert lines[1].startswith(f"{famok['campaign']} {famok['pkg']}/cpu completed ") and \
        lines[1].endswith("  [archive]"), lines
    rc, out, err = listed
    assert rc == 0, listed
    assert [(s["id"], s["source"]) for s in json.loads(out)["campaigns"]] == [(cid, "planner"),
                                                                            (famok["campaign"], "archive")]
    rc, out, err = one   # a prefix of the archive's campaign, which the planner does not know
    assert rc == 0 and out.strip() == lines[1], one
    rc, out, err = ambiguous
    assert rc == 2 and "campaign prefix 'c' is ambiguous; it matches 2:" in err, ambiguous
    def running(line: str) -> tuple[str, str]:   # a running campaign's line, less what changes while it runs
        return line.split(" ", 1)[0], line.rsplit("  ", 1)[-1]   # (elapsed, counts): the calls ran concurrently
    rc, out, err = planner_only
    assert rc == 0 and [running(line) for line in out.splitlines()] == [running(lines[0])], planner_only
    assert err.startswith(f"kfactory: warning: the planner's campaigns only: cannot read the archive "
                          f"{tmp_path / 'junk' / 'archive.sqlite'}: DatabaseError"), planner_only
    # with a memory service too, the campaigns it holds that the planner does not list come from it, marked so
    rc, out, err = with_memory
    assert rc == 0 and len(out.splitlines()) == 2 and running(out.splitlines()[0]) == running(lines[0]) and \
        out.splitlines()[1] == lines[1].replace("  [archive]", "  [memory]"), with_memory
    rc, out, err = memory_one
    assert rc == 0 and out.strip() == lines[1].replace("  [archive]", "  [memory]"), memory_one
    rc, out, err = memory_only   # a memory service and no planner: its archive's campaigns, the running one too
    assert rc == 0, memory_only
    assert sorted((s["id"], s["source"]) for s in json.loads(out)["campaigns"]) == sorted(
        [(cid, "memory"), (famok["campaign"], "memory")]), memory_only
    for rc, out, err in unknown:   # a memory service says the same of a problem that is nothing
        assert rc == 2 and not out and err.endswith(f"INVALID_ARGUMENT: {UNKNOWN.removeprefix('kfactory: ')}\n"), \
            (rc, out, err)


def test_a_package_gone_since_does_not_make_its_directory_name_ambiguous(tmp_path):
    """Found by a review: two campaigns of one problem from packages in directories of one name, one package
    removed since (a temporary copy), made the name 'ambiguous between 2 problems': the gone one resolved to its
    own path. A gone package that left no measurement names nothing to answer for; the one still here answers."""
    live = tiny_package(tmp_path / "a" / "famdir", "famok")
    gone = tiny_package(tmp_path / "b" / "famdir", "famok")
    path = tmp_path / "archive.sqlite"
    archive = Archive(path, problem_name)
    for cid, pkg in (("c000000000001", live), ("c000000000002", gone)):
        archive.record(ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(
            spec=pb.CampaignSpec(problem=str(pkg), target="cpu", budget_candidates=1))))
    archive.close()
    assert Queries(Archive.reader(path, problem_name)).problem("famdir") == "famok"
    shutil.rmtree(gone.parent)
    problem_name.cache_clear()
    reader = Archive.reader(path, problem_name)
    assert reader.packages_called("famdir") == {str(live): "famok"}
    assert Queries(reader).problem("famdir") == "famok"

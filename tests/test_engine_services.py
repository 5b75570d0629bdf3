"""Engine campaigns through the services (issue 26, deliverable 3) on tiny-llama, over a real nats-server with the
real compiler: each design is a candidate the coder renders, the compiler builds, the verifier verifies in the
engine's child and the benchmarker times there; memory archives every event; the record and best.json are the
local campaign's, so `kfactory generate` runs the winner. A design that does not generate, build or verify ends
as a typed result, never an exception."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest
import yaml

from conftest import ctrl_c_when

import kfactory.problems

from kfactory.bus import events as ev
from kfactory.cli import engine_services
from kfactory.cli.run import _memory_ready, _wait_archived
from kfactory.cli.engine import greedy_tokens
from kfactory.cli.main import main
from kfactory.engines import pipeline
from kfactory.engines.campaign import VERIFIED, load_best
from kfactory.engines.codegen import CodegenError, generate
from kfactory.engines.design import EngineDesign, q4_decodes_offered
from kfactory.engines.order import JUMP
from kfactory.engines.ops import build_engine, from_memory
from kfactory.engines.showdown import Rule
from kfactory.engines.stages.bundle import unpack
from kfactory.evidence.workspace import Workspace
from kfactory.engines.stages import coder as engine_coder
from kfactory.models import Reference, load_model
from kfactory.platform.app import start_services
from kfactory.services.memory.archive import Archive
from kfactory.v1 import events_pb2 as pb
from tests.test_engine_ops import Q4_1

if TYPE_CHECKING:
    from kfactory.services.planner.service import PlannerService

#: NeoX-style RoPE halves instead of GGUF's adjacent pairs (tests/test_engine.py's broken variant)
ROPE_OLD = "#define KF_PAIR(i) (2 * (i))\n#define KF_MATE(i) (2 * (i) + 1)"
ROPE_NEW = "#define KF_PAIR(i) (i)\n#define KF_MATE(i) ((i) + KF_HEAD_DIM / 2)"


def _run(settings, budget: int, rounds: int = 1, kernel_ids: dict | None = None,
         showdown: Rule | None = None) -> tuple[dict, list[pb.Event]]:
    spec = pipeline.campaign_spec("tiny-llama", budget, max_threads=1, parallel=2, seed=5, kernel_ids=kernel_ids,
                                  rounds=rounds, showdown=showdown)
    record = asyncio.run(engine_services.run_campaign(settings, "tiny-llama", spec, embedded_nats=False))
    events = Archive(settings.archive()).events(campaign=record["campaign_id"])
    return record, events


def _source(settings, digest: str) -> str:
    """A candidate's source artifact as memory mirrored it into the workspace."""
    data = Workspace.of(settings).get(digest)
    assert data is not None, f"source {digest[:12]} is not in the workspace"
    return data.decode()


def _tiny_matvec_q4_1(root) -> str:
    """The matvec_q4_1 package with one small optimisation shape (its verify shapes, distributions and tolerance
    as built in): a kernel campaign on it takes seconds, not the minutes of the model's six shapes."""
    pkg = root / "matvec_q4_1"
    shutil.copytree(Path(kfactory.problems.__file__).parent / "matvec_q4_1", pkg)
    spec = yaml.safe_load((pkg / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = [{"rows": 96, "blocks": 4}]
    (pkg / "problem.yaml").write_text(yaml.safe_dump(spec))
    return str(pkg)


async def _kernel_campaign(settings, problem: str, source: str) -> str:
    """A real matvec_q4_1 campaign through the services: `source` entered as a hand-written kernel, judged like
    any candidate; its campaign id."""
    running = await start_services(settings, grpc=False)
    try:
        planner = cast("PlannerService", running.services["planner"])
        memory = running.services["memory"]
        await _memory_ready(running)
        cid = await planner.submit(pb.CampaignSpec(
            problem=problem, target="cpu", budget_candidates=1, strategy="grid", threads=1, warm_start=0,
            seed=3, manual_sources=[pb.ManualSource(name="plain", source=source, compile_flags="-O2")]))
        while planner.campaigns[cid].finished is None:
            assert running.failed() is None
            await asyncio.sleep(0.2)
        await _wait_archived(memory, cid)
        return cid
    finally:
        await running.shutdown()


def _kinds(events: list[pb.Event]) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in events:
        kind = e.WhichOneof("body")
        out.setdefault(kind, []).append(getattr(e, kind))
    return out


def test_a_campaign_through_the_services_measures_archives_and_writes_best(bus_settings, monkeypatch, tmp_path):
    # a margin that lets both designs contend: the showdown runs whatever the timings
    record, events = _run(bus_settings, 2, showdown=Rule(rounds=2, margin=100.0))
    assert record["campaign_state"] == "completed", record["campaign_reason"]
    kinds = _kinds(events)
    # descent: the default, then its neighbours (where the host has AVX-512 the table decode comes first)
    default = EngineDesign()
    second = EngineDesign(q4_decode="table") if len(q4_decodes_offered()) > 1 else EngineDesign(weights="f32")
    proposed = [EngineDesign.from_dict(json.loads(p.params_json)) for p in kinds["point_proposed"]]
    assert proposed == [default, second]
    assert len(kinds["candidate_created"]) == len(kinds["compiled"]) == len(kinds["verified"]) == 2
    # each design measured once, then the first timed again for the noise figure (one timing round: round 2),
    # then the showdown's two rounds (3 and 4), the fastest first in round 3 and second in round 4
    assert [m.round for m in kinds["measured"]] == [0, 0, 2, 3, 3, 4, 4]
    first = {m.candidate.id: m for m in kinds["measured"] if m.round == 0}
    lead, other = sorted(first, key=lambda c: first[c].score_s)
    assert [m.candidate.id for m in kinds["measured"] if m.round >= 3] == [lead, other, other, lead]
    assert "rejected" not in kinds and "compile_failed" not in kinds
    assert record["noise"]["design_id"] == default.design_id() and record["noise"]["decode_ratio"] > 0
    for m in kinds["measured"]:
        decode, prefill = m.timings
        assert decode.shape == "128" and prefill.shape == "prefill_128"
        assert m.score_s == decode.median_s > 0 and decode.samples == 3 * 32 and m.seconds > 0
    for v in kinds["verified"]:   # every check of the engine verifier, with its figures
        names = [c.shape for c in v.checks]
        assert names[:2] == ["prefill_1", "decode_after_1"] and names[-1] == "greedy_2"
        assert all(c.passed and 0 <= c.norm_rel_err < 1e-4 for c in v.checks)
    # memory archived them like any candidate: its leaderboard ranks the two by seconds per token
    # (by their first measurements: a later round, the noise timing here, is archived as its event only)
    board = Archive(bus_settings.archive()).leaderboard(record["campaign_id"])
    assert sorted(m.score_s for m, _ in board) == sorted(m.score_s for m in kinds["measured"] if m.round == 0)
    # the record and best.json, as the local campaign writes them
    results = record["results"]
    assert [r["design_id"] for r in results] == [default.design_id(), second.design_id()]
    assert [r["verdict"] for r in results] == [VERIFIED, VERIFIED]
    # the showdown: each design's per-round ratio to the lead's, from the Measured events; the winner the higher
    sd = record["showdown"]
    design_of = {c.candidate.id: EngineDesign.from_dict(json.loads(c.candidate.params_json)).design_id()
                 for c in kinds["candidate_created"]}
    assert sd["contenders"] == [design_of[lead], design_of[other]] and sd["faulted"] == []
    tok = {(m.candidate.id, m.round): 1 / m.score_s for m in kinds["measured"]}
    ratio = sum(tok[other, r] / tok[lead, r] for r in (3, 4)) / 2
    assert sd["ratios"][design_of[other]]["decode_ratio"] == pytest.approx(ratio)
    winner = other if ratio > 1 else lead
    assert record["best"]["design_id"] == sd["winner"] == design_of[winner]
    # the planner asked for the rounds before the campaign's end, and its result is the showdown's winner
    (finished,) = kinds["campaign_finished"]
    assert finished.best_candidate_id == winner and finished.counts.measured == 2
    kinds_in_order = [ev.kind_of(e) for e in events]
    assert len(kinds_in_order) - 1 - kinds_in_order[::-1].index("measured") < kinds_in_order.index("campaign_finished")
    # the showdown's timings join the rounds: the winner's figure is the median of its three
    assert record["best"]["decode_tok_s"] == pytest.approx(sorted(tok[winner, r] for r in (0, 3, 4))[1])
    best = load_best("tiny-llama", bus_settings.data_dir)
    assert best is not None and best["design_id"] == record["best"]["design_id"]
    assert best["campaign"] == record["path"]
    # and `kfactory generate`'s engine (rebuilt from best.json: a build-cache lookup) speaks as the reference does
    model = load_model("tiny-llama").open(bus_settings.data_dir / "models")
    ids = model.tokenizer.encode("hello there")
    want = Reference.from_model(model).generate(ids, 12, stop=[model.tokenizer.eos_id]).tokens
    assert list(greedy_tokens("tiny-llama", ids, 12, bus_settings.data_dir)) == want
    # `kfactory export` takes the verified source from beside the object in the build cache, and verifies again
    library = record["best"]["library"]
    assert library.startswith(str(bus_settings.data_dir / "engines")) and library.endswith(".so")
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(bus_settings.data_dir))
    assert main(["export", "tiny-llama", "--format", "c", "--name", "tl", "--out", str(tmp_path / "tl")]) == 0
    manifest = json.loads((tmp_path / "tl" / "manifest.json").read_text())
    assert manifest["design_id"] == best["design_id"]
    assert manifest["verification"]["passed"] and manifest["verification"]["same_object_as_campaign"]


def test_a_device_time_budget_bounds_the_timing_rounds_too(bus_settings):
    """Under a device-time budget the planner's timing rounds and showdown stop where its search stops: here the
    first design's verification and timing spend a 1 ms budget, so nothing more is proposed or re-timed."""
    spec = pipeline.campaign_spec("tiny-llama", 3, max_threads=1, parallel=1, seed=5, rounds=3,
                                  showdown=Rule(rounds=3, margin=100.0))
    spec.budget_device_seconds = 0.001
    record = asyncio.run(engine_services.run_campaign(bus_settings, "tiny-llama", spec, embedded_nats=False))
    assert record["campaign_state"] == "completed", record["campaign_reason"]
    events = Archive(bus_settings.archive()).events(campaign=record["campaign_id"])
    assert [e.measured.round for e in events if e.HasField("measured")] == [0]
    assert record["showdown"] is None and record["noise"] is None and record["best"] is not None
    # an engine compares nothing after its search: its budget keeps no reserve for comparisons
    (start,) = [e.campaign_started for e in events if e.HasField("campaign_started")]
    assert start.compare_reserve_s == 0.0 and start.spec.budget_device_seconds == 0.001


def test_designs_that_fail_are_typed_results(bus_settings, monkeypatch):
    def broken(design, config):
        if design.weights == "f32":
            return generate(design, config) + "\n#error broken on purpose\n"
        if not design.fuse_qkv:
            src = generate(design, config)
            assert src.count(ROPE_OLD) == 1
            return src.replace(ROPE_OLD, ROPE_NEW)
        if not design.fuse_gate_up or design.q4_decode != "convert":
            raise CodegenError("this design cannot be served (test)")
        return generate(design, config)

    # the engine's source as the coder renders it, broken for three designs (and the Q4_1 decodes the host's
    # AVX-512 offers, searched first): everything after it is real
    monkeypatch.setattr(engine_coder, "generate", broken)
    record, events = _run(bus_settings, 3 + len(q4_decodes_offered()))
    assert record["campaign_state"] == "completed", record["campaign_reason"]
    kinds = _kinds(events)
    (failed,) = kinds["compile_failed"]
    assert failed.reason == pb.COMPILE_ERROR and "broken on purpose" in failed.message
    by_stage = {r.stage: r for r in kinds["rejected"]}
    assert set(by_stage) == {"coder", "verifier"}
    assert by_stage["coder"].reason == pb.INVALID_POINT and "codegen failed" in by_stage["coder"].message
    wrong = by_stage["verifier"]
    assert wrong.reason == pb.WRONG_RESULT and "verification failed: decode_after_1" in wrong.message
    first_bad = next(c for c in wrong.checks if not c.passed)
    assert first_bad.shape == "decode_after_1" and first_bad.norm_rel_err > 1e-4
    assert len(kinds["measured"]) == 1
    verdicts = {r["verdict"]: r for r in record["results"]}
    assert set(verdicts) == {VERIFIED, "build_failed", "rejected", "codegen_failed"}
    assert verdicts["rejected"]["failed_check"] == "decode_after_1" and verdicts["rejected"]["decode_tok_s"] is None
    assert "broken on purpose" in verdicts["build_failed"]["reason"]
    assert record["best"]["design_id"] == EngineDesign().design_id()


def test_the_cli_refuses_what_the_planner_would_refuse(tmp_path, monkeypatch, capsys):
    """A model that is none: refused before the services start (the planner would refuse it too)."""
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(["engine", "run", "no-such-model", "--services", "--budget", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kfactory: no model 'no-such-model'") and "Traceback" not in err
    assert not (tmp_path / "archive.sqlite").exists()


def test_engine_run_services_prints_the_report_and_writes_the_record(tmp_path, host_ceilings, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(host_ceilings, data / "ceilings.json")   # the host's bandwidth, measured once per session
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    monkeypatch.setenv("KFACTORY_REPORT_DIR", str(tmp_path / "reports"))
    out_json = tmp_path / "record.json"
    # through the services by default; no kernel campaign ran here, so memory has none to link in
    assert main(["engine", "run", "tiny-llama", "--budget", "1", "--threads", "1", "--rounds", "2",
                 "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    default = EngineDesign().design_id()
    assert ("through the services: budget 1, threads 1..1, 2 timing rounds, a showdown of 9 rounds within x1.15; "
            "engine's own matvec kernels") in out
    assert "no measured matvec_q4_1 kernel in memory" in captured.err
    assert f"[1/1] {default}: verified, decode " in out and f"winner: {default}" in out
    assert "noise: not measured (fewer than two designs were timed)" in out
    record = json.loads(out_json.read_text())
    assert record["services"] and record["campaign_state"] == "completed" and record["max_threads"] == 1
    assert record["rounds"] == 2 and len(record["results"][0]["timings"]) == 2
    assert load_best("tiny-llama", data)["campaign"] == record["path"]
    assert f"campaign {record['campaign_id']}: completed" in out
    report = (tmp_path / "reports" / record["campaign_id"] / "report.md").read_text()   # memory's, as `run` writes
    assert "engine_tiny_llama" in report and "| decode_after_1 | engine |" in report
    # the verification is described as the engine's (fixed prompts against the model's reference), not as draws
    assert "every step's logits compared with the model's float64 reference" in report
    assert "fresh seeds" not in report
    # `kfactory best` of the engine problem says how an engine is taken away: by its model, not a candidate id
    assert main(["best", "engine_tiny_llama"]) == 0
    out = capsys.readouterr().out
    assert "kfactory export tiny-llama --format c|python" in out and "--format c|python|torch" not in out


def test_ctrl_c_of_an_engine_campaign_cancels_it_and_exits_130(tmp_path, host_ceilings):
    """Ctrl-C as a terminal sends it (to the whole process group): the campaign ends cancelled, in the archive
    too, with its record; exit 130; no compile the signal stopped is a handler failure or a compile error."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(host_ceilings, data / "ceilings.json")
    env = {**os.environ, "KFACTORY_DATA_DIR": str(data), "KFACTORY_REPORT_DIR": str(tmp_path / "reports")}
    code, out, err = ctrl_c_when([sys.executable, "-m", "kfactory.cli.main", "engine", "run", "tiny-llama",
                                  "--budget", "24", "--threads", "1"], lambda line: line.startswith("[1/24]"), 180,
                                 env=env, cwd=tmp_path)
    assert code == 130, err
    assert "internal error" not in err and "handler failed" not in err, err
    assert "interrupted: campaign " in err and ": cancelled (interrupted by Ctrl-C)" in out
    status = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "status"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert " cancelled " in status.stdout and " running " not in status.stdout, status.stdout
    events = Archive(data / "archive.sqlite").events()
    failed = [e.compile_failed.message for e in events if e.HasField("compile_failed")]
    assert not failed, failed


def test_kernel_commands_point_an_engine_problem_to_the_engine_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(["run", "engine:tiny-llama", "--budget", "1"]) == 2
    assert "run its campaign with `kfactory engine run tiny-llama`" in capsys.readouterr().err
    assert not (tmp_path / "archive.sqlite").exists()
    assert main(["problems", "check", "engine:tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert "engine_tiny_llama: the model package loads" in out and "kfactory engine run tiny-llama" in out
    assert "reference runs on every distribution" not in out


def test_a_searched_kernel_in_memory_is_linked_and_every_round_is_a_measurement(bus_settings, tmp_path):
    # a verified matvec_q4_1 kernel in memory, as a kernel campaign leaves one (no fake of memory or the judge)
    settings = bus_settings.model_copy(update={"memory_addr": ""})   # the CLI's queries read the workspace
    kcid = asyncio.run(_kernel_campaign(settings, _tiny_matvec_q4_1(tmp_path), Q4_1))
    kernel = from_memory(settings, "matvec_q4_1", 1)   # what `kfactory engine run` takes (--kernels memory)
    verified = {e.verified.candidate.id for e in Archive(settings.archive()).events(campaign=kcid)
                if e.HasField("verified")}
    assert kernel.candidate_id in verified and "void kernel" in kernel.source
    record, events = _run(settings, 2, rounds=2, kernel_ids={"matvec_q4_1": kernel.candidate_id})
    assert record["campaign_state"] == "completed", record["campaign_reason"]
    kinds = _kinds(events)
    default, linked = EngineDesign(), EngineDesign(matvec_q4_1=kernel.candidate_id)
    # the local path's chain: the default, then the default with the searched kernel
    assert [EngineDesign.from_dict(json.loads(p.params_json)) for p in kinds["point_proposed"]] == [default, linked]
    assert [r["verdict"] for r in record["results"]] == [VERIFIED, VERIFIED]
    # the candidate's source is the bundle: the engine's C and the kernel as memory verified it
    created = {EngineDesign.from_dict(json.loads(c.candidate.params_json)): c.candidate
               for c in kinds["candidate_created"]}
    assert unpack(_source(settings, created[linked].source_digest)).kernels == {"matvec_q4_1": kernel}
    assert unpack(_source(settings, created[default].source_digest)).kernels == {}
    # rounds = 2: two Measured events per verified design (rounds 0 and 2), then the default's noise timing
    rounds: dict[str, list[int]] = {}
    for m in kinds["measured"]:
        rounds.setdefault(m.candidate.id, []).append(m.round)
    assert rounds == {created[default].id: [0, 2, 3], created[linked].id: [0, 2]}
    by_id = {r["design_id"]: r for r in record["results"]}
    for design in (default, linked):
        res = by_id[design.design_id()]
        ms = [m for m in kinds["measured"] if m.candidate.id == created[design].id and m.round <= 2]
        assert [t[0] for t in res["timings"]] == pytest.approx([1 / m.score_s for m in ms])
        assert res["decode_tok_s"] == pytest.approx((1 / ms[0].score_s + 1 / ms[1].score_s) / 2)
    noise = record["noise"]
    (last,) = [m for m in kinds["measured"] if m.round == 3]
    assert noise["design_id"] == default.design_id()
    assert noise["decode_ratio"] == pytest.approx((1 / last.score_s) / by_id[default.design_id()]["timings"][0][0])
    # the record keeps the kernel, and the linked design's library is the object the local path builds
    assert record["kernels"]["matvec_q4_1"]["source"] == kernel.source and record["rounds"] == 2
    config = load_model("tiny-llama").open(settings.data_dir / "models").config
    local = build_engine(linked, config, {"matvec_q4_1": kernel}, settings.data_dir / "engines")
    assert local.cached and by_id[linked.design_id()]["library"] == str(local.path)
    # submitted to a running factory, an engine problem's default strategy is descent: the default design first
    from kfactory.cli.main import _spec, build_parser
    engine = _spec(build_parser().parse_args(["submit", "engine:tiny-llama"]))
    assert engine.strategy == "descent"
    # jumping to a clear win as `kfactory engine run` does, unless the submitter says otherwise
    assert dict(engine.strategy_options) == {"jump": repr(JUMP)} == \
        dict(pipeline.campaign_spec("tiny-llama", 1, 1).strategy_options)
    told = _spec(build_parser().parse_args(["submit", "engine:tiny-llama", "--strategy-option", "jump=0"]))
    assert dict(told.strategy_options) == {"jump": "0"}
    # and the timing rounds and showdown of `kfactory engine run`, which the planner asks for after the search
    assert (engine.timing_rounds, engine.showdown_rounds, engine.showdown_margin) == (2, 9, 1.15)
    asked = _spec(build_parser().parse_args(["submit", "engine:tiny-llama", "--rounds", "3", "--showdown", "0"]))
    assert (asked.timing_rounds, asked.showdown_rounds) == (3, 0)
    kernel = _spec(build_parser().parse_args(["submit", "softmax"]))
    assert kernel.strategy == "default" and (kernel.timing_rounds, kernel.showdown_rounds) == (0, 0)

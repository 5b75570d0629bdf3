"""Engine campaigns through the services (issue 26, deliverable 3) on tiny-llama, over a real nats-server with the
real compiler: each design is a candidate the coder renders, the compiler builds, the verifier verifies in the
engine's child and the benchmarker times there; memory archives every event; the record and best.json are the
local campaign's, so `kfactory generate` runs the winner. A design that does not generate, build or verify ends
as a typed result, never an exception."""
from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from kfactory.cli import engine_services
from kfactory.cli.engine import greedy_tokens
from kfactory.cli.main import main
from kfactory.engines import pipeline
from kfactory.engines.campaign import VERIFIED, load_best
from kfactory.engines.codegen import CodegenError, generate
from kfactory.engines.design import EngineDesign
from kfactory.engines.stages import coder as engine_coder
from kfactory.models import Reference, load_model
from kfactory.services.memory.archive import Archive
from kfactory.v1 import events_pb2 as pb

#: NeoX-style RoPE halves instead of GGUF's adjacent pairs (tests/test_engine.py's broken variant)
ROPE_OLD = "#define KF_PAIR(i) (2 * (i))\n#define KF_MATE(i) (2 * (i) + 1)"
ROPE_NEW = "#define KF_PAIR(i) (i)\n#define KF_MATE(i) ((i) + KF_HEAD_DIM / 2)"


def _run(settings, budget: int) -> tuple[dict, list[pb.Event]]:
    spec = pipeline.campaign_spec("tiny-llama", budget, max_threads=1, parallel=2, seed=5)
    record = asyncio.run(engine_services.run_campaign(settings, "tiny-llama", spec, embedded_nats=False))
    events = Archive(settings.archive()).events(campaign=record["campaign_id"])
    return record, events


def _kinds(events: list[pb.Event]) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in events:
        kind = e.WhichOneof("body")
        out.setdefault(kind, []).append(getattr(e, kind))
    return out


def test_a_campaign_through_the_services_measures_archives_and_writes_best(bus_settings, monkeypatch, tmp_path):
    record, events = _run(bus_settings, 2)
    assert record["campaign_state"] == "completed", record["campaign_reason"]
    kinds = _kinds(events)
    default, second = EngineDesign(), EngineDesign(weights="f32")     # the grid takes space() in campaign order
    proposed = [EngineDesign.from_dict(json.loads(p.params_json)) for p in kinds["point_proposed"]]
    assert proposed == [default, second]
    assert len(kinds["candidate_created"]) == len(kinds["compiled"]) == len(kinds["verified"]) == 2
    assert len(kinds["measured"]) == 2 and "rejected" not in kinds and "compile_failed" not in kinds
    for m in kinds["measured"]:
        decode, prefill = m.timings
        assert decode.shape == "128" and prefill.shape == "prefill_128"
        assert m.score_s == decode.median_s > 0 and decode.samples == 3 * 32 and m.seconds > 0
    for v in kinds["verified"]:   # every check of the engine verifier, with its figures
        names = [c.shape for c in v.checks]
        assert names[:2] == ["prefill_1", "decode_after_1"] and names[-1] == "greedy_2"
        assert all(c.passed and 0 <= c.norm_rel_err < 1e-4 for c in v.checks)
    # memory archived them like any candidate: its leaderboard ranks the two by seconds per token
    board = Archive(bus_settings.archive()).leaderboard(record["campaign_id"])
    assert sorted(m.score_s for m, _ in board) == sorted(m.score_s for m in kinds["measured"])
    # the record and best.json, as the local campaign writes them
    results = record["results"]
    assert [r["design_id"] for r in results] == [default.design_id(), second.design_id()]
    assert [r["verdict"] for r in results] == [VERIFIED, VERIFIED]
    fastest = min(kinds["measured"], key=lambda m: m.score_s)
    assert record["best"]["decode_tok_s"] == pytest.approx(1 / fastest.score_s)
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


def test_designs_that_fail_are_typed_results(bus_settings, monkeypatch):
    def broken(design, config):
        if design.weights == "f32":
            return generate(design, config) + "\n#error broken on purpose\n"
        if not design.fuse_qkv:
            src = generate(design, config)
            assert src.count(ROPE_OLD) == 1
            return src.replace(ROPE_OLD, ROPE_NEW)
        if not design.fuse_gate_up:
            raise CodegenError("this design cannot be served (test)")
        return generate(design, config)

    # the engine's source as the coder renders it, broken for three designs: everything after it is real
    monkeypatch.setattr(engine_coder, "generate", broken)
    record, events = _run(bus_settings, 4)
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
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(["engine", "run", "no-such-model", "--services", "--budget", "1"]) == 2
    err = capsys.readouterr().err
    assert "problem: engine: no model 'no-such-model'" in err and "Traceback" not in err
    assert not (tmp_path / "archive.sqlite").exists()


def test_engine_run_services_prints_the_report_and_writes_the_record(tmp_path, host_ceilings, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(host_ceilings, data / "ceilings.json")   # the host's bandwidth, measured once per session
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    monkeypatch.setenv("KFACTORY_REPORT_DIR", str(tmp_path / "reports"))
    out_json = tmp_path / "record.json"
    assert main(["engine", "run", "tiny-llama", "--services", "--budget", "1", "--threads", "1",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    default = EngineDesign().design_id()
    assert f"[1/1] {default}: verified, decode " in out and f"winner: {default}" in out
    assert "noise: not measured (through the services each design is timed once)" in out
    record = json.loads(out_json.read_text())
    assert record["services"] and record["campaign_state"] == "completed" and record["max_threads"] == 1
    assert load_best("tiny-llama", data)["campaign"] == record["path"]
    assert f"campaign {record['campaign_id']}: completed" in out
    report = (tmp_path / "reports" / record["campaign_id"] / "report.md").read_text()   # memory's, as `run` writes
    assert "engine_tiny_llama" in report and "| decode_after_1 | engine |" in report

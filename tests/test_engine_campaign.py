"""Engine campaigns (kfactory/engines/campaign.py) and `kfactory engine run` / `kfactory generate` on tiny-llama:
a budget of 3 gives 3 verified, measured designs, best.json and per-field effects; a design that does not build
and one that computes the wrong function are kept as rejected results with their reasons and never win;
`kfactory generate` streams the float64 reference's greedy tokens."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from kfactory.cli.engine import greedy_tokens
from kfactory.cli.main import main
from kfactory.engines.campaign import (NOT_MEASURED, SPIN_MARGIN, Campaign, DesignResult, distance, load_best, order,
                                       report_text, write_record)
from kfactory.engines.codegen import generate
from kfactory.engines.design import EngineDesign, q4_decodes_offered, space
from kfactory.engines.showdown import Rule
from kfactory.models import Reference

#: NeoX-style RoPE halves instead of GGUF's adjacent pairs (as tests/test_engine.py's broken variant)
ROPE_OLD = "#define KF_PAIR(i) (2 * (i))\n#define KF_MATE(i) (2 * (i) + 1)"
ROPE_NEW = "#define KF_PAIR(i) (i)\n#define KF_MATE(i) ((i) + KF_HEAD_DIM / 2)"


@pytest.fixture(scope="module")
def record(root, verifier):
    # a margin that lets every verified design contend: the showdown runs whatever the timings; no jump, so the
    # designs are the default's first neighbours whatever tiny-llama's timings say
    return Campaign("tiny-llama", 3, data_dir=root, verifier=verifier, rounds=2,
                    showdown=Rule(rounds=2, margin=100.0), jump=0.0).run()


def test_order_covers_fields_early():
    points = order(space(2, avx512=False))
    assert points[0] == EngineDesign()
    # more threads are one step however their idle threads wait, sharing a step in one region (spin, wait and
    # team apply to threads > 1 only)
    threads = [EngineDesign(threads=2, spin=spin, wait=wait, team="step")
               for spin, wait in ((False, "passive"), (True, "passive"), (False, "bounded"))]
    ones = [d for d in points if distance(d, EngineDesign()) == 1 or d in threads]
    assert points[1:1 + len(ones)] == ones          # every one-step change before any two-step change
    assert len(ones) == 6 + 3 and points[5:8] == threads
    assert points[1].weights == "f32" and not points[2].fuse_qkv
    assert sorted(points, key=lambda d: d.design_id()) == sorted(space(2, avx512=False), key=lambda d: d.design_id())
    # with AVX-512 the table decode is one more one-step change, the last (q4_decode is the last field), and with
    # AVX512-VNNI the integer decode after it
    wide = order(space(2, avx512=True, vnni=False))
    assert wide[:len(ones) + 2] == [*points[:len(ones) + 1], EngineDesign(q4_decode="table")]
    widest = order(space(2, avx512=True, vnni=True))
    assert widest[:len(ones) + 3] == [*wide[:len(ones) + 2], EngineDesign(q4_decode="vnni")]


def test_budget_3_verifies_measures_and_names_the_best(root, record):
    results = record["results"]
    assert [r["verdict"] for r in results] == ["verified"] * 3
    assert all(r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0 for r in results)
    # two rounds, then two showdown rounds among all three; the figures are the medians of the four
    assert all(len(r["timings"]) == 4 for r in results)
    decodes = sorted(t[0] for t in results[0]["timings"])
    assert results[0]["decode_tok_s"] == pytest.approx((decodes[1] + decodes[2]) / 2)
    sd = record["showdown"]
    ids = [r["design_id"] for r in sorted(results, key=lambda r: -r["timings"][1][0] - r["timings"][0][0])]
    assert sd["contenders"] == ids and sd["rounds"] == 2 and sd["faulted"] == [] and sd["reference"] == ids[0]
    by_id = {r["design_id"]: r for r in results}
    for i in ids:   # the showdown's timings are each design's last two, its ratios per round to the reference's
        assert sd["timings"][i] == by_id[i]["timings"][2:]
        want = sum(t[0] / r[0] for t, r in zip(sd["timings"][i], sd["timings"][ids[0]])) / 2
        assert sd["ratios"][i]["decode_ratio"] == pytest.approx(want) and sd["ratios"][i]["rounds"] == 2
    # no design spins here: the winner is the highest ratio, whatever the medians say
    best = by_id[max(ids, key=lambda i: (sd["ratios"][i]["decode_ratio"], sd["ratios"][i]["prefill_ratio"]))]
    assert record["best"]["design_id"] == best["design_id"] == sd["winner"]
    on_disk = load_best("tiny-llama", root)
    assert on_disk is not None and on_disk["design_id"] == best["design_id"]
    saved = json.loads(open(record["path"]).read())
    assert saved["path"].startswith(str(root / "engines" / "tiny-llama" / "campaign-"))
    assert len(saved["results"]) == 3
    eff = record["effects"]
    # the default and its first two neighbours: weights=f32, fuse_qkv=False; with AVX-512 the Q4_1 decodes come
    # first (the table, then with AVX512-VNNI the integer one, else weights=f32): one pair for each value tried,
    # the rest unmeasured
    tried = {"weights": ["f32"], "fuse_qkv": [False]}
    if len(q4_decodes_offered()) > 1:
        tried = {"q4_decode": list(q4_decodes_offered()[1:3])}
        tried.update({"weights": ["f32"]} if len(tried["q4_decode"]) == 1 else {})
    measured = tuple(tried)
    for name, values in tried.items():
        assert len(eff[name]["values"]) == len(values)
        for value in eff[name]["values"].values():
            assert value["pairs"] == 1 and value["decode_ratio"] > 0 and value["prefill_ratio"] > 0
    for name in {"fuse_qkv", "fuse_gate_up", "fuse_norm", "threads", "kv_layout", "prepack", "spin"} - set(measured):
        assert eff[name]["values"] == NOT_MEASURED
    # the default timed again at the end: how far the host's load alone moves a figure
    assert record["noise"]["design_id"] == EngineDesign().design_id() and record["noise"]["decode_ratio"] > 0
    text = report_text(record)
    assert f"winner: {best['design_id']}" in text and "fuse_norm     (only true tried): not measured" in text
    assert "noise: " + EngineDesign().design_id() in text
    assert "showdown: 3 closest designs timed alternately in 2 rounds" in text


def _timed(design: EngineDesign, decode: float) -> DesignResult:
    r = DesignResult(design.as_dict(), design.design_id(), "verified")
    r.add_timing(decode, 500.0)
    return r


@pytest.mark.parametrize("lead, spinning_wins", [(1.05, False), (SPIN_MARGIN - 0.01, False), (1.20, True)])
def test_a_spinning_design_wins_only_by_more_than_the_margin(tmp_path, lead, spinning_wins):
    calm = EngineDesign(threads=2, wait="bounded")
    spin = EngineDesign(threads=2, spin=True)
    results = [_timed(EngineDesign(), 100.0), _timed(calm, 180.0), _timed(spin, 180.0 * lead)]
    record = write_record(tmp_path, {"model": "m", "target": "cpu", "started": "t"}, results, {})
    want = spin if spinning_wins else calm
    assert record["best"]["design_id"] == want.design_id() == load_best_id(tmp_path)
    assert record["fastest"]["design_id"] == spin.design_id()
    text = report_text({**record, "effects": {}})
    assert ("passed over: " + spin.design_id()) in text if not spinning_wins else "passed over" not in text


@pytest.mark.parametrize("lead, spinning_wins", [(1.05, False), (SPIN_MARGIN - 0.01, False), (1.20, True)])
def test_the_services_name_the_winner_best_json_names(lead, spinning_wins):
    """Through the services the planner's campaign result (CampaignFinished.best_candidate_id, `kfactory run`'s
    best) takes the engine problem's rule: the same designs and speeds as above give the same winner."""
    from kfactory.engines.problem import load_engine_problem, locator
    from kfactory.services.planner.campaign import CampaignState
    from kfactory.v1 import events_pb2 as pb

    calm, spin = EngineDesign(threads=2, wait="bounded"), EngineDesign(threads=2, spin=True)
    st = CampaignState("c1", pb.CampaignSpec(), pb.DeviceInfo(), None,
                       winner=load_engine_problem(locator("tiny-llama")).winner)
    for design, tok_s in ((EngineDesign(), 100.0), (calm, 180.0), (spin, 180.0 * lead)):
        cand = pb.Candidate(id=design.design_id(), params_json=json.dumps(design.as_dict()))
        st.measured[cand.id] = pb.Measured(candidate=cand, score_s=1.0 / tok_s)
    assert st.best().candidate.id == (spin if spinning_wins else calm).design_id()
    # without the problem's rule (a problem that no longer loads): the fastest
    assert CampaignState("c2", pb.CampaignSpec(), pb.DeviceInfo(), None, measured=st.measured).best() \
        .candidate.id == spin.design_id()


def test_a_spinning_design_wins_when_nothing_else_verified(tmp_path):
    spin = EngineDesign(threads=2, spin=True)
    rejected = DesignResult(EngineDesign().as_dict(), EngineDesign().design_id(), "rejected")
    record = write_record(tmp_path, {"model": "m", "target": "cpu", "started": "t"}, [rejected, _timed(spin, 90.0)], {})
    assert record["best"]["design_id"] == spin.design_id() == load_best_id(tmp_path)


def load_best_id(out) -> str:
    return json.loads((out / "best.json").read_text())["design_id"]


def test_broken_designs_are_rejected_with_reasons(tmp_path, verifier):
    def source_for(design, config):
        # every design but the default broken: f32 weights and the Q4_1 decodes (AVX-512 hosts search them
        # before the weights) do not build, the rest compute RoPE on the wrong pairs
        src = generate(design, config)
        if design == EngineDesign():
            return src
        if design.weights == "f32" or design.q4_decode != "convert":
            return src + "\n#error broken on purpose\n"
        assert src.count(ROPE_OLD) == 1
        return src.replace(ROPE_OLD, ROPE_NEW)

    rec = Campaign("tiny-llama", 3 + len(q4_decodes_offered()), data_dir=tmp_path, verifier=verifier,
                   source_for=source_for).run()
    by_verdict = {r["verdict"]: r for r in rec["results"]}
    assert set(by_verdict) == {"verified", "build_failed", "rejected"}
    assert "broken on purpose" in by_verdict["build_failed"]["reason"]
    assert by_verdict["rejected"]["failed_check"] == "decode_after_1"
    assert "verification failed: decode_after_1" in by_verdict["rejected"]["reason"]
    assert by_verdict["rejected"]["decode_tok_s"] is None
    assert rec["best"]["design_id"] == EngineDesign().design_id()
    assert load_best("tiny-llama", tmp_path)["design_id"] == EngineDesign().design_id()
    # one verified design: no pair, so no effect is measured (values tried are listed, as not measured)
    for e in rec["effects"].values():
        assert e["values"] == NOT_MEASURED or set(e["values"].values()) == {NOT_MEASURED}
    assert rec["effects"]["weights"]["values"] == {'"f32"': NOT_MEASURED}
    assert rec["noise"] is None


def test_generate_streams_the_reference_greedy_tokens(root, record, verifier, monkeypatch, capsys):
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(root))
    model = verifier.model
    tok, eos = model.tokenizer, model.tokenizer.eos_id
    ids = tok.encode(tok.chat([{"role": "user", "content": "hello there"}]))
    want = Reference.from_model(model).generate(ids, 24, stop=[eos]).tokens
    assert list(greedy_tokens("tiny-llama", ids, 24, root)) == want
    assert main(["generate", "tiny-llama", "hello there", "--max-tokens", "24"]) == 0
    out = capsys.readouterr()
    assert out.out == tok.decode(want, skip_special=True) + "\n"
    assert "tokens/s" in out.err


@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_generate_says_when_its_tokens_cannot_be_written(root, record, stdout):
    """A full disk (/dev/full) or a standard output closed before it started (`>&-`): one line and exit 1, not
    an internal error (the closed one let the engine child's pipe take fd 1)."""
    env = {**os.environ, "KFACTORY_DATA_DIR": str(root)}
    argv = [sys.executable, "-m", "kfactory.cli.main", "generate", "tiny-llama", "hi", "--max-tokens", "4"]
    with open("/dev/full", "w") as full:
        out = subprocess.run(argv, env=env, stderr=subprocess.PIPE, text=True, timeout=300,
                             **({"stdout": full} if stdout == "full" else {"preexec_fn": lambda: os.close(1)}))
    said = {"full": "cannot write the tokens to standard output: No space left on device",
            "closed": "standard output is closed"}[stdout]
    assert out.returncode == 1 and said in out.stderr and "internal error" not in out.stderr, out.stderr


def test_generate_refuses_without_a_campaign(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(["generate", "tiny-llama", "hi"]) == 1
    assert "kfactory engine run tiny-llama" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "empty", "a list", "no design", "a bad design", "another id"])
def test_a_damaged_best_json_is_named_with_what_to_run(root, record, tmp_path, monkeypatch, capsys, damage):
    """best.json cut short, emptied or edited: generate and export say which file and what to run (exit 1), not
    an internal error; the record's own best is untouched."""
    data = tmp_path / "data"
    shutil.copytree(root, data, ignore=shutil.ignore_patterns("*.npz"))
    best = data / "engines" / "tiny-llama" / "best.json"
    good = json.loads(best.read_text())
    text = {"truncated": best.read_text()[:200], "empty": "", "a list": "[]",
            "no design": json.dumps({k: v for k, v in good.items() if k != "design"}),
            "a bad design": json.dumps({**good, "design": {**good["design"], "threads": 0}}),
            "another id": json.dumps({**good, "design_id": "q4_1-other-0000000000"})}[damage]
    best.write_text(text)
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(data))
    assert main(["generate", "tiny-llama", "hi", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert str(best) in err and "kfactory engine run tiny-llama" in err and "internal error" not in err
    assert main(["export", "tiny-llama", "--format", "c", "--name", "tl", "--out", str(tmp_path / "ex")]) == 1
    err = capsys.readouterr().err
    assert str(best) in err and "internal error" not in err
    assert not (tmp_path / "ex").exists()


@pytest.mark.parametrize("local", [True, False], ids=["local", "services"])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_campaign(tmp_path, monkeypatch, capsys, local):
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path / "data"))
    argv = ["engine", "run", "tiny-llama", "--budget", "1", "--json", str(tmp_path)] + (["--local"] if local else [])
    assert main(argv) == 2
    assert f"--json {tmp_path}: is a directory; name a file" in capsys.readouterr().err
    assert not (tmp_path / "data" / "engines").exists()


def test_engine_run_local_runs_the_campaign_in_this_process(tmp_path, monkeypatch, capsys):
    """`--local` keeps the in-process path (the services are the default): no events, no archive."""
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    out_json = tmp_path / "record.json"
    assert main(["engine", "run", "tiny-llama", "--local", "--budget", "1", "--threads", "1", "--rounds", "1",
                 "--kernels", "builtin", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    default = EngineDesign().design_id()
    # the one-thread space: 64 designs, and the other Q4_1 decodes of the 16 prepacked Q4_1 ones where AVX-512 is
    assert len(space(1)) == 64 + 16 * (len(q4_decodes_offered()) - 1)
    assert (f"engine campaign tiny-llama: 1 of {len(space(1))} designs, by descent (budget 1, threads 1..1, 1 timing "
            "round, a showdown of 9 rounds within x1.15)") in out
    assert f"[1/1] {default}: verified" in out and f"winner: {default}" in out
    record = json.loads(out_json.read_text())
    assert "services" not in record and record["results"][0]["decode_tok_s"] > 0
    assert record["showdown"] is None    # one design: nothing to decide
    assert record["showdown_rule"] == {"rounds": 9, "size": 3, "margin": 1.15}
    assert load_best("tiny-llama", tmp_path)["campaign"] == record["path"]
    assert not (tmp_path / "archive.sqlite").exists()


@pytest.mark.parametrize("flags", [["--showdown", "-1"], ["--showdown-margin", "0.5"], ["--showdown-margin", "nan"],
                                   ["--showdown-margin", "inf"]])
@pytest.mark.parametrize("where", [["--local"], []])
def test_a_showdown_flag_out_of_range_is_a_usage_error(tmp_path, monkeypatch, capsys, flags, where):
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(["engine", "run", "tiny-llama", *where, "--budget", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert "--showdown/--showdown-margin: " in err and ("rounds" in err or "margin" in err)
    assert not (tmp_path / "engines").exists()


def test_a_contender_that_faults_in_the_showdown_is_out(root, verifier, tmp_path):
    """A design whose library is gone by the showdown (a real load failure in its child) is bench_failed and out;
    the other is timed in every round and wins."""
    campaign = Campaign("tiny-llama", 2, data_dir=root, verifier=verifier, showdown=Rule(rounds=2, margin=100.0))
    campaign.results = [campaign.evaluate(EngineDesign()), campaign.evaluate(EngineDesign(weights="f32"))]
    stays, gone = campaign.results
    assert stays.verified and gone.verified
    copy = tmp_path / "gone.so"
    shutil.copy(gone.library, copy)
    gone.library = str(copy)
    copy.unlink()
    sd = campaign.run_showdown(None)
    assert sd is not None and sd["faulted"] == [gone.design_id] and sd["winner"] == sd["reference"] == stays.design_id
    assert sd["timings"][gone.design_id] == [None, None] and all(t is not None for t in sd["timings"][stays.design_id])
    assert gone.verdict == "bench_failed" and "load_failed" in gone.reason and gone.decode_tok_s is None
    assert len(stays.timings) == 3 and stays.verified


def test_a_campaign_takes_the_median_prefill_repeat_as_the_benchmarker_does():
    from kfactory.engines.runner import BenchFigures
    from kfactory.engines.stages.benchmarker import timing

    fig = BenchFigures(128, [1.0, 0.5, 2.0], [0.01, 0.02, 0.03])
    assert fig.prefill_median_tok_s == 128.0 and fig.prefill_tok_s == 256.0 and fig.decode_tok_s == 50.0
    # the services' figure: 1 / the median per-token seconds of the benchmarker's prefill timing
    assert 1.0 / timing("prefill_128", [s / 128 for s in fig.prefill_s]).median_s == pytest.approx(128.0)


@pytest.mark.parametrize("flag", [["--threads", "0"], ["--threads", "100000"]])
@pytest.mark.parametrize("where", [["--local"], []])
def test_a_threads_flag_out_of_range_is_the_engine_s_error_not_a_setting_s(tmp_path, monkeypatch, capsys, flag,
                                                                           where):
    """`engine run --threads` is the engine's own flag: its error says what it must be, before anything else (a
    note that suggested a command with the same bad value), and never names KFACTORY_THREADS (a setting the user
    never set, which the flag once reached through the CLI's settings)."""
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(["engine", "run", "tiny-llama", *where, "--budget", "1", *flag]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"kfactory: --threads must lie in 1\.\.\d+, not {flag[1]}\n", err), err
    assert not (tmp_path / "engines").exists()


@pytest.mark.parametrize("argv", [["engine", "run", "no-such-model", "--local"], ["engine", "run", "no-such-model"],
                                  ["generate", "no-such-model", "hi"]])
def test_a_mistyped_model_is_a_usage_error_told_before_anything_starts(tmp_path, monkeypatch, capsys, argv):
    """A model that is no built-in and no package directory exited 1, as a package that fails to load does; the
    services' campaign announced itself and started NATS before its planner refused it."""
    monkeypatch.setenv("KFACTORY_DATA_DIR", str(tmp_path))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kfactory: no model 'no-such-model': not a directory with model.yaml, nor a "
                                        "built-in model (built-in: "), (out, err)
    assert not list(tmp_path.iterdir())

"""bench/engine.py on the tiny config: kfactory's engine beside the numpy reference, tiny contexts and steps,
the host's ceilings fixed (no probe runs): the JSON's shape, positive figures, and speedup_vs as the ratio of the
two decode figures."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "engine.py"
CEILINGS = {"read_bandwidth_gbps": 14.0, "mem_bandwidth_gbps": 10.0, "peak_gflops": 50.0}


def _load():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("engine_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_engine_bench_tiny(tmp_path, monkeypatch, capsys):
    bench = _load()
    monkeypatch.setattr(bench, "host_ceilings", lambda threads, settings=None: dict(CEILINGS))
    out_path = tmp_path / "bench.json"
    rc = bench.main(["--model", "tiny-llama", "--only", "numpy-ref", "--threads", "1", "--contexts", "8,16",
                     "--prefill", "16", "--steps", "2", "--repeats", "1", "--design", "{}", "--paired-rounds", "0",
                     "--json", str(out_path)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "kfactory" in printed and "numpy-ref" in printed
    # both rooflines printed: the read figure's (the decode's own) and the copy figure's beside it
    assert "ceilings at 1 threads: read 14.0 GB/s, copy 10.0 GB/s" in printed
    assert "roof (read)" in printed and "roof (copy)" in printed
    out = json.loads(out_path.read_text())
    assert out["ceilings"] == {"1": CEILINGS}
    k = out["kfactory"]
    for key in ("decode_tokens_per_s", "prefill_tokens_per_s", "roofline_fraction", "greedy_identical",
                "speedup_vs", "peak_rss_mb", "design_source"):
        assert key in k, key
    assert k["status"] == "ok", k["reason"]
    assert k["design_source"] == "--design"
    assert set(k["decode_tokens_per_s"]) == {"8", "16"}
    assert all(v > 0 for v in k["decode_tokens_per_s"].values())
    assert k["prefill_tokens_per_s"] > 0 and k["peak_rss_mb"] > 0
    assert set(k["roofline_fraction"]) == {"8", "16", "prefill_16"}
    assert all(v > 0 for v in k["roofline_fraction"].values())
    assert k["greedy_identical"] is True
    names = [r["name"] for r in out["results"]]
    assert names == ["kfactory", "numpy-ref"]
    ref = out["results"][1]
    assert ref["status"] == "ok", ref["reason"]
    assert all(v > 0 for v in ref["decode_tokens_per_s"].values())
    assert set(k["speedup_vs"]) == {"numpy-ref"}
    assert k["speedup_vs"]["numpy-ref"] == pytest.approx(
        k["decode_tokens_per_s"]["8"] / ref["decode_tokens_per_s"]["8"])


def test_engine_open_bench_times_both_arms(tmp_path):
    """bench/engine_open.py on the tiny config: both arms timed, the child's open and prepare times kept."""
    spec = importlib.util.spec_from_file_location("engine_open_bench", BENCH.parent / "engine_open.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out_path = tmp_path / "open.json"
    assert mod.main(["--model", "tiny-llama", "--repeats", "2", "--json", str(out_path)]) == 0
    out = json.loads(out_path.read_text())
    assert out["repeats"] == 2 and out["speedup"] > 0
    for arm in ("parse", "index"):
        fig = out[arm]
        assert fig["start_s"] > 0 and 0 <= fig["open_s"] + fig["prepare_s"] < fig["start_s"]


def test_engine_bench_pairs_decode_with_the_read_probe(tmp_path, capsys):
    """--paired-rounds: each round's decode bursts at the first context between real read probes run in the
    engine's child, each burst's fraction against the larger probe beside it (the other ceilings the run's) at
    the positions its steps attend, a round's fraction its bursts' median, and the rounds' median in the
    summary."""
    bench = _load()
    out_path = tmp_path / "bench.json"
    rc = bench.main(["--model", "tiny-llama", "--only", "", "--threads", "1", "--contexts", "8,16",
                     "--prefill", "0", "--steps", "2", "--repeats", "1", "--design", "{}", "--no-greedy",
                     "--paired-rounds", "2", "--paired-bursts", "3", "--fresh-ceilings", "--json", str(out_path)])
    assert rc == 0
    out = json.loads(out_path.read_text())
    ours = out["results"][0]
    paired = ours["roofline_paired"]
    assert paired["context"] == "8" and paired["burst_steps"] == 2 and len(paired["rounds"]) == 2
    ceilings = out["ceilings"]["1"]
    for r in paired["rounds"]:
        # 4 probes around 3 bursts, each at 1 thread (the engine's count), every figure a real pass
        assert len(r["reads_gbps"]) == 4 and all(len(p) == 1 and p[0] > 0 for p in r["reads_gbps"])
        assert [b["context"] for b in r["bursts"]] == [8, 10, 12]
        for i, b in enumerate(r["bursts"]):
            assert b["read_gbps"] == max(r["reads_gbps"][i][0], r["reads_gbps"][i + 1][0])
            assert b["decode_tokens_per_s"] > 0
            expected = bench.paired_fraction(ours, ceilings, b["context"], b["read_gbps"],
                                             1 / b["decode_tokens_per_s"], 2)
            assert b["fraction"] == pytest.approx(expected)
            # against a read bandwidth twice as high, the memory side halves; the fraction never grows
            assert bench.paired_fraction(ours, ceilings, b["context"], 2 * b["read_gbps"],
                                         1 / b["decode_tokens_per_s"], 2) <= expected
        assert r["fraction"] == sorted(b["fraction"] for b in r["bursts"])[1]
    fracs = sorted(r["fraction"] for r in paired["rounds"])
    assert paired["fraction_median"] == pytest.approx(sum(fracs) / 2)
    assert (paired["fraction_min"], paired["fraction_max"]) == (fracs[0], fracs[-1])
    assert out["kfactory"]["roofline_fraction_paired"] == paired["fraction_median"]
    assert "decode from 8 tokens in bursts of 2 steps between read probes" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [
    (["--paired-bursts", "0"], "bursts 1 or more"),
    (["--paired-rounds", "-1"], "rounds are 0 (none) or more"),
    (["--paired-bursts", "200", "--steps", "2", "--contexts", "8"],
     "--paired-bursts 200 of 2 steps after 8 tokens exceed tiny-llama's context (256 tokens): 124 at most"),
    (["--contexts", "128,1024"], "--contexts up to 1024 + 32 decode steps exceed tiny-llama's context (256 tokens)"),
    (["--contexts", "8,x"], "comma-separated whole numbers"),
    (["--design", "{bad"], "--design is not JSON"),
    (["--design", '{"nope": 1}'], "unknown design field(s) nope"),
    (["--model", "nosuch"], "no model 'nosuch'"),
    (["--json", "/nonexistent/x.json"], "its directory does not exist"),
])
def test_the_engine_bench_refuses_a_users_mistake_before_running(args, says, capsys):
    """bench/engine.py's flags that cannot run stop it at parsing, before anything is timed, saying why."""
    bench = _load()
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--model", "tiny-llama", "--only", "", "--design", "{}", "--no-greedy", *args])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_the_engine_bench_fits_its_default_paired_bursts_to_the_models_context():
    bench = _load()
    base = ["--model", "tiny-llama", "--only", "", "--design", "{}"]
    assert bench.parse(base + ["--contexts", "128"]).paired_bursts == 4          # (256 - 128) // 32
    assert bench.parse(base + ["--contexts", "8", "--steps", "2"]).paired_bursts == bench.PAIRED_BURSTS
    assert bench.parse(base + ["--contexts", "128", "--paired-bursts", "3"]).paired_bursts == 3


def _bench_module(name: str):
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location(f"{name}_bench", BENCH.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_engine_ops_bench_times_every_op_inside_the_step(tmp_path):
    """bench/engine_ops.py on the tiny config: the -DKF_PROFILE build times each op of a decode step, every op
    runs once a layer (each slot above zero), the ops' sum lies within the step, and the GB/s of an op is its
    bytes over its time."""
    mod = _bench_module("engine_ops")
    out_path = tmp_path / "ops.json"
    assert mod.main(["--model", "tiny-llama", "--design", "{}", "--threads", "1", "--context", "8", "--steps", "4",
                     "--rounds", "2", "--json", str(out_path)]) == 0
    out = json.loads(out_path.read_text())
    assert len(out["rounds"]) == 2
    for r in out["rounds"]:
        assert set(r["op_s"]) == set(mod.OPS) and all(v > 0 for v in r["op_s"].values()), r["op_s"]
        assert sum(r["op_s"].values()) < r["step_s"] and r["read_gbps"] > 0
        assert set(r["op_gbps"]) == {"qkv", "o", "gate_up", "down", "head", "attention"}


def test_the_timed_build_computes_what_the_engine_does(tmp_path):
    """-DKF_PROFILE adds timers and nothing else: the tiny engine's logits over a prefill and decode steps are
    bit-identical to the plain build's."""
    import numpy as np

    from kfactory.engines.abi import Engine
    from kfactory.engines.design import EngineDesign
    from kfactory.engines.ops import build_engine
    from kfactory.engines.prepare import arena
    from kfactory.models import load_model
    from kfactory.platform.config import Settings

    design = EngineDesign()
    model = load_model("tiny-llama").open(Path(Settings().data_dir) / "models")
    tensors = arena(model, design)
    runs = []
    for flags in ((), ("-DKF_PROFILE",)):
        lib = build_engine(design, model.config, {}, tmp_path, flags)
        assert lib.ok, lib.log[-2000:]
        eng = Engine(str(lib.path), tensors, model.config, 32, 1)
        out = np.empty(model.config.vocab, np.float32)
        rows = [eng.prefill([5, 9, 2, 7, 1]).copy()]
        for t in (3, 8, 4):
            eng.decode(t, out)
            rows.append(out.copy())
        eng.free()
        runs.append(np.stack(rows))
    assert np.array_equal(runs[0], runs[1])


def test_engine_scaling_bench_sets_the_engine_against_the_probe_at_each_count(tmp_path):
    """bench/engine_scaling.py on the tiny config, one round: the probes and both engines measured, each engine's
    tok/s turned into GB/s by the step's bytes, and the N-thread figure set against the N-thread probe."""
    mod = _bench_module("engine_scaling")
    out_path = tmp_path / "scaling.json"
    assert mod.main(["--model", "tiny-llama", "--design", "{}", "--threads", "2", "--context", "8", "--steps", "4",
                     "--rounds", "1", "--json", str(out_path)]) == 0
    out = json.loads(out_path.read_text())
    (r,) = out["rounds"]
    assert r["read_1_gbps"] > 0 and r["read_2_gbps"] > 0 and r["int8_2_gops"] >= 0
    for n in (1, 2):
        assert r[f"engine_{n}_gbps_equiv"] == pytest.approx(r[f"engine_{n}_tok_s"] * out["step_bytes"] / 1e9)
    assert r["engine_over_read"] == pytest.approx(r["engine_2_gbps_equiv"] / r["read_2_gbps"])
    assert out["summary"]["correlation_read_engine"] is None   # one round: no correlation to speak of


@pytest.mark.parametrize("bench", ["engine_ops", "engine_scaling"])
@pytest.mark.parametrize("args, says", [
    (["--design", "{bad"], "--design is not JSON"),
    (["--design", "[]"], "must be a JSON object"),
    (["--design", '{"nope": 1}'], "unknown design field(s) nope"),
    (["--model", "nosuch"], "no model 'nosuch'"),
    (["--context", "1000"], "exceeds tiny-llama's context (256 tokens)"),
    (["--json", "/nonexistent/x.json"], "its directory does not exist"),
])
def test_the_engine_benches_refuse_a_users_mistake_before_running(bench, args, says, capsys):
    mod = _bench_module(bench)
    base = ["--model", "tiny-llama", "--design", "{}", "--threads", "2", "--rounds", "1"]
    with pytest.raises(SystemExit) as exit_:
        mod.main(base + args)
    assert exit_.value.code == 2 and says in capsys.readouterr().err

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
    """--paired-rounds: each decode run at the first context between two real read probes, its fraction against
    the larger of them (the other ceilings the run's), and the median of the rounds in the summary."""
    bench = _load()
    out_path = tmp_path / "bench.json"
    rc = bench.main(["--model", "tiny-llama", "--only", "", "--threads", "1", "--contexts", "8,16",
                     "--prefill", "0", "--steps", "2", "--repeats", "1", "--design", "{}", "--no-greedy",
                     "--paired-rounds", "2", "--fresh-ceilings", "--json", str(out_path)])
    assert rc == 0
    out = json.loads(out_path.read_text())
    ours = out["results"][0]
    paired = ours["roofline_paired"]
    assert paired["context"] == "8" and len(paired["rounds"]) == 2
    ceilings = out["ceilings"]["1"]
    for r in paired["rounds"]:
        assert r["read_before_gbps"] > 0 and r["read_after_gbps"] > 0 and r["decode_tokens_per_s"] > 0
        read = max(r["read_before_gbps"], r["read_after_gbps"])
        expected = bench.paired_fraction(ours, ceilings, 8, read, 0.0, 1 / r["decode_tokens_per_s"])
        assert r["fraction"] == pytest.approx(expected)
        # against a read bandwidth twice as high, the memory side halves; the fraction never grows
        assert bench.paired_fraction(ours, ceilings, 8, 2 * read, 0.0, 1 / r["decode_tokens_per_s"]) <= expected
    fracs = sorted(r["fraction"] for r in paired["rounds"])
    assert paired["fraction_median"] == pytest.approx(sum(fracs) / 2)
    assert (paired["fraction_min"], paired["fraction_max"]) == (fracs[0], fracs[-1])
    assert out["kfactory"]["roofline_fraction_paired"] == paired["fraction_median"]
    assert "decode@8 between read probes" in capsys.readouterr().out

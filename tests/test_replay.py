"""The replay target: recorded Kernel Tuner spaces loaded, served through the pipeline, and a real campaign."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kfactory.replay import load_space

SPACES = Path(__file__).resolve().parents[1] / "shared" / "data" / "tuning-spaces"
if not SPACES.is_dir():
    SPACES = Path("/work/shared/data/tuning-spaces")
CONV_A100 = SPACES / "convolution_milo-A100.json.gz"

# (records, {failure: count}) per shared space, counted once from the files
EXPECTED = {
    "convolution_milo-A100": (4362, {"RuntimeFailedConfig": 155, "CompilationFailedConfig": 6}),
    "convolution_milo-A4000": (4362, {"RuntimeFailedConfig": 155, "CompilationFailedConfig": 6}),
    "convolution_milo-MI250X": (4362, {}),
    "dedispersion_milo-A100": (11130, {}),
    "dedispersion_milo-MI250X": (11130, {}),
}

needs_spaces = pytest.mark.skipif(not CONV_A100.exists(), reason="shared tuning spaces not present")


@needs_spaces
@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_every_shared_space_loads(stem):
    rs = load_space(SPACES / f"{stem}.json.gz")
    n, failures = EXPECTED[stem]
    assert rs.name == stem
    assert len(rs.records) == n
    got = {}
    for r in rs.records.values():
        if r.failure:
            got[r.failure] = got.get(r.failure, 0) + 1
            assert r.time_ms is None
        else:
            assert r.time_ms is not None and r.time_ms > 0
    assert got == failures
    assert rs.constraints, "the T1 file beside the cache gives the constraints"
    assert rs.device_name
    assert rs.optimum_ms() == min(r.time_ms for r in rs.records.values() if r.time_ms is not None)
    # every configuration with a time satisfies the constraints
    assert all(rs.valid(r.params) for r in rs.records.values() if r.time_ms is not None)
    # and the cache is the same object the second time
    assert load_space(SPACES / f"{stem}.json.gz") is rs


@needs_spaces
def test_convolution_a100_optimum_and_lookup():
    rs = load_space(CONV_A100)
    assert rs.optimum_ms() == pytest.approx(0.5536000076681376)
    best = min((r for r in rs.records.values() if r.time_ms is not None), key=lambda r: r.time_ms)
    assert rs.lookup(best.params) is best
    assert rs.key(best.params) == tuple(best.params[k] for k in rs.params)
    assert list(rs.params) == ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y", "read_only",
                               "use_padding", "use_shmem", "use_cmem", "filter_height", "filter_width"]
    # a point that breaks a constraint (1024 < 256*16) is neither valid nor recorded
    bad = dict(best.params, block_size_x=256, block_size_y=16)
    assert not rs.valid(bad) and rs.lookup(bad) is None
    assert rs.lookup({"block_size_x": 16}) is None
    # the synthesized family is what every strategy searches
    from kfactory.strategies import Space
    fam = rs.family()
    assert fam.name == "recorded" and fam.spec.target == "replay"
    space = Space([fam])
    pts = space.all_points()
    assert len(pts) == len(rs.records)
    source, flags, threads = fam.render(best.params)
    assert json.loads(source) == best.params and flags == "" and threads == 1


def _write(tmp_path, name, data, gz=True):
    p = tmp_path / name
    raw = json.dumps(data).encode() if not isinstance(data, bytes) else data
    p.write_bytes(gzip.compress(raw) if gz else raw)
    return p


GOOD = {"device_name": "Dev", "kernel_name": "k", "tune_params_keys": ["a", "b"],
        "tune_params": {"a": [1, 2], "b": [0, 1]},
        "cache": {"1,0": {"a": 1, "b": 0, "time": 2.0, "times": [2.0, 2.1], "compile_time": 5.0},
                  "2,1": {"a": 2, "b": 1, "time": "CompilationFailedConfig"}}}


def test_small_space_without_t1(tmp_path):
    rs = load_space(_write(tmp_path, "tiny-Dev.json.gz", GOOD))
    assert rs.constraints == [] and rs.device_name == "Dev" and rs.kernel_name == "k"
    assert rs.optimum_ms() == 2.0
    r = rs.lookup({"a": 1, "b": 0})
    assert r.compile_ms == 5.0 and r.benchmark_ms == 0.0 and r.times_ms == (2.0, 2.1)
    assert rs.lookup({"a": 2, "b": 1}).failure == "CompilationFailedConfig"
    rs2 = load_space(_write(tmp_path, "plain-Dev.json", GOOD, gz=False))
    assert len(rs2.records) == 2


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.pop("cache"), "missing top-level keys"),
    (lambda d: d.update(tune_params={"a": [1, 2]}), "differ from tune_params_keys"),
    (lambda d: d["cache"]["1,0"].pop("b"), "lacks parameters"),
    (lambda d: d["cache"]["1,0"].update(a=7), "outside tune_params"),
    (lambda d: d["cache"]["1,0"].pop("time"), "has no 'time'"),
    (lambda d: d["cache"]["1,0"].update(time=[1]), "not a finite number"),
    (lambda d: d.update(cache={}), "cache is empty"),
])
def test_malformed_cache_says_what_is_wrong(tmp_path, mutate, words):
    data = json.loads(json.dumps(GOOD))
    mutate(data)
    with pytest.raises(ValueError, match=words):
        load_space(_write(tmp_path, "bad-Dev.json.gz", data))


def test_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_space(tmp_path / "absent-X.json.gz")
    with pytest.raises(ValueError, match="cannot read it"):
        load_space(_write(tmp_path, "junk-X.json.gz", b"not gzip at all", gz=False))
    with pytest.raises(ValueError, match="not valid JSON"):
        load_space(_write(tmp_path, "junk2-X.json.gz", b"{nope"))
    with pytest.raises(ValueError, match="top level is a list"):
        load_space(_write(tmp_path, "list-X.json.gz", [1, 2]))


def test_bad_t1_conditions(tmp_path):
    (tmp_path / "tiny.json").write_text(json.dumps({"ConfigurationSpace": {"Conditions": [{"Expression": "c > 1"}]}}))
    with pytest.raises(ValueError, match="does not evaluate"):
        load_space(_write(tmp_path, "tiny-Dev.json.gz", GOOD))
    (tmp_path / "tiny2.json").write_text(json.dumps({"ConfigurationSpace": {"Conditions": [{"Expr": "a"}]}}))
    with pytest.raises(ValueError, match="Conditions"):
        load_space(_write(tmp_path, "tiny2-Dev.json.gz", GOOD))
    (tmp_path / "tiny3.json").write_text(json.dumps({"ConfigurationSpace": {"Conditions": [{"Expression": "a > 1"}]}}))
    rs = load_space(_write(tmp_path, "tiny3-Dev.json.gz", GOOD))
    assert rs.constraints == ["a > 1"] and rs.valid({"a": 2, "b": 0}) and not rs.valid({"a": 1, "b": 0})

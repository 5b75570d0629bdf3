"""The replay target: recorded Kernel Tuner spaces loaded, served through the pipeline, and a real campaign."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import numpy as np

from kfactory.targets.replay import load_space

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


# -- the target, the synthesized problem and a campaign through all six services --------------------------

def _first(rs, failure):
    return next(r for r in rs.records.values() if r.failure == failure)


@needs_spaces
def test_replay_target_compiles_verifies_and_times_from_the_recording():
    from kfactory.platform.config import Settings
    from kfactory.judge.checks import InputPool
    from kfactory.judge.measure import measure
    from kfactory.judge.verify import verify
    from kfactory.problems import ProblemError, load_problem
    from kfactory.targets import get_target
    from kfactory.v1 import events_pb2 as pb

    loc = f"replay:{CONV_A100}"
    target, problem = get_target(loc, Settings()), load_problem(loc)
    rs = target.space
    assert problem.name == "convolution_milo" and list(problem.families) == ["recorded"]
    assert problem.families_for("replay") == [rs.family()] and "replay" in problem.spec.abi
    dev = target.device()
    assert "replayed" in dev.model and dev.device_id == "replay-convolution_milo-A100" and not target.exclusive_verify
    fam = problem.families["recorded"]
    session, pool = target.session(problem, 1), InputPool(problem, 1)

    good = min((r for r in rs.records.values() if r.time_ms is not None), key=lambda r: r.time_ms)
    res = target.compile(fam.render(good.params)[0], "replay", "", fam.spec.entry)
    assert res.ok and "replayed" in res.report.compiler and res.report.seconds == good.compile_ms / 1000
    session.load_artifact("good", res.artifact, fam.spec.entry)
    assert verify(session, "good", problem, pool).passed
    m = measure(session, ["good"], problem, {"n": 8}, pool, target.cache_bytes(), Settings(), None, dev)
    assert not m.reason and m.timings["good"].mode == "replayed"
    assert m.timings["good"].samples == len(good.times_ms)
    assert m.timings["good"].median_s == pytest.approx(float(np.median(good.times_ms)) / 1000)
    # a rotated timing (the showdown's, the final comparison's) asks the recording once: no buffers to rotate
    from kfactory.judge.rotated import measure_rotated
    session.load_artifact("good2", res.artifact, fam.spec.entry)
    both = measure_rotated(session, ["good", "good2"], problem, {"n": 8}, pool, target.cache_bytes(), Settings(),
                           None, dev)
    assert not both.reason and both.timings["good"].samples == len(good.times_ms)

    cf = _first(rs, "CompilationFailedConfig")
    res = target.compile(fam.render(cf.params)[0], "replay", "", fam.spec.entry)
    assert not res.ok and res.reason == pb.COMPILE_ERROR and res.message == "replayed: CompilationFailedConfig"

    rf = _first(rs, "RuntimeFailedConfig")
    res = target.compile(fam.render(rf.params)[0], "replay", "", fam.spec.entry)
    assert res.ok
    session.load_artifact("crash", res.artifact, fam.spec.entry)
    v = verify(session, "crash", problem, pool)
    assert not v.passed and v.reason == pb.CRASHED and "replayed: RuntimeFailedConfig" in v.message

    bad = dict(good.params, block_size_x=256, block_size_y=16)
    res = target.compile(json.dumps(bad), "replay", "", fam.spec.entry)
    assert not res.ok and res.reason == pb.INVALID_POINT and "not a valid configuration" in res.message
    assert target.compile("int main", "replay", "", "k").reason == pb.INVALID_POINT

    with pytest.raises(ValueError, match="needs a recorded space"):
        get_target("replay", Settings())
    with pytest.raises(ValueError, match="no such file"):
        get_target("replay:/nonexistent/x-A100.json.gz", Settings())
    with pytest.raises(ProblemError, match="no such file"):
        load_problem("replay:/nonexistent/x-A100.json.gz")


def test_cli_spec_takes_the_problem_from_a_replay_target():
    from kfactory.cli.main import _spec, build_parser

    args = build_parser().parse_args(["run", "conv", "--target", f"replay:{CONV_A100}", "--budget", "5"])
    spec = _spec(args)
    assert spec.problem == spec.target == f"replay:{CONV_A100}"
    args = build_parser().parse_args(["run", "softmax"])
    assert _spec(args).problem == "softmax"


@needs_spaces
async def test_replay_campaign_through_all_six_services(memory_bus_settings):
    import time

    from test_campaign import _campaign

    from kfactory.judge.stats import summarize
    from kfactory.v1 import events_pb2 as pb

    loc = f"replay:{CONV_A100}"
    rs = load_space(CONV_A100)
    fam = rs.family()
    # the recording's failures, proposed by hand so that both kinds are sure to appear
    spec = pb.CampaignSpec(problem=loc, target=loc, budget_candidates=30, strategy="random", seed=11, parallel=4)
    for name, failure in (("compile_failed", "CompilationFailedConfig"), ("runtime_failed", "RuntimeFailedConfig")):
        spec.manual_sources.append(pb.ManualSource(name=name, source=fam.render(_first(rs, failure).params)[0],
                                                   language="replay", threads=1))
    t0 = time.perf_counter()
    st, running = await _campaign(memory_bus_settings, spec, timeout=120)
    wall = time.perf_counter() - t0
    assert st.finished.state == "completed", st.finished.reason
    summary = json.loads(st.finished.summary_json)
    c = summary["counts"]
    assert c["proposed"] == 32  # 30 searched + the two recorded failures
    assert c["measured"] + c["rejected"] + c["compile_failed"] == 32
    assert all(p.done for p in st.points.values())
    assert "replayed" in st.device.model and "replayed" in summary["device"]

    events = running.services["memory"].archive.events(campaign=st.id)
    measured = [e.measured for e in events if e.HasField("measured")]
    rejected = [e.rejected for e in events if e.HasField("rejected")]
    compile_failed = [e.compile_failed for e in events if e.HasField("compile_failed")]
    compiled = [e.compiled for e in events if e.HasField("compiled")]

    def rec_of(params_json):
        return rs.lookup(json.loads(params_json))

    # every recorded failure is a typed rejection; every recorded success was measured
    for cf in compile_failed:
        if cf.candidate.origin.startswith("template:"):
            assert rec_of(cf.candidate.params_json).failure == "CompilationFailedConfig"
    assert any(cf.reason == pb.COMPILE_ERROR and cf.message == "replayed: CompilationFailedConfig"
               for cf in compile_failed)
    assert all(cf.reason == pb.COMPILE_ERROR and "replayed" in cf.message for cf in compile_failed)
    crashed = [r for r in rejected if r.stage == "verifier"]
    assert crashed and all(r.reason == pb.CRASHED and "replayed: RuntimeFailedConfig" in r.message for r in crashed)
    assert all("replayed" in x.report.compiler for x in compiled)
    for r in rejected:
        if r.stage == "verifier" and r.candidate.origin.startswith("template:"):
            assert rec_of(r.params_json).failure == "RuntimeFailedConfig"
    n_failed_search = sum(1 for r in rejected if r.candidate.origin.startswith("template:")) + \
        sum(1 for cf in compile_failed if cf.candidate.origin.startswith("template:"))
    assert len(measured) == 30 - n_failed_search
    # the measured times are the recorded samples, and the best is the best recorded among them
    expect = {}
    for m in measured:
        rec = rec_of(m.candidate.params_json)
        assert rec is not None and rec.failure is None
        assert m.timings[0].mode == "replayed" and m.device.model.endswith("(replayed)")
        expect[m.candidate.id] = summarize([t / 1000 for t in rec.times_ms], "8").median_s
        assert m.score_s == pytest.approx(expect[m.candidate.id], rel=1e-12)
        # the samples are the record's: Kernel Tuner's `time` is their mean, kfactory's score their median
        assert float(np.mean(rec.times_ms)) == pytest.approx(rec.time_ms, rel=1e-9)
        assert m.timings[0].samples == len(rec.times_ms)
    best = summary["best"]
    assert best["median_seconds"] == pytest.approx(min(expect.values()), rel=1e-12)
    best_rec = min((rec_of(m.candidate.params_json) for m in measured), key=lambda r: float(np.median(r.times_ms)))
    assert best["params"] == best_rec.params
    assert best["median_seconds"] == pytest.approx(float(np.median(best_rec.times_ms)) / 1000, rel=1e-12)
    fastest = min((r for r in rs.records.values() if r.time_ms is not None), key=lambda r: np.median(r.times_ms))
    assert best["median_seconds"] >= float(np.median(fastest.times_ms)) / 1000
    print(f"replay campaign: {c['proposed']} points in {wall:.1f}s ({c['proposed'] / wall:.1f} points/s)")

"""The campaign's objective over a problem's optimisation shapes (kfactory/judge/objective.py): the first shape alone
unless problem.yaml weighs them (shapes.weights), then the weighted sum of their medians, for every decision that
ranks by a score: the measurement, the screen's bound, the showdown, the summary and `kfactory check`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from kfactory.bus import events as ev
from kfactory.cli.check import check
from kfactory.evidence import bundle as eb, report, trust
from kfactory.evidence.workspace import Workspace
from kfactory.judge import objective
from kfactory.judge.measure import sol_floor_s
from kfactory.problems import ProblemError, load_problem
from kfactory.services.memory.lessons import lessons
from kfactory.services.planner.campaign import tied_but_faster_elsewhere
from kfactory.v1 import events_pb2 as pb
from evidence_chain import links

WEIGHTED = Path(__file__).parent / "objective"
A, B = "64x1000", "1x5000"   # the small softmax package's optimisation shapes (conftest.small_softmax)
LABEL = f"50*{B}+1*{A}"   # its shapes in the order of their names
#: a 2-core host's ceilings, as kfactory.targets.cpu.ceiling measures them
DEVICE = pb.DeviceInfo(mem_bandwidth_gbps=30.0, read_bandwidth_gbps=38.0, peak_gflops=200.0)


def _package(small_softmax: str, directory: Path, weights, families: list[tuple[str, Path]] | None = None
             ) -> str:
    dst = directory / "softmax_small"
    shutil.copytree(small_softmax, dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"]["weights"] = weights
    if families is not None:
        shutil.rmtree(dst / "families")
        for name, source in families:
            shutil.copytree(source, dst / "families" / name)
        spec["families"] = [name for name, _ in families]
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(dst)


def _timing(shape: str, median: float, **more) -> pb.ShapeTiming:
    return pb.ShapeTiming(shape=shape, median_s=median, q1_s=median * 0.9, q3_s=median * 1.2,
                          ci_low_s=median * 0.95, ci_high_s=median * 1.1, samples=100, **more)


@pytest.mark.parametrize("weights, why", [([1], "1 given for 2 optimize shapes"), ([-1, 1], "finite number >= 0"),
                                          ([0, 0], "one at least > 0"), ([True, 1], "weights.0"),
                                          (["1", 2], "weights.0")])
def test_weights_that_cannot_score_are_refused_where_the_package_is_loaded(small_softmax, tmp_path, weights, why):
    path = _package(small_softmax, tmp_path, weights)
    with pytest.raises(ProblemError, match="weights") as e:
        load_problem(path)
    assert why in str(e.value)


def test_weights_on_a_shape_given_twice_are_refused(small_softmax, tmp_path):
    path = _package(small_softmax, tmp_path, [1, 2])
    spec = yaml.safe_load((Path(path) / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = [spec["shapes"]["optimize"][0]] * 2
    (Path(path) / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ProblemError, match="name one shape twice"):
        load_problem(path)


@pytest.mark.parametrize("weights", [None, [1, 0]])
def test_without_weights_the_first_shape_alone_is_scored_as_before(small_softmax, tmp_path, weights):
    """No weights, or the first shape weighed 1 and the others 0: the same objective, read the same way."""
    problem = load_problem(small_softmax if weights is None else _package(small_softmax, tmp_path, weights))
    a, b = _timing(A, 2e-4), _timing(B, 3e-5)
    assert objective.weights(problem) == [1.0, 0.0] and objective.by_name(problem) == {}
    assert objective.scored_by(pb.Measured(timings=[_timing(A, 2e-4), _timing(B, 3e-5)])) == {A: 1.0}
    assert objective.label(problem) == A and objective.scored_names(A) == {A}
    assert objective.score([a, b], objective.by_name(problem)) == 2e-4
    assert objective.screen_shape(problem, DEVICE) == problem.shapes("optimize")[0]
    assert objective.score_bound(problem, problem.shapes("optimize")[0], 2e-4, DEVICE) == 2e-4
    assert objective.screen_bar(problem, problem.shapes("optimize")[0], DEVICE, 3e-4) == 3e-4
    assert objective.combine(problem, {A: a, B: b}) is a
    assert objective.speedup(problem, {A: {"reference": 4e-4, "candidate": 2e-4}}, "reference") == 2.0


def test_a_weighted_objective_scores_the_sum_and_bounds_a_screen_with_the_other_shapes_floors(small_softmax,
                                                                                              tmp_path):
    problem = load_problem(_package(small_softmax, tmp_path, [1, 50]))
    shape_a, shape_b = problem.shapes("optimize")
    assert objective.by_name(problem) == {A: 1.0, B: 50.0}
    assert objective.label(problem) == LABEL and objective.scored_names(LABEL) == {A, B}
    a, b = _timing(A, 2e-4), _timing(B, 3e-5)
    assert objective.score([b, a], objective.by_name(problem)) == pytest.approx(2e-4 + 50 * 3e-5, rel=1e-12)
    with pytest.raises(KeyError):
        objective.score([a], objective.by_name(problem))
    # 1x5000 bounds the score the most (50 x its floor against 1 x 64x1000's): it is the one a screen times
    floor_a, floor_b = sol_floor_s(problem, shape_a, DEVICE), sol_floor_s(problem, shape_b, DEVICE)
    assert 50 * floor_b > floor_a > 0
    assert objective.screen_shape(problem, DEVICE) == shape_b
    assert objective.screen_shape(problem, None) == shape_b   # no floors known: the largest weight
    bound = objective.score_bound(problem, shape_b, 3e-5, DEVICE)
    assert bound == pytest.approx(50 * 3e-5 + floor_a, rel=1e-12)
    bar = objective.screen_bar(problem, shape_b, DEVICE, 1.5e-3)
    assert objective.score_bound(problem, shape_b, bar, DEVICE) == pytest.approx(1.5e-3, rel=1e-12)
    assert objective.screen_bar(problem, shape_b, DEVICE, floor_a / 2) == 0.0
    # a showdown's timing of the objective: the weighted sums, labelled
    both = objective.combine(problem, {A: _timing(A, 2e-4, gbps=10.0, sol_fraction=0.3, output_checked=True),
                                       B: _timing(B, 3e-5, gbps=20.0, sol_fraction=0.6, output_checked=True)})
    assert both.shape == LABEL and both.samples == 200 and both.output_checked
    assert both.median_s == pytest.approx(1.7e-3) and both.ci_low_s == pytest.approx(0.95 * 1.7e-3)
    assert both.ci_high_s == pytest.approx(1.1 * 1.7e-3) and both.noise == pytest.approx(0.3)
    assert both.gbps == pytest.approx((10.0 * 2e-4 + 50 * 20.0 * 3e-5) / 1.7e-3)
    assert both.sol_fraction == pytest.approx((0.3 * 2e-4 + 50 * 0.6 * 3e-5) / 1.7e-3)
    assert not objective.combine(problem, {A: _timing(A, 2e-4, output_checked=True), B: _timing(B, 3e-5)}
                                 ).output_checked
    medians = {A: {"reference": 4e-4, "candidate": 2e-4}, B: {"reference": 3e-5, "candidate": 3e-5}}
    assert objective.speedup(problem, medians, "reference") == pytest.approx((4e-4 + 1.5e-3) / (2e-4 + 1.5e-3))
    assert objective.speedup(problem, {A: medians[A]}, "reference") is None


def test_a_cached_measurement_is_scored_under_the_objective_as_it_is_now(small_softmax, tmp_path):
    """The result cache keeps a measurement across campaigns: one cached before its package weighed its shapes is
    scored by the weights it has now, and back; one that lacks a scored shape is not a result (measured again)."""
    weighted = load_problem(_package(small_softmax, tmp_path, [1, 50]))
    m = pb.Measured(timings=[_timing(A, 2e-4), _timing(B, 3e-5)], score_s=2e-4)
    assert objective.rescore(m, weighted)
    assert m.score_s == pytest.approx(2e-4 + 50 * 3e-5) and dict(m.objective) == {A: 1.0, B: 50.0}
    assert trust.measurement_flaw(m) == ""
    assert objective.rescore(m, load_problem(small_softmax))
    assert m.score_s == 2e-4 and not m.objective
    short = pb.Measured(timings=[_timing(A, 2e-4)], score_s=2e-4)
    assert not objective.rescore(short, weighted) and short.score_s == 2e-4 and not short.objective
    # the cache is by candidate: a source measured under another package of the name (other shapes) is not this one's
    elsewhere = pb.Measured(timings=[_timing("4096x4096", 5e-3), _timing(A, 2e-4)], score_s=5e-3)
    assert not objective.rescore(elsewhere, load_problem(small_softmax)) and elsewhere.score_s == 5e-3


def _archived(archive, campaign: str, cid: str, at_ns: int, weights: dict[str, float], start: bool = True,
              **medians: float) -> None:
    """Candidate `cid`'s chain in running campaign `campaign` (started at `at_ns` too, unless `start` is False),
    measured at `at_ns` with `medians` by shape ("s64x1000")."""
    cand = pb.Candidate(id=cid, campaign_id=campaign, point_id="p-" + cid, problem="softmax", target="cpu",
                        family="cpu_c", origin="template:cpu_c", params_json="{}")
    timings = [_timing(shape.removeprefix("s"), median) for shape, median in medians.items()]
    m = pb.Measured(candidate=cand, timings=timings, objective=weights,
                    score_s=objective.score(timings, weights))
    started = [ev.make_event(campaign, "planner", "start", campaign_started=pb.CampaignStarted(
        spec=pb.CampaignSpec(problem="softmax", target="cpu")))] if start else []
    for e in [*started, *links(campaign, cand), ev.make_event(campaign, "benchmarker", cid, measured=m)]:
        e.time_unix_ns = at_ns
        assert archive.record(e)


def test_memory_ranks_every_campaigns_kernels_by_the_objective_of_the_campaign_started_last(tmp_path):
    """`kfactory best` (Archive.best) across campaigns of one problem whose weights or shapes changed: each kernel
    is scored by the objective of the campaign started last (its weights, or its first shape alone), from its own
    timings (and returned with that score), and one that did not time a scored shape does not count. Without
    weights, each was ranked by its recorded score: the medians of different first shapes compared (a package's
    new version, timed at 64x1000, lost to its old one's 1 ms at 16x16)."""
    from kfactory.services.memory.archive import Archive
    from kfactory.services.memory.queries import Queries
    from kfactory.v1 import services_pb2 as spb

    archive = Archive(tmp_path / "archive.sqlite")
    try:
        _archived(archive, "c0", "other_shape", 1, {}, s16x16=0.001)           # first shape 16x16 alone: 1 ms
        _archived(archive, "c1", "first_fast", 2, {}, s64x1000=0.10, s1x5000=0.010)
        _archived(archive, "c1", "balanced", 2, {}, start=False, s64x1000=0.12, s1x5000=0.002)
        # no weights: c1's first shape (64x1000) alone, which other_shape never timed
        found = archive.best("softmax")[0]
        assert found.candidate.id == "first_fast" and found.score_s == 0.10 and not found.objective
        assert eb.loads(eb.dumps(eb.export_bundle(archive, lambda d: None)))["version"] == 1   # reads everywhere
        _archived(archive, "c2", "weighted", 3, {A: 1.0, B: 50.0}, s64x1000=0.30, s1x5000=0.001)
        # under c2's weights: first_fast 0.10 + 50 x 0.010 = 0.60, balanced 0.12 + 0.10 = 0.22, weighted 0.35; and
        # other_shape timed neither shape
        found = archive.best("softmax")[0]
        assert found.candidate.id == "balanced" and found.score_s == pytest.approx(0.22)
        assert dict(found.objective) == {A: 1.0, B: 50.0} and trust.measurement_flaw(found) == ""
        entry = Queries(archive).best(spb.BestRequest(problem="softmax"))   # what `kfactory best` prints
        assert (entry.candidate_id, entry.objective) == ("balanced", LABEL)
        assert entry.score_s == pytest.approx(0.22)
        assert archive.best("softmax", shape=A)[0].candidate.id == "first_fast"   # at a shape, as measured
        # `kfactory best --shape`: the median there is the score it prints, and what it is of
        at_b = Queries(archive).best(spb.BestRequest(problem="softmax", shape=B))
        assert (at_b.candidate_id, at_b.score_s, at_b.objective) == ("weighted", 0.001, f"1*{B}")
        at_a = Queries(archive).best(spb.BestRequest(problem="softmax", shape=A))
        assert (at_a.candidate_id, at_a.score_s, at_a.objective) == ("first_fast", 0.10, "")
        # a measurement that came later to a campaign started before c2 does not make its objective the newest
        _archived(archive, "c1", "late", 9, {}, start=False, s64x1000=0.5, s1x5000=0.5)
        assert archive.best("softmax")[0].candidate.id == "balanced"
        # a bundle with weighted scores is version 2 (a reader of 1 could not parse them), and carries them
        bundle = eb.loads(eb.dumps(eb.export_bundle(archive, lambda d: None)))
        assert bundle["version"] == 2
        again = Archive(tmp_path / "again.sqlite")
        try:
            eb.import_bundle(again, Workspace(tmp_path / "ws"), bundle)
            assert again.best("softmax")[0].candidate.id == "balanced"
        finally:
            again.close()
        _archived(archive, "c3", "unweighted_again", 10, {}, s64x1000=0.20, s1x5000=0.2)
        found = archive.best("softmax")[0]   # the first shape alone again: 64x1000
        assert found.candidate.id == "first_fast" and found.score_s == 0.10 and not found.objective
        assert Queries(archive).best(spb.BestRequest(problem="softmax")).objective == ""
    finally:
        archive.close()


def test_a_showdown_of_one_weighted_shape_or_of_tiny_weights_is_labelled_and_believed(small_softmax, tmp_path):
    only_b = load_problem(_package(small_softmax, tmp_path / "b", [0, 1]))
    assert objective.label(only_b) == f"1*{B}" and objective.by_name(only_b) == {B: 1.0}
    t = objective.combine(only_b, {A: _timing(A, 2e-4), B: _timing(B, 3e-5)})
    assert t.shape == f"1*{B}" and t.median_s == 3e-5 and objective.scored_names(t.shape) == {B}
    tiny = load_problem(_package(small_softmax, tmp_path / "tiny", [1.0e-4, 1.0e-4]))
    both = objective.combine(tiny, {A: _timing(A, 2e-6), B: _timing(B, 3e-6)})
    assert both.median_s == pytest.approx(5e-10)
    comp = pb.Comparison(shape=both.shape, showdown=True, speedups={"k": 1.0},
                         entries=[pb.ComparisonEntry(name="candidate", candidate_id="k", timing=both)])
    assert trust.comparison_flaw(comp) == ""
    # one shape's timing under a nanosecond is still no kernel's
    comp.entries[0].timing.CopyFrom(_timing(A, 5e-10))
    assert "not a time a kernel can take" in trust.comparison_flaw(comp)


def _folded(problem, objective_now: dict[str, float]):
    from kfactory.services.planner.campaign import CampaignState
    from kfactory.strategies import Space

    st = CampaignState("c1", pb.CampaignSpec(problem=str(problem.directory), target="cpu", budget_candidates=3,
                                             strategy="random", seed=1),
                       pb.DeviceInfo(), Space(list(problem.families.values())))
    st.objective = objective_now
    return st


def test_the_planner_ranks_a_measurement_scored_with_other_weights_by_its_campaigns(small_softmax, tmp_path):
    """A benchmarker that loaded another version of the package, a package edited before a restarted planner
    replays the stream, or a forged weight: the campaign ranks each full measurement by its own objective, from
    the measurement's timings, and never leaves its point in flight; what it cannot rescore (a shape missing, a
    screen's bound) it keeps as scored."""
    problem = load_problem(_package(small_softmax, tmp_path, [1, 50]))
    for spelled, recorded in ((objective.spelled_out(problem), {A: 1.0, B: 50.0}),
                              (objective.spelled_out(load_problem(small_softmax)), {})):
        st = _folded(problem, spelled)
        timings = [_timing(A, 2e-4), _timing(B, 3e-5)]
        events = {}
        other_shapes = [_timing("16x16", 2e-4)]   # another package's shape: nothing the campaign scores
        for cid, weights, timed, score, screened in (
                ("first_alone", {}, timings, 2e-4, False),
                ("halved", {A: 0.5, B: 25.0}, timings, 1e-4 + 25 * 3e-5, False),
                ("ours", {A: 1.0, B: 50.0}, timings, 2e-4 + 50 * 3e-5, False),
                ("elsewhere", {"16x16": 2.0}, other_shapes, 4e-4, False),
                ("screened", {A: 3.0}, timings[:1], 7e-4, True)):
            cand = pb.Candidate(id=cid, point_id="p-" + cid, origin="manual:mine", params_json="{}")
            for e in links("c1", cand):
                assert st.apply(e) == "", e
            m = pb.Measured(candidate=cand, timings=timed, objective=weights, score_s=score, screened_out=screened)
            events[cid] = ev.make_event("c1", "benchmarker", cid, measured=m)
            assert st.apply(events[cid]) == "", cid
        assert st.counts.measured == 5 and st.in_flight() == 0
        for cid in ("first_alone", "halved", "ours"):
            m = st.measured[cid]
            assert m.score_s == pytest.approx(objective.score(timings, spelled), rel=1e-12), cid
            assert dict(m.objective) == recorded and trust.measurement_flaw(m) == "", cid
        assert st.measured["elsewhere"].score_s == 4e-4 and st.measured["screened"].score_s == 7e-4   # as scored
        assert dict(events["first_alone"].measured.objective) == {}   # the event itself is left as it came


def test_an_agent_is_told_what_the_campaign_ranks_by(small_softmax, tmp_path):
    from kfactory.agents.personas import PERSONAS
    from kfactory.agents.prompt import build

    persona = next(iter(PERSONAS.values()))
    plain = build(persona, load_problem(small_softmax), "cpu", DEVICE, [], "").user
    assert f"(the campaign's objective: the median at {A})" in plain
    weighted = build(persona, load_problem(_package(small_softmax, tmp_path, [1, 50])), "cpu", DEVICE, [], "").user
    assert f"(the campaign's objective: the sum of weight x median over {LABEL})" in weighted


def test_trust_holds_a_score_to_its_objective():
    a, b = _timing(A, 2e-4), _timing(B, 3e-5)
    weights = {A: 1.0, B: 50.0}
    good = pb.Measured(timings=[a, b], score_s=2e-4 + 50 * 3e-5, objective=weights)
    assert trust.measurement_flaw(good) == ""
    # weights much under 1 make a score under a nanosecond of medians that are not: still a measurement
    tiny = {A: 1e-4, B: 1e-4}
    assert trust.measurement_flaw(pb.Measured(timings=[_timing(A, 2e-6), _timing(B, 3e-6)], score_s=5e-10,
                                              objective=tiny)) == ""
    assert objective.named_label({A: 1e-4, B: 2e6}) == f"2000000*{B}+0.0001*{A}"   # by name: 1x5000 first
    assert "weighted sum" in trust.measurement_flaw(pb.Measured(timings=[a, b], score_s=2e-4, objective=weights))
    assert "did not time" in trust.measurement_flaw(pb.Measured(timings=[a], score_s=2e-4, objective=weights))
    assert "first shape's median" in trust.measurement_flaw(pb.Measured(timings=[a, b], score_s=2e-4 + 1.5e-3))
    assert "not finite" in trust.measurement_flaw(pb.Measured(timings=[a, b], score_s=2e-4, objective={A: -1.0}))
    # a screened-out one: its score is a bound, never under its one timing's share
    assert trust.measurement_flaw(pb.Measured(timings=[b], score_s=50 * 3e-5 + 1e-6, objective=weights,
                                              screened_out=True)) == ""
    assert "under its screen's share" in trust.measurement_flaw(
        pb.Measured(timings=[b], score_s=3e-5, objective=weights, screened_out=True))


def test_a_tie_on_the_objective_looks_elsewhere_only_at_the_shapes_it_does_not_score():
    pick = pb.Measured(candidate=pb.Candidate(id="pick"), timings=[_timing(A, 1e-3), _timing(B, 1e-3)])
    other = pb.Measured(candidate=pb.Candidate(id="other"), timings=[_timing(A, 1e-3), _timing(B, 1e-4)])
    assert tied_but_faster_elsewhere(pick, [other], A) == "other"   # 1x5000 is elsewhere: 10x faster there
    assert tied_but_faster_elsewhere(pick, [other], LABEL) is None  # both shapes are the objective's


def test_check_reports_the_objectives_speedup(small_softmax, tmp_path, settings):
    """`kfactory check` of the reference kernel's source on a package weighing its shapes: the top speedup is
    the weighted sums' ratio of the per-shape medians it reports."""
    path = _package(small_softmax, tmp_path, [1, 50])
    problem = load_problem(path)
    source, flags, language, _ = problem.reference_kernel("cpu")
    out = check(path, "cpu", source, flags, settings, language=language)
    assert out["verdict"]["passed"], out["verdict"]
    shapes = out["measurement"]["shapes"]
    ref = shapes[A]["reference"]["median_s"] + 50 * shapes[B]["reference"]["median_s"]
    cand = shapes[A]["candidate"]["median_s"] + 50 * shapes[B]["candidate"]["median_s"]
    assert out["speedup_vs_reference"] == pytest.approx(ref / cand, rel=1e-12)
    assert out["speedup_vs_reference"] != pytest.approx(out["measurement"]["speedups"][A]["reference"], rel=1e-9)


@pytest.mark.serial   # which kernel is best is a timing's verdict
async def test_a_weighted_campaign_ranks_screens_and_reports_by_the_weighted_sum(memory_bus_settings, small_softmax,
                                                                                 tmp_path):
    """A grid over tests/objective/ under weights 1 and 50: the kernel slow at 64x1000 and fast at 1x5000 is the
    result (by the first shape alone, the one slow at 1x5000 would be); the one slow at both is screened out at
    1x5000 on its bound; the near tie is decided by a showdown of the objective; and the summary's speedup is the
    weighted sums' ratio."""
    from test_campaign import _campaign

    path = _package(small_softmax, tmp_path, [1, 50], [("cpu_weighted", WEIGHTED)])
    # a grid with one point in flight proposes the kinds in family.yaml's order, each after the one before is
    # done: both_slow comes last, when a_slow's score is the best to screen against
    # every candidate within 2x of the pick's score is a contender: the twins are in its showdown, whatever the noise
    settings = memory_bus_settings.model_copy(update={"showdown_margin": 1.0})
    spec = pb.CampaignSpec(problem=path, target="cpu", budget_candidates=4, strategy="grid", seed=1, parallel=1,
                           warm_start=0)
    st, running = await _campaign(settings, spec)
    assert st.finished.state == "completed"
    kind = {m.candidate.id: k for m in st.measured.values()
            if (k := json.loads(m.candidate.params_json or "{}").get("kind"))}
    by_kind = {k: st.measured[cid] for cid, k in kind.items()}
    weights = {A: 1.0, B: 50.0}
    assert st.objective == weights   # the planner's: what it ranks every measurement by
    for k in ("b_slow", "a_slow", "a_slow_twin"):
        m = by_kind[k]
        assert not m.screened_out and dict(m.objective) == weights, k
        at = {t.shape: t.median_s for t in m.timings}
        assert m.score_s == pytest.approx(at[A] + 50 * at[B], rel=1e-12), k
        assert trust.measurement_flaw(m) == ""
    # by the first shape alone the order would be the other way round
    assert by_kind["b_slow"].timings[0].median_s < by_kind["a_slow"].timings[0].median_s
    assert by_kind["a_slow"].score_s < by_kind["b_slow"].score_s
    # screened out at 1x5000, the shape that bounds the score the most, on its bound, not on that time alone
    slow = by_kind["both_slow"]
    assert slow.screened_out and [t.shape for t in slow.timings] == [B] and dict(slow.objective) == weights
    assert slow.score_s > 50 * slow.timings[0].median_s
    assert slow.score_s > 1.5 * by_kind["a_slow"].score_s
    assert trust.measurement_flaw(slow) == ""
    # the showdown timed the objective: the twins (and the others within 2x) with the weighted sums
    sd = st.showdowns[st.search_best().candidate.id]
    assert sd.shape == LABEL and not sd.error
    timed = {e.candidate_id: e.timing for e in sd.entries}
    assert {by_kind["a_slow"].candidate.id, by_kind["a_slow_twin"].candidate.id} <= set(timed)
    assert all(t.shape == LABEL and t.output_checked for t in timed.values())
    summary = json.loads(st.finished.summary_json)
    best = summary["best"]
    assert kind[best["candidate_id"]] in ("a_slow", "a_slow_twin")
    assert best["shape"] == LABEL and summary["showdown"]["shape"] == LABEL
    compared = {s: best["shapes"][s]["compared"] for s in (A, B)}
    ref = compared[A]["reference"]["median_seconds"] + 50 * compared[B]["reference"]["median_seconds"]
    cand = compared[A]["candidate"]["median_seconds"] + 50 * compared[B]["candidate"]["median_seconds"]
    assert best["speedup_vs_reference"] == pytest.approx(ref / cand, rel=1e-12)
    # `kfactory run`'s leaderboard calls the weighted sums scores, not medians
    import io

    from rich.console import Console

    from kfactory.cli.run import leaderboard_table
    out = io.StringIO()
    ranked = sorted(st.measured.values(), key=lambda m: m.score_s)
    Console(file=out, width=250).print(leaderboard_table(summary, ranked))
    assert "score (ms)" in out.getvalue() and "median (ms)" not in out.getvalue()
    # memory's lesson names the objective its score is of, not the first shape
    memory = running.services["memory"]
    # the report's leaderboard: a score column, and the screened-out timing under the shape it was taken at
    board = report.markdown(memory.archive.events(campaign=st.id)).split("## Leaderboard")[1].split("\n## ")[0]
    header = next(line for line in board.splitlines() if line.startswith("| rank"))
    assert header.endswith(f"| score | {A} | {B} |"), header
    row = next(line for line in board.splitlines() if slow.candidate.id[:12] in line)
    assert row.endswith(f"| {slow.score_s * 1e3:.4g} ms |  | {slow.timings[0].median_s * 1e3:.4g} ms |"), row
    lesson = next(x for x in lessons(memory.archive, memory.archive.problem_name(path)) if x.kind == "best")
    assert f"ms at {LABEL}," in lesson.text and lesson.text.endswith(f"bandwidth at {A}"), lesson.text

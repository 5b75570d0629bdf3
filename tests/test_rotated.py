"""Rotated timings (kfactory.judge.rotated.measure_rotated) on the real cpu target: every kernel is timed in every
place (so on the buffers laid out first), and right after every other kernel, equally often (a Williams design),
the rotations share the time one timing would take, the figure is the
geometric mean of the rotations', the probe after the timing comes once and counts every timed call, and a
wrong kernel is a typed failure as in one timing."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from conftest import kernel_source
from kfactory.judge import measure as measure_mod
from kfactory.judge import rotated
from kfactory.judge.checks import InputPool
from kfactory.judge.stats import combine, latin_square_halfwidth
from kfactory.problems import load_problem
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb


@pytest.fixture
def problem(small_softmax):
    return load_problem(small_softmax)


@pytest.fixture
def loaded(settings, problem):
    """A cpu session with the reference kernel ("ref") and the numpy baseline loaded."""
    target = get_target("cpu", settings)
    session = target.session(problem, 2)
    source, flags = problem.reference_source("cpu")
    res = target.compile(source, "c", flags, "kernel")
    assert res.ok, res.log
    session.load_artifact("ref", res.artifact, "kernel")
    session.load_baseline("numpy", "numpy")
    yield target, session
    session.close()


def _keep_rotations(monkeypatch) -> list:
    """Record every rotation's Timing (measure's own result) as measure_rotated gets it."""
    runs: list = []
    real = rotated.measure

    def keep(*a, **kw):
        runs.append(real(*a, **kw))
        return runs[-1]
    monkeypatch.setattr(rotated, "measure", keep)
    return runs


def _spy_probes(monkeypatch) -> list[tuple[str, int]]:
    """Record (key, timed calls) of every probe after a timing, the real probe still made."""
    probes: list[tuple[str, int]] = []
    real = measure_mod.probe_after_timing

    def spy(session, key, problem, shape, pool, timed_calls, median_s):
        probes.append((key, timed_calls))
        return real(session, key, problem, shape, pool, timed_calls, median_s)
    monkeypatch.setattr(measure_mod, "probe_after_timing", spy)
    return probes


def test_each_kernel_is_timed_first_once_in_a_share_of_the_time(loaded, problem, settings, monkeypatch):
    target, session = loaded
    benches: list[tuple[list[str], float]] = []
    real = session.bench

    def spy(keys, shape, sets, **kw):
        benches.append((list(keys), kw["max_s"]))
        return real(keys, shape, sets, **kw)
    monkeypatch.setattr(session, "bench", spy)
    timings = _keep_rotations(monkeypatch)
    res = rotated.measure_rotated(session, ["ref", "numpy"], problem, problem.shapes("optimize")[0],
                                  InputPool(problem, 1), 1 << 20, settings, 0.4)
    assert not res.reason, res.message
    timed = [(keys, max_s) for keys, max_s in benches if len(keys) == 2]
    assert timed == [(["ref", "numpy"], 0.2), (["numpy", "ref"], 0.2)]   # 0.4 s shared, each first once
    for k in ("ref", "numpy"):
        medians = [t.timings[k].median_s for t in timings]
        assert res.timings[k].median_s == pytest.approx(math.sqrt(medians[0] * medians[1]), rel=1e-12)
        assert res.timings[k].samples == sum(t.timings[k].samples for t in timings)
        assert res.timings[k].output_checked
        assert res.timings[k].ci_low_s <= res.timings[k].median_s <= res.timings[k].ci_high_s


def test_the_probe_comes_once_after_the_last_rotation_and_counts_every_timed_call(loaded, problem, settings,
                                                                                   monkeypatch):
    target, session = loaded
    probes = _spy_probes(monkeypatch)
    res = rotated.measure_rotated(session, ["ref", "numpy"], problem, problem.shapes("optimize")[0],
                                  InputPool(problem, 1), 1 << 20, settings, 0.4, probe=["ref"])
    assert not res.reason, res.message
    assert probes == [("ref", res.timings["ref"].samples)]


def test_a_wrong_kernel_fails_a_rotated_timing_with_its_reason(settings, problem):
    target = get_target("cpu", settings)
    session = target.session(problem, 2)
    try:
        source, flags = problem.reference_source("cpu")
        for key, src in (("ref", source), ("wrong", kernel_source("wrong"))):
            res = target.compile(src, "c", flags, "kernel")
            assert res.ok, res.log
            session.load_artifact(key, res.artifact, "kernel")
        res = rotated.measure_rotated(session, ["ref", "wrong"], problem, problem.shapes("optimize")[0],
                                      InputPool(problem, 1), 1 << 20, settings, 0.4)
        assert res.reason == pb.WRONG_RESULT and res.failed_key == "wrong"
        # left out of the probe (as a baseline is), its outputs are still checked
        res = rotated.measure_rotated(session, ["ref", "wrong"], problem, problem.shapes("optimize")[0],
                                      InputPool(problem, 1), 1 << 20, settings, 0.4, probe=["ref"])
        assert res.reason == pb.WRONG_RESULT and res.failed_key == "wrong"
    finally:
        session.close()


def test_every_rotation_times_the_same_sets_drawn_once(loaded, problem, settings, monkeypatch):
    """One draw for the whole rotated timing (InputPool.pinned_timing), even from a pool that shares nothing: each
    rotation's bench gets the same arrays."""
    target, session = loaded
    got: list[list] = []
    real = session.bench

    def spy(keys, shape, sets, **kw):
        if len(keys) == 2:
            got.append([s["x"] for s in sets])
        return real(keys, shape, sets, **kw)
    monkeypatch.setattr(session, "bench", spy)
    res = rotated.measure_rotated(session, ["ref", "numpy"], problem, problem.shapes("optimize")[0],
                                  InputPool(problem, 1), 1 << 20, settings, 0.4)
    assert not res.reason, res.message
    assert len(got) == 2 and len(got[0]) >= 2
    assert all(a is b for a, b in zip(got[0], got[1], strict=True))


def _spy_output_checks(monkeypatch) -> list[str]:
    """The keys whose timed calls' outputs measure checks, in order, the real check still made."""
    keys: list[str] = []
    real = measure_mod._timed_outputs

    def spy(problem, res, key, *a):
        keys.append(key)
        return real(problem, res, key, *a)
    monkeypatch.setattr(measure_mod, "_timed_outputs", spy)
    return keys


def test_every_kernels_outputs_are_checked_in_every_rotation_probed_or_not(loaded, problem, settings, monkeypatch):
    """A kernel left out of `probe` (the reference kernel, a baseline) is checked in every rotation too: a candidate
    could write into its inputs in a later rotation and slow it, which only its wrong outputs show."""
    target, session = loaded
    checked = _spy_output_checks(monkeypatch)
    res = rotated.measure_rotated(session, ["ref", "numpy"], problem, problem.shapes("optimize")[0],
                                  InputPool(problem, 1), 1 << 20, settings, 0.4, probe=["ref"])
    assert not res.reason, res.message
    assert checked == ["ref", "numpy", "numpy", "ref"]
    assert res.timings["ref"].output_checked and res.timings["numpy"].output_checked


def test_rotations_put_every_key_in_every_place_and_after_every_other_key_equally_often():
    assert rotated.rotations(["a", "b", "c"]) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                  ["c", "b", "a"], ["a", "c", "b"], ["b", "a", "c"]]
    assert rotated.rotations(["a", "b"]) == [["a", "b"], ["b", "a"]]
    assert rotated.rotations(["a"]) == [["a"]]
    for k in range(2, 9):
        keys = [str(i) for i in range(k)]
        orders = rotated.rotations(keys)
        assert len(orders) == (2 * k if k % 2 else k)
        places = Counter((key, o.index(key)) for o in orders for key in o)
        after = Counter((o[i], o[i + 1]) for o in orders for i in range(k - 1))
        assert len(places) == k * k and set(places.values()) == {len(orders) // k}
        assert len(after) == k * (k - 1) and len(set(after.values())) == 1


def test_combined_timings_are_geometric_means_and_a_buffer_bias_cancels_in_a_ratio():
    """Kernel A 2% faster than B; whichever is on the first buffers runs 5% slower. One timing each way gets the
    ratio wrong both ways; combined, it is right."""
    def timing(med: float) -> pb.ShapeTiming:
        return pb.ShapeTiming(shape="s", median_s=med, q1_s=0.99 * med, q3_s=1.01 * med, ci_low_s=0.995 * med,
                              ci_high_s=1.005 * med, samples=100, output_checked=True)
    a = [timing(0.98 * 1.05), timing(0.98)]   # A first, then B first
    b = [timing(1.0), timing(1.0 * 1.05)]
    assert a[0].median_s / b[0].median_s > 1 > a[1].median_s / b[1].median_s
    ca, cb = combine(a, nbytes=8e6, ceiling_gbps=10.0), combine(b)
    assert ca.median_s / cb.median_s == pytest.approx(0.98, rel=1e-12)
    assert ca.samples == 200 and ca.output_checked
    assert ca.ci_low_s == pytest.approx(0.995 * ca.median_s) and ca.ci_high_s == pytest.approx(1.005 * ca.median_s)
    assert ca.noise == pytest.approx(0.02, rel=1e-6)
    assert ca.gbps == pytest.approx(8e6 / ca.median_s / 1e9) and ca.sol_fraction == pytest.approx(ca.gbps / 10)


def _square(kernel, place, drift, noise):
    """logs[k, j] of a rotated timing: kernel k's effect, its place's (k - j mod K) and rotation j's drift, plus
    noise."""
    k = len(kernel)
    return np.array([[kernel[i] + place[(i - j) % k] + drift[j] + noise[i, j] for j in range(k)] for i in range(k)])


def test_the_latin_square_fit_tells_apart_what_one_rotation_s_width_cannot():
    """Four kernels, the second 3% faster; the first place's buffers 4% slow; the host drifting by up to 20%
    between rotations; noise 0.3%. The fitted half-width is under 1.5%, so the 3% kernel is outside the noise."""
    rng = np.random.default_rng(5)
    logs = _square([0.0, -0.03, 0.0, 0.01], [0.04, 0.0, -0.01, -0.02], [0.0, 0.1, -0.05, 0.2],
                   rng.normal(0, 0.003, (4, 4)))
    half = latin_square_halfwidth(logs)
    assert half is not None and half < 0.015
    means = logs.mean(axis=1)
    assert means[0] - means[1] == pytest.approx(0.03, abs=0.006)   # places and drift cancel in the means
    assert means[0] - half > means[1] + half
    assert latin_square_halfwidth(logs[:2, :2]) is None             # two kernels leave no degrees of freedom


def test_the_latin_square_intervals_call_equal_kernels_different_about_one_time_in_twenty():
    """Equal kernels, random places' biases (up to 5%) and drift, noise 1%: two kernels' intervals leave each
    other out in about 5% of rotated timings (the pair's t-test at 95%)."""
    rng = np.random.default_rng(11)
    hits, trials = 0, 4000
    for _ in range(trials):
        logs = _square([0.0] * 4, rng.uniform(-0.05, 0.05, 4), rng.normal(0, 0.1, 4), rng.normal(0, 0.01, (4, 4)))
        half = latin_square_halfwidth(logs)
        means = logs.mean(axis=1)
        hits += abs(means[0] - means[1]) > 2 * half
    assert 0.03 < hits / trials < 0.07, hits / trials


def _runs(orders: list[list[int]], k: int, place, drift, after0: float, noise) -> np.ndarray:
    """logs[kernel, run] of equal kernels timed in `orders`: each place's bias, each run's drift, `after0` for
    the kernel right after kernel 0 in the order (its neighbour's carry-over), plus noise."""
    logs = np.zeros((k, len(orders)))
    for j, o in enumerate(orders):
        for pos, kern in enumerate(o):
            logs[kern, j] = place[pos] + drift[j] + (after0 if pos and o[pos - 1] == 0 else 0.0) + noise[kern, j]
    return logs


def test_a_neighbour_s_carry_over_cancels_in_the_williams_orders_and_equal_kernels_stay_equal():
    """Three equal kernels; the one right after kernel 0 runs 1% faster (what the host did to the same softmax
    kernel under two keys); places' biases up to 5%, drift, noise 0.5%. In the plain shifts kernel 1 follows
    kernel 0 wherever it has a kernel before it and comes out faster; in the Williams orders (with their
    mirrors) no kernel does, and the fit's intervals call two of them different about one time in twenty
    without a carry-over, and less often with one (it is left in the noise the fit estimates)."""
    rng = np.random.default_rng(7)
    shifts = [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    williams = rotated.rotations([0, 1, 2])
    places = np.array([[o.index(k) for o in williams] for k in range(3)])
    gaps: dict[str, list[float]] = {"shifts": [], "williams": []}
    hits, trials = {0.0: 0, -0.01: 0}, 3000
    for _ in range(trials):
        place = rng.uniform(-0.05, 0.05, 3)
        for name, orders in (("shifts", shifts), ("williams", williams)):
            logs = _runs(orders, 3, place, rng.normal(0, 0.05, len(orders)), -0.01,
                         rng.normal(0, 0.005, (3, len(orders))))
            means = logs.mean(axis=1)
            gaps[name].append(means[1] - means[2])
        for after0 in hits:
            logs = _runs(williams, 3, place, rng.normal(0, 0.05, 6), after0, rng.normal(0, 0.005, (3, 6)))
            means = logs.mean(axis=1)
            hits[after0] += abs(means[1] - means[2]) > 2 * latin_square_halfwidth(logs, places)
    # (in two of the three shifts kernel 1 has kernel 0 before it; first in the third, it has none)
    assert np.mean(gaps["shifts"]) == pytest.approx(-0.01 * 2 / 3, abs=0.001)
    assert abs(np.mean(gaps["williams"])) < 0.001
    assert 0.03 < hits[0.0] / trials < 0.07, hits
    assert hits[-0.01] / trials < 0.05, hits


def test_three_kernels_get_intervals_from_the_fit_never_narrower_than_their_samples(loaded, problem, settings,
                                                                                     monkeypatch):
    target, session = loaded
    source, flags = problem.reference_source("cpu")
    res = target.compile(source, "c", flags, "kernel")
    session.load_artifact("ref2", res.artifact, "kernel")
    runs = _keep_rotations(monkeypatch)
    keys = ["ref", "numpy", "ref2"]
    out = rotated.measure_rotated(session, keys, problem, problem.shapes("optimize")[0], InputPool(problem, 1),
                                  1 << 20, settings, 0.6, probe=[])
    assert not out.reason, out.message
    assert len(runs) == 6   # three kernels: the three shifts and their mirrors
    logs = np.log([[r.timings[k].median_s for r in runs] for k in keys])
    places = np.array([[o.index(k) for o in rotated.rotations(keys)] for k in keys])
    fitted = latin_square_halfwidth(logs, places)
    assert fitted is not None
    for k in keys:
        t, own = out.timings[k], combine([r.timings[k] for r in runs])
        half = math.log(t.ci_high_s / t.median_s)
        assert half == pytest.approx(math.log(t.median_s / t.ci_low_s), rel=1e-9)   # symmetric in logs
        assert half == pytest.approx(max(fitted, math.log(own.ci_high_s / own.ci_low_s) / 2 / math.sqrt(6)),
                                     rel=1e-9)


def test_where_one_runner_child_cannot_answer_every_rotation_each_is_probed_after_itself(settings, problem,
                                                                                          monkeypatch):
    """runner_max_runs 15: the rotations and a single probe would need more requests than one child answers, and a
    child replaced between them would start a kernel's call counter afresh; so each rotation is probed, as one
    timing is."""
    small = settings.model_copy(update={"runner_max_runs": 15})
    target = get_target("cpu", small)
    session = target.session(problem, 2)
    try:
        source, flags = problem.reference_source("cpu")
        res = target.compile(source, "c", flags, "kernel")
        session.load_artifact("ref", res.artifact, "kernel")
        session.load_baseline("numpy", "numpy")
        probes = _spy_probes(monkeypatch)
        out = rotated.measure_rotated(session, ["ref", "numpy"], problem, problem.shapes("optimize")[0],
                                      InputPool(problem, 1), 1 << 20, small, 0.4, probe=["ref"])
        assert not out.reason, out.message
        assert [k for k, _ in probes] == ["ref", "ref"]
        assert sum(n for _, n in probes) == out.timings["ref"].samples   # each counts its own rotation's calls
    finally:
        session.close()


def test_a_combined_timing_with_few_samples_spans_every_interval_and_names_every_mode():
    """A slow kernel's share of the time may give a rotation one sample, whose interval is a point: the combined
    interval then spans them all, and a throttled rotation's telemetry is the one kept."""
    one = pb.ShapeTiming(shape="s", median_s=1.0, q1_s=1.0, q3_s=1.0, ci_low_s=1.0, ci_high_s=1.0, samples=1,
                         mode="events")
    two = pb.ShapeTiming(shape="s", median_s=1.1, q1_s=1.1, q3_s=1.1, ci_low_s=1.1, ci_high_s=1.1, samples=1,
                         mode="graph")
    two.telemetry.throttled = True
    three = pb.ShapeTiming(shape="s", median_s=1.05, q1_s=1.0, q3_s=1.1, ci_low_s=1.04, ci_high_s=1.06, samples=50,
                           mode="graph")
    three.telemetry.sm_clock_mhz_after = 1980
    c = combine([one, two, three])
    assert (c.ci_low_s, c.ci_high_s) == (1.0, 1.1)
    assert c.mode == "events+graph" and c.telemetry.throttled

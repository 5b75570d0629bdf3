"""Search strategies: valid, never repeated, and the evolutionary one exploits what it is told."""
from __future__ import annotations

import pytest

from kfactory.problems import load_problem
from kfactory.strategies import KNOWN, Space, UnknownStrategy, make_strategy


@pytest.fixture(scope="module")
def space():
    return Space(load_problem("softmax").families_for("cpu"))


def _score(point) -> float:
    """A synthetic landscape: wide vectors, online passes and poly exp are fast."""
    p = point.params
    return (1.0 / p["vec"] + {"online": 0.1, "two": 0.3, "three": 0.6}[p["passes"]]
            + (0.0 if p["exp"] == "poly" else 0.5) + 0.1 / p["threads"])


@pytest.mark.parametrize("name", KNOWN)
def test_points_are_valid_and_never_repeated(space, name):
    s = make_strategy(name, space, seed=1)
    seen = []
    for _ in range(60):
        p = s.ask()
        assert p is not None and space.valid(p)
        s.tell(p, None if p.params["flags"].endswith("fast-math") else _score(p))
        seen.append(p)
    assert len(set(seen)) == len(seen)


def test_grid_covers_the_space_exactly_once(space):
    s = make_strategy("grid", space, seed=0)
    pts = []
    while (p := s.ask()) is not None:
        pts.append(p)
    assert len(pts) == len(set(pts)) == len(space.all_points())


def test_evolutionary_beats_random_on_average(space):
    def best_after(name: str, seed: int, n: int = 40) -> float:
        s = make_strategy(name, space, seed=seed)
        best = float("inf")
        for _ in range(n):
            p = s.ask()
            assert p is not None
            score = _score(p)
            s.tell(p, score)
            best = min(best, score)
        return best

    seeds = range(12)
    evo = sum(best_after("evolutionary", k) for k in seeds) / len(seeds)
    rnd = sum(best_after("random", k) for k in seeds) / len(seeds)
    assert evo < rnd


def test_unknown_strategy(space):
    with pytest.raises(UnknownStrategy, match="known: random, grid, evolutionary"):
        make_strategy("annealing", space, 0)


@pytest.mark.parametrize("name", KNOWN)
def test_every_strategy_takes_a_64_bit_campaign_seed(space, name):
    # the planner draws 64-bit seeds when the user gives none; a strategy must not refuse them
    s = make_strategy(name, space, seed=2 ** 63 + 12345)
    p = s.ask()
    s.tell(p, 1.0)
    assert s.ask() != p


def _evidence(space, score, source: str):
    from kfactory.strategies.base import Evidence
    pts = space.all_points()[::16]
    best = min(score(p) for p in pts)
    return [Evidence(p, score(p) / best, source) for p in pts]


def test_transfer_finds_the_best_of_a_landscape_another_campaign_measured(space):
    """Evidence from a device whose times are this one's x 3 (same ranking): the surrogate's first own points
    are already near the optimum, far sooner than its cold start's random design can be."""
    evidence = _evidence(space, lambda p: 3.0 * _score(p), "other-device")
    opt = min(_score(p) for p in space.all_points())
    warm = make_strategy("surrogate", space, seed=4)
    warm.warm(evidence)
    assert warm.prior is not None and warm.prior.sources == ["other-device"]
    firsts = []
    for _ in range(5):
        p = warm.ask()
        firsts.append(_score(p))
        warm.tell(p, _score(p))
    assert min(firsts) <= 1.05 * opt


def test_a_warm_surrogate_leaves_the_sources_best_region_when_it_fails_here(space):
    """The sources rate wide vectors best, and on this device every wide-vector kernel fails (half the space):
    the warm surrogate proposes the sources' best only for its first `init` asks, then draws as a cold start
    does, instead of working through the failing region for ever (it has no two results to fit)."""
    evidence = _evidence(space, lambda p: 1.0 + 1.0 / p.params["vec"] + 0.01 * p.params["unroll"],
                         "wide-vectors-fast")
    fails = [p.params["vec"] >= 8 for p in space.all_points()]
    assert 0.3 < sum(fails) / len(fails) < 0.7
    for seed in range(3):
        s = make_strategy("surrogate", space, seed=seed)
        s.warm(evidence)
        for n in range(1, 61):
            p = s.ask()
            ok = p.params["vec"] < 8
            s.tell(p, _score(p) if ok else None)
            if ok:
                break
        assert ok and n <= s.init + 15, (seed, n)


def test_a_misleading_source_loses_its_weight(space):
    """A source ranking the space upside down gets weight 0 once results disagree with it, and the prior mean
    it would give is flat: the search is a cold one again."""
    import numpy as np
    evidence = _evidence(space, lambda p: 1.0 / _score(p), "upside-down")
    s = make_strategy("surrogate", space, seed=2)
    s.warm(evidence)
    for _ in range(12):
        p = s.ask()
        s.tell(p, _score(p))
    rows, y = s._data()
    trust = s.trust()
    assert trust.evidence == 0.0 and trust.sources[0].weight == 0.0 and trust.sources[0].tau < 0
    assert np.allclose(s.prior.fit(rows, y, trust), y.mean())  # no source: a flat prior mean


def test_a_warm_portfolio_adds_an_evidence_led_member_and_keeps_its_members_cold(space):
    s = make_strategy("default", space, seed=3)
    p = s.ask()
    s.tell(p, _score(p))
    s.warm(_evidence(space, _score, "same-device"))
    assert s.names == ["surrogate", "tpe", "evolutionary", "surrogate-warm"] and s.led == [3]
    lead = s.members[3]
    assert lead.prior is not None and lead.results == {p: _score(p)}
    assert all(getattr(m, "prior", None) is None for m in s.members[:3])
    for _ in range(30):
        q = s.ask()
        s.tell(q, _score(q))
    assert sum(s.asks) == 31 and len(s.seen) == 31
    # the cold members never learned the evidence-led results no cold member asked for
    for m in s.members[:3]:
        assert set(s.withheld).isdisjoint(m.results)


def test_a_warm_portfolios_cold_members_ask_what_a_cold_portfolio_asks(space):
    """Whatever the evidence-led member does, the cold members ask the points a cold portfolio's members ask, in
    the same order (an evidence-led result they ask for is answered at no evaluation): evidence that misleads
    costs the evaluations it was given, never the cold search's course."""
    cold = make_strategy("default", space, seed=4)
    warm = make_strategy("default", space, seed=4)
    warm.warm(_evidence(space, lambda p: 1.0 / _score(p), "upside-down"))
    for s in (cold, warm):
        for _ in range(40):
            p = s.ask()
            s.tell(p, _score(p))
    cold_side = [p for p, i in warm.owner.items() if i not in warm.led]
    assert warm.asks[3] > 0 and len(cold_side) >= 30
    assert cold_side == list(cold.owner)[:len(cold_side)]


def test_the_gp_fits_the_best_half_and_a_spread_of_the_rest():
    import numpy as np
    from kfactory.strategies.encoding import fit_subset
    y = np.random.default_rng(0).permutation(1000).astype(float)
    keep = fit_subset(y, 400)
    assert len(set(keep.tolist())) == 400
    assert set(np.argsort(y)[:200].tolist()) <= set(keep.tolist()) and int(np.argmax(y)) in keep
    assert sorted(fit_subset(y[:50], 400).tolist()) == list(range(50))


def _counting_fits(s):
    """Wrap the surrogate's GP fit to count how often the model is refitted."""
    calls = []
    fit = s.gp.fit
    s.gp.fit = lambda X, y: (calls.append(len(y)), fit(X, y))[1]
    return calls


def test_the_surrogate_refits_every_ask_with_one_point_in_flight(space):
    s = make_strategy("surrogate", space, seed=3)
    fits = _counting_fits(s)
    for _ in range(30):
        p = s.ask()
        s.tell(p, _score(p))
    assert len(fits) == 30 - s.init


def test_with_many_points_in_flight_the_surrogate_serves_its_last_ranking(space):
    s = make_strategy("surrogate", space, seed=3)
    for _ in range(20):
        p = s.ask()
        s.tell(p, _score(p))
    fits = _counting_fits(s)
    flying = [s.ask() for _ in range(40)]
    # below 8 in flight every ask refits; the 9th keeps its ranking, which serves the other 31
    assert len(fits) == 9 and len(set(flying)) == 40
    assert all(space.valid(p) and p not in s.results for p in flying)
    s.tell(flying[0], _score(flying[0]))
    s.ask()  # 1 new result, 40 in flight: the ranking is fresh enough (1 <= 40 // 8)
    assert len(fits) == 9
    for p in flying[1:6]:
        s.tell(p, _score(p))
    s.ask()  # 6 new results, 36 in flight: more than 36 // 8, so it refits
    assert len(fits) == 10


def test_the_gp_likelihood_gradient_is_exact():
    import numpy as np
    from kfactory.strategies.surrogate import GP
    rng = np.random.default_rng(0)
    X = rng.random((50, 4))
    y = np.sin(X @ np.array([3.0, 1.0, 0.2, 2.0]))
    y = (y - y.mean()) / y.std()
    theta = np.append(rng.normal(-0.7, 0.3, 4), -3.0)
    _, grad = GP(4)._nll(theta, X, y)
    h = 1e-6
    numeric = [(GP(4)._nll(theta + e, X, y)[0] - GP(4)._nll(theta - e, X, y)[0]) / (2 * h) for e in np.eye(5) * h]
    assert np.allclose(grad, numeric, rtol=1e-5, atol=1e-6)


def test_tpe_with_many_points_in_flight_costs_at_most_one_failed_trial_an_ask(space):
    from optuna.trial import TrialState
    s = make_strategy("tpe", space, seed=5)
    for _ in range(30):
        p = s.ask()
        s.tell(p, _score(p))
    failed = lambda: len(s.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))  # noqa: E731
    flying = [s.ask() for _ in range(8)]  # below 8 in flight it may draw again and again
    before = failed()
    flying += [s.ask() for _ in range(52)]
    assert len(set(flying)) == 60 and all(space.valid(p) for p in flying)
    assert failed() - before <= 52


def test_a_warm_start_proposes_first_what_every_source_rates_well(space):
    from kfactory.strategies.base import Evidence
    from kfactory.strategies.transfer import rank_points
    a, b, c = space.all_points()[:3]
    evidence = [Evidence(a, 1.0, "A100"), Evidence(a, 3.0, "MI250X"),   # best on one device only
                Evidence(b, 1.1, "A100"), Evidence(b, 1.05, "MI250X"),  # near the best on both
                Evidence(c, 1.2, "A100"), Evidence(c, float("nan"), "MI250X")]
    assert rank_points(evidence, 3) == [b, c, a]
    assert rank_points(evidence, 1) == [b] and rank_points([], 4) == []


def test_tpe_batch_mode_snaps_within_a_space_of_several_families():
    two = Space(load_problem("softmax").families_for("cpu") + load_problem("kda").families_for("cpu"))
    s = make_strategy("tpe", two, seed=7)
    flying = [s.ask() for _ in range(80)]  # 72 of them in batch mode
    assert len(set(flying)) == 80 and all(two.valid(p) for p in flying)
    assert {p.family for p in flying} == set(two.families)
    # a draw (in the study's names) snaps to an unseen valid point of the drawn family
    draw = {"__family__": "cpu_c"}
    for fam in two.families.values():
        draw.update({f"{fam.name}.{n}": values[0] for n, values in fam.spec.params.items()})
    snapped = s._nearest_unseen(draw)
    assert snapped.family == "cpu_c" and two.valid(snapped) and snapped not in s.seen


def test_tpe_in_batch_mode_keeps_its_study_small(space):
    s = make_strategy("tpe", space, seed=9, keep=20)
    flying, asked = [], []
    for _ in range(200):  # 16 in flight: batch mode
        p = s.ask()
        flying.append(p)
        asked.append(p)
        if len(flying) > 16:
            q = flying.pop(0)
            s.tell(q, _score(q))
    assert len(set(asked)) == 200 and all(space.valid(p) for p in asked)
    complete = [t for t in s.study.get_trials(deepcopy=False) if t.state.is_finished() and t.value is not None]
    assert 20 <= len(complete) < 3 * 20 and len(s.values) == 200 - 16


def test_the_seen_mask_follows_the_seen_set_as_it_grows(space):
    """SeenMask reads only what was added since its last call, and still marks exactly the seen rows."""
    import numpy as np

    from kfactory.strategies.encoding import SeenMask, index_of
    idx = index_of(space)
    s = make_strategy("random", space, seed=5)
    mask = SeenMask(idx, s.seen)
    for n in (1, 7, 30):
        for _ in range(n):
            p = s.ask()
            s.tell(p, _score(p))
            s.seen.add(p)  # adding a seen point again changes nothing
        s.seen |= {space.all_points()[n]}  # and the other ways to add to a set are tracked too
        s.seen.update([space.all_points()[n + 1]], [space.all_points()[n + 2]])
        want = np.zeros(len(idx), dtype=bool)
        want[[idx.pos[p] for p in s.seen]] = True
        assert (mask() == want).all() and mask.read == len(s.seen) == len(s.seen.added)


def test_the_evolutionary_elites_kept_as_results_come_are_the_sorted_best(space):
    """Each island's elite and the global one, kept incrementally through asks, failures, results it did not
    ask for, migrations and a point told again with a new score, equal sorting every result each time."""
    s = make_strategy("evolutionary", space, seed=6, islands=3, migrate_every=4, elite=5)

    def sorted_best(points) -> list:
        good = sorted((s.results[p], p.params_json, p) for p in points if s.results.get(p) is not None)
        return [p for _, _, p in good[:5]]

    others = iter(space.all_points()[::7])
    for n in range(90):
        p = s.ask() if n % 5 else next(p for p in others if p not in s.seen)  # every 5th from elsewhere
        s.tell(p, None if p.params["flags"].endswith("fast-math") else _score(p))
        assert s._elite() == sorted_best(s.results)
        assert all(s._elite(i) == sorted_best(s.islands[i]) for i in range(3))
    second = s._elite()[1]
    s.tell(second, s.results[second])  # told again with the same score: still there once
    assert s._elite() == sorted_best(s.results) and len(set(s._elite())) == 5
    best = s._elite()[0]
    s.tell(best, 1e9)  # told again, now the worst: it leaves every elite
    assert best not in s._elite() and s._elite() == sorted_best(s.results)
    assert all(s._elite(i) == sorted_best(s.islands[i]) for i in range(3))


def test_a_space_caches_its_points_but_hands_out_copies(space):
    pts = space.all_points()
    grid = make_strategy("grid", space, seed=1, shuffle=True)
    assert grid.order != pts and space.all_points() == pts  # the shuffle did not reorder the space's own list
    assert all(space.valid(p) for p in pts[:50]) and space.valid(pts[0])


def test_a_space_bounded_by_threads_holds_no_point_that_starts_more():
    """A campaign run with --threads 1 never proposes a point whose kernel starts 2 threads (matvec_q4_1's family
    has threads 1 and 2): it would hold a core the user did not give, and time bimodally beside other work."""
    import random as _random

    fam = load_problem("matvec_q4_1").families["cpu_c"]
    whole, bounded = Space([fam]), Space([fam], max_threads=1)
    two = [p for p in whole.all_points() if p.params["threads"] == 2]
    assert two and all(not bounded.valid(p) and whole.valid(p) for p in two)
    assert {p.params["threads"] for p in bounded.all_points()} == {1}
    assert len(bounded.all_points()) == len(whole.all_points()) - len(two)
    rng = _random.Random(5)
    assert {bounded.random(rng).params["threads"] for _ in range(200)} == {1}
    for name in KNOWN:   # every strategy asks only inside the bound
        s = make_strategy(name, bounded, seed=3)
        asked = [s.ask() for _ in range(12)]
        assert all(p is None or p.params["threads"] == 1 for p in asked), name

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


def test_a_misleading_source_loses_its_weight(space):
    """A source ranking the space upside down gets weight 0 once enough results disagree with it."""
    import numpy as np
    evidence = _evidence(space, lambda p: 1.0 / _score(p), "upside-down")
    s = make_strategy("surrogate", space, seed=2)
    s.warm(evidence)
    for _ in range(12):
        p = s.ask()
        s.tell(p, _score(p))
    rows, y = s._data()
    assert s.prior.weights(rows, y).tolist() == [0.0]
    assert np.allclose(s.prior.fit(rows, y), y.mean() + 0.0 * rows.mean())  # no source: a flat prior mean


def test_a_warm_portfolio_keeps_a_cold_twin_of_its_transferring_member(space):
    s = make_strategy("default", space, seed=3)
    p = s.ask()
    s.tell(p, _score(p))
    s.warm(_evidence(space, _score, "same-device"))
    assert s.names == ["surrogate", "tpe", "evolutionary", "surrogate-cold"]
    twin = s.members[-1]
    assert twin.prior is None and twin.results == {p: _score(p)}
    for _ in range(30):
        q = s.ask()
        s.tell(q, _score(q))
    assert sum(s.asks) == 31 and len(s.seen) == 31


def test_the_gp_fits_the_best_half_and_a_spread_of_the_rest():
    import numpy as np
    from kfactory.strategies.encoding import fit_subset
    y = np.random.default_rng(0).permutation(1000).astype(float)
    keep = fit_subset(y, 400)
    assert len(set(keep.tolist())) == 400
    assert set(np.argsort(y)[:200].tolist()) <= set(keep.tolist()) and int(np.argmax(y)) in keep
    assert sorted(fit_subset(y[:50], 400).tolist()) == list(range(50))

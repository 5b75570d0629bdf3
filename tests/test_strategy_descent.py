"""The descent strategy: the first point, then its neighbourhood (reaching a value a constraint ties to another
parameter through the closest valid point), then the neighbourhoods of the best told points, failures and points
in flight never centres, the whole space once, and the same asks for the same results."""
from __future__ import annotations

from pathlib import Path

import pytest

from kfactory.problems import load_problem
from kfactory.problems.loader import Family
from kfactory.problems.spec import FamilySpec
from kfactory.strategies import Space, make_strategy


def _family(name: str, params: dict, constraints: tuple[str, ...] = ()) -> Family:
    spec = FamilySpec(name=name, target="replay", language="replay", template="-", params=params,
                      constraints=list(constraints))
    return Family(spec, Path("."))


#: an engine in miniature: spinning idle threads needs more than one thread
ENGINE = {"threads": [1, 2, 4], "spin": [False, True], "fuse": ["fused", "unfused"], "kv": ["a", "b"]}
SPIN_NEEDS_THREADS = "threads > 1 or not spin"


@pytest.fixture
def toy():
    space = Space([_family("toy", ENGINE, (SPIN_NEEDS_THREADS,))])
    return space, space.all_points()


def _row(points, **params) -> int:
    return next(i for i, p in enumerate(points) if p.params == params)


def _toy_score(point) -> float:
    """Two threads spinning and gate/up unfused win together (10 - 1 - 2 - 1.5 = 5.5 at threads 2)."""
    p = point.params
    return (10.0 - {1: 0.0, 2: 1.0, 4: 0.5}[p["threads"]] - 2.0 * p["spin"] - 1.5 * (p["fuse"] == "unfused")
            + 0.3 * (p["kv"] == "b"))


def _asks(strategy, n: int, score=None) -> list:
    out = []
    for _ in range(n):
        p = strategy.ask()
        out.append(p)
        if score is not None and p is not None:
            strategy.tell(p, score(p))
    return out


def test_the_first_ask_is_the_first_point_then_exactly_its_neighbourhood(toy):
    space, pts = toy
    s = make_strategy("descent", space, seed=0)
    asked = _asks(s, 6)
    start = dict(threads=1, spin=False, fuse="fused", kv="a")
    assert asked[0] == pts[0] and pts[0].params == start
    # threads 2 and 4 one change away; spin only at the closest valid point (two changes: threads 2 and 4 tie,
    # the first in the space's order, 2, is taken); then fuse and kv
    assert [p.params for p in asked[1:]] == [
        {**start, "threads": 2}, {**start, "threads": 4}, {**start, "threads": 2, "spin": True},
        {**start, "fuse": "unfused"}, {**start, "kv": "b"}]
    assert s.centres == [pts[0]] and len(s.neighbours(0)) == 5


def test_the_best_neighbour_becomes_the_centre_and_reaches_a_combination_grid_does_not(toy):
    space, pts = toy
    s = make_strategy("descent", space, seed=0)
    first = _asks(s, 6, _toy_score)
    spin2 = pts[_row(pts, threads=2, spin=True, fuse="fused", kv="a")]
    assert min(first, key=_toy_score) == spin2
    # spin2's neighbours: threads 1 (back to the start, seen), spinning on 4 (unseen), no spin (seen), unfused,
    # kv b
    nxt = _asks(s, 3, _toy_score)
    combo = pts[_row(pts, threads=2, spin=True, fuse="unfused", kv="a")]
    assert nxt == [pts[_row(pts, threads=4, spin=True, fuse="fused", kv="a")], combo,
                   pts[_row(pts, threads=2, spin=True, fuse="fused", kv="b")]]
    assert s.centres == [pts[0], spin2]
    grid = _asks(make_strategy("grid", space, seed=0), 9)
    assert combo not in grid
    # the combination (5.5) is the best: its unseen neighbours come next
    assert [p.params for p in _asks(s, 3, _toy_score)] == [
        dict(threads=4, spin=True, fuse="unfused", kv="a"), dict(threads=2, spin=False, fuse="unfused", kv="a"),
        dict(threads=2, spin=True, fuse="unfused", kv="b")]
    assert s.centres[-1] == combo


def test_a_failure_is_never_a_centre(toy):
    space, pts = toy
    s = make_strategy("descent", space, seed=0)
    spin2 = pts[_row(pts, threads=2, spin=True, fuse="fused", kv="a")]
    _asks(s, 6, lambda p: None if p == spin2 else _toy_score(p))
    # the failed point would have been the best (7.0); the next best told is gate/up unfused on 1 thread (8.5)
    unfused = pts[_row(pts, threads=1, spin=False, fuse="unfused", kv="a")]
    assert [p.params for p in _asks(s, 3, _toy_score)] == [
        dict(threads=2, spin=False, fuse="unfused", kv="a"), dict(threads=4, spin=False, fuse="unfused", kv="a"),
        dict(threads=2, spin=True, fuse="unfused", kv="a")]
    assert s.centres == [pts[0], unfused] and spin2 not in s.centres


def test_a_point_in_flight_is_not_a_centre_until_it_is_told(toy):
    space, pts = toy
    s = make_strategy("descent", space, seed=0)
    first = _asks(s, 6)
    spin2 = pts[_row(pts, threads=2, spin=True, fuse="fused", kv="a")]
    for p in first:
        if p != spin2:
            s.tell(p, _toy_score(p))
    assert s.pending() == 1
    unfused = pts[_row(pts, threads=1, spin=False, fuse="unfused", kv="a")]
    assert [p.params for p in _asks(s, 2)] == [
        dict(threads=2, spin=False, fuse="unfused", kv="a"), dict(threads=4, spin=False, fuse="unfused", kv="a")]
    assert s.centres == [pts[0], unfused]
    s.tell(spin2, _toy_score(spin2))  # told now, and the best: the next centre once unfused's neighbours are asked
    assert [p.params for p in _asks(s, 2)] == [
        dict(threads=2, spin=True, fuse="unfused", kv="a"), dict(threads=1, spin=False, fuse="unfused", kv="b")]
    assert [p.params for p in _asks(s, 2)] == [
        dict(threads=4, spin=True, fuse="fused", kv="a"), dict(threads=2, spin=True, fuse="fused", kv="b")]
    assert s.centres[-1] == spin2


def test_nothing_told_yet_falls_back_to_the_space_order(toy):
    space, pts = toy
    s = make_strategy("descent", space, seed=0)
    asked = _asks(s, 6)
    # every point in flight: no centre; the unseen points follow in the space's order, a budget is still spent
    rest = [p for p in pts if p not in asked]
    assert _asks(s, 3) == rest[:3] and s.centres == [pts[0]]


def test_with_everything_told_asks_cover_the_space_exactly_once(toy):
    space, pts = toy
    s = make_strategy("descent", space, seed=0)
    asked = _asks(s, len(pts), _toy_score)
    assert sorted(asked, key=pts.index) == pts and s.ask() is None
    softmax = Space(load_problem("softmax").families_for("cpu"))
    s = make_strategy("descent", softmax, seed=0)
    asked = []
    while (p := s.ask()) is not None:
        asked.append(p)
        s.tell(p, _softmax_score(p))
    assert len(asked) == len(set(asked)) == len(softmax.all_points())


def test_a_centre_descends_only_within_its_family_and_the_other_family_still_comes():
    other = _family("other", {"threads": [1, 2], "kv": ["a", "b"]})
    space = Space([_family("toy", ENGINE, (SPIN_NEEDS_THREADS,)), other])
    pts = space.all_points()
    s = make_strategy("descent", space, seed=0)
    asked = _asks(s, len(pts), lambda p: _toy_score(p) if p.family == "toy" else 1.0 + p.params["threads"])
    assert {p.family for p in asked[:20]} == {"toy"} and {p.family for p in asked[20:]} == {"other"}
    assert s.ask() is None and sorted(asked, key=pts.index) == pts
    assert {c.family for c in s.centres} == {"toy", "other"}
    for c in s.centres:
        assert {n.family for n in s.neighbours(pts.index(c))} == {c.family}


def _softmax_score(point) -> float:
    p = point.params
    return (1.0 / p["vec"] + {"online": 0.1, "two": 0.3, "three": 0.6}[p["passes"]]
            + (0.0 if p["exp"] == "poly" else 0.5) + 0.1 / p["threads"])


def test_the_same_results_give_the_same_asks_whatever_the_seed():
    space = Space(load_problem("softmax").families_for("cpu"))
    runs = [_asks(make_strategy("descent", space, seed=seed), 60, _softmax_score) for seed in (1, 1, 2 ** 63 + 5)]
    assert runs[0] == runs[1] == runs[2]
    assert len(set(runs[0])) == 60


def _engine_space() -> Space:
    """The engine campaign's own design space (4 threads), with the family the engine campaigns search."""
    from kfactory.engines.design import space as designs_of
    from kfactory.engines.order import order
    from kfactory.engines.problem import engine_family

    # with AVX-512's table decode and without AVX512-VNNI's, whatever this host has
    return Space([engine_family(order(designs_of(4, avx512=True, vnni=False)), Path("."))])


def test_on_the_engine_space_spinning_threads_and_unfused_gate_up_are_measured_together_before_grid_does():
    """The engine campaign's case: spinning wins among the default's changes and unfused gate/up helps too; the
    descent measures them together right after the default's neighbourhood, a grid in the campaign's order
    later."""
    space = _engine_space()
    default = space.all_points()[0].params

    def score(point) -> float:
        p = point.params
        return 1.0 - 0.2 * p["spin"] - 0.1 * (not p["fuse_gate_up"]) - 0.02 * (p["threads"] - 1)

    def combination(point) -> bool:
        return point.params["spin"] and not point.params["fuse_gate_up"]

    s = make_strategy("descent", space, seed=0)
    hood = len(s.neighbours(0))
    asked = _asks(s, hood + 1, score)
    assert asked[0].params == default and not any(combination(p) for p in asked)
    spin_changes = [{k: p.params[k] for k in p.params if p.params[k] != default[k]} for p in asked
                    if p.params["spin"]]
    # the first of the closest valid points spinning (more threads share a step in one region: team "step")
    assert spin_changes == [{"spin": True, "team": "step", "threads": 2}]
    # the threads, how they wait and share a step, and the Q4_1 decode kernel come first (engine_family's
    # SEARCH_FIRST), then the rest in field order
    changed = [sorted(k for k in p.params if p.params[k] != default[k]) for p in asked[1:8]]
    assert changed == [["team", "threads"]] * 3 + [["team", "threads", "wait"], ["spin", "team", "threads"],
                                                   ["q4_decode"], ["weights"]]
    # the best neighbour (spinning on 2 threads) is the centre; its unseen neighbours: spinning on 3 and 4
    # threads, its table decode, then weights, fuse_qkv and fuse_gate_up in the design's field order, which
    # unfuses gate/up
    more = _asks(s, 6, score)
    assert [combination(p) for p in more] == [False] * 5 + [True]
    assert s.centres[1].params == {**default, "threads": 2, "spin": True, "team": "step"}
    assert not any(combination(p) for p in _asks(make_strategy("grid", space, seed=0), hood + 4))


def test_jump_moves_to_a_clear_win_before_the_rest_of_the_neighbourhood():
    """With `jump`, a neighbour that beats the centre by more than the factor becomes the centre when it is told:
    its unseen neighbours come next, and the old neighbourhood's rest follows, none of it lost. A win below the
    factor, or no jump at all, keeps best-improvement's order."""
    space = _engine_space()
    default = space.all_points()[0].params

    def score(point) -> float:   # two spinning threads: x1.25 the default; nothing else matters
        return 0.8 if point.params["spin"] else 1.0

    plain = make_strategy("descent", space, seed=0)
    hood = plain.neighbours(0)
    plain_asks = _asks(plain, len(hood) + 1, score)
    assert plain_asks == [space.all_points()[0], *hood]          # the whole neighbourhood first
    assert [p.params for p in _asks(make_strategy("descent", space, seed=0, jump=30.0), 8, score)] == \
        [p.params for p in plain_asks[:8]]                         # 25% faster does not clear 30%

    s = make_strategy("descent", space, seed=0, jump=20.0)
    asked = _asks(s, 3 * len(hood), score)
    spin_at = next(i for i, p in enumerate(asked) if p.params["spin"])
    assert asked[:spin_at + 1] == plain_asks[:spin_at + 1]
    assert s.centres[1].params == {**default, "threads": 2, "spin": True, "team": "step"}
    centre_row = s.idx.pos[s.centres[1]]
    fresh = [p for p in s.neighbours(centre_row) if p not in plain_asks[:spin_at + 1]]
    assert asked[spin_at + 1:spin_at + 1 + len(fresh)] == fresh   # the new centre's neighbours at once
    rest = asked[spin_at + 1 + len(fresh):]
    # the default's rest is set aside: the next centre (another spinning design) and its neighbours come first
    assert set(hood) - set(asked[:spin_at + 1 + len(fresh)]) and s.centres[2].params["spin"]
    seen = set(asked[:spin_at + 1 + len(fresh)])
    third = [p for p in s.neighbours(s.idx.pos[s.centres[2]]) if p not in seen]
    assert third and rest[:len(third)] == third


def test_a_jump_sets_the_old_neighbourhood_aside_and_loses_none_of_it(toy):
    """After a jump the old centre's unseen neighbours wait until no told point has an unseen neighbour, then
    come before the rest of the space; every point is asked once."""
    space, pts = toy
    start = pts[0].params

    def score(point) -> float:   # two threads win by far; spinning on them a little more; nothing else matters
        p = point.params
        return 10.0 - 5.0 * (p["threads"] == 2) - 1.0 * (p["threads"] == 2 and p["spin"])

    s = make_strategy("descent", space, seed=0, jump=30.0)
    asked = _asks(s, len(pts) + 1, score)
    assert asked[-1] is None and sorted(asked[:-1], key=pts.index) == pts      # all of it, once each
    two = pts[_row(pts, **{**start, "threads": 2})]
    assert asked[:2] == [pts[0], two] and s.centres[:2] == [pts[0], two]      # the jump, at once
    # two threads' unseen neighbours next, then (no jump: spinning is x1.25) the best told point's, spinning on
    # two threads; the default's rest (unfused, kv b on one thread) was set aside and does not come between
    hood2 = [p for p in s.neighbours(s.idx.pos[two]) if p not in asked[:2]]
    assert asked[2:2 + len(hood2)] == hood2
    spin2 = pts[_row(pts, **{**start, "threads": 2, "spin": True})]
    assert s.centres[2] == spin2
    hood3 = [p for p in s.neighbours(s.idx.pos[spin2]) if p not in asked[:2 + len(hood2)]]
    assert hood3 and asked[2 + len(hood2):2 + len(hood2) + len(hood3)] == hood3

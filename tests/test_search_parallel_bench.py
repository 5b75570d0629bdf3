"""bench/search_parallel.py on a small hand-made recorded space: one point in flight is the sequential search that
bench/search_quality.py runs, and with P in flight the strategy chooses its k-th point knowing at most k - P
results (fifo) whatever the arrivals, and every asked point is told."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from kfactory.strategies import Space
from kfactory.strategies import base as strategies_base
from kfactory.targets.replay import load_space
from test_search_quality_bench import _write, time_a

BENCH = Path(__file__).resolve().parents[1] / "bench" / "search_parallel.py"


def _bench():
    spec = importlib.util.spec_from_file_location("search_parallel", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_one_in_flight_is_the_sequential_search(tmp_path):
    _write(tmp_path / "k-A.json.gz", time_a)
    mod = _bench()
    rs = load_space(tmp_path / "k-A.json.gz")
    sq = sys.modules["search_quality"]
    for seed in range(3):
        seq = sq.run_kf("default", rs, Space([rs.family()]), seed, 12)
        for arrival in ("fifo", "random"):  # one out at a time: the arrival order has no choice
            assert mod.run_in_flight(rs, Space([rs.family()]), "default", seed, 1, 12, arrival) == seq


def test_with_p_in_flight_the_kth_ask_knows_at_most_k_minus_p_results(tmp_path, monkeypatch):
    _write(tmp_path / "k-A.json.gz", time_a)
    mod = _bench()
    rs = load_space(tmp_path / "k-A.json.gz")
    log: list[tuple[str, int]] = []
    ask, tell = strategies_base.Strategy.ask, strategies_base.Strategy.tell

    def asking(self):
        log.append(("ask", len(self.results)))
        return ask(self)

    def telling(self, point, score):
        log.append(("tell", 0))
        return tell(self, point, score)

    monkeypatch.setattr(strategies_base.Strategy, "ask", asking)
    monkeypatch.setattr(strategies_base.Strategy, "tell", telling)
    for p, arrival in ((3, "fifo"), (3, "random"), (20, "random")):
        log.clear()
        traj = mod.run_in_flight(rs, Space([rs.family()]), "random", 5, p, 10, arrival)
        asks = [known for kind, known in log if kind == "ask"]
        assert len(asks) == 10 and sum(kind == "tell" for kind, _ in log) == 10  # every asked point is told
        assert asks == [max(0, k - p) for k in range(1, 11)], (p, arrival, asks)  # the k-th ask knows k - P
        assert len(traj) == 10 and traj == sorted(traj, reverse=True) and traj[-1] >= 1.0


def test_the_bench_writes_the_hard_spaces_geomean_per_p(tmp_path, capsys):
    _write(tmp_path / "k-A.json.gz", time_a)
    out = tmp_path / "out.json"
    mod = _bench()
    assert mod.main(["--data", str(tmp_path), "--parallel", "1", "4", "--budgets", "5", "10", "--seeds", "2",
                     "--jobs", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["spaces"]["k-A"]) == {"fifo", "random"}
    assert set(doc["spaces"]["k-A"]["fifo"]) == {"1", "4"}
    for row in doc["spaces"]["k-A"]["fifo"].values():
        assert set(row) == {"5", "10"} and row["5"] >= row["10"] >= 1.0
    assert "ratio to P=1" in capsys.readouterr().out or not doc["hard"]
    # 32 points: random search finds the optimum within 100, so k-A is no hard space and nothing is paired
    assert doc["hard"] == [] and doc["paired"] == {}


def test_the_paired_table_pairs_each_arrival_with_the_first_by_space_and_seed():
    mod = _bench()
    finals = {"s": {"verify": {3: [[2.0, 1.0], [4.0, 2.0]]}, "screen": {3: [[2.0, 1.1], [4.0, 2.2]]}},
              "t": {"verify": {3: [[1.0, 1.0]]}, "screen": {3: [[1.0, 1.0]]}}}
    out = mod.paired_table(finals, ["s"], ["verify", "screen"], [3], [1, 2])
    assert out["screen"]["3"]["1"] == [1.0, 1.0, 1.0]   # the same at the first ask
    assert abs(out["screen"]["3"]["2"][0] - 1.1) < 1e-12   # 1.1x in both pairs of the hard space; t is not hard
    assert mod.paired_table(finals, [], ["verify", "screen"], [3], [1]) == {}


def test_the_paired_ratio_is_the_geometric_mean_with_an_interval_around_it():
    mod = _bench()
    assert mod.paired_ratio([1.0, 2.0, 4.0], [1.0, 2.0, 4.0]) == [1.0, 1.0, 1.0]
    assert mod.paired_ratio([2.0], [3.0]) == [1.5, 1.5, 1.5]  # one pair: nothing to resample
    mean, low, high = mod.paired_ratio([1.0, 1.0, 1.0, 1.0], [1.1, 1.2, 1.1, 1.2])
    assert abs(mean - (1.1 * 1.2) ** 0.5) < 1e-12 and 1.1 - 1e-9 <= low < mean < high <= 1.2 + 1e-9


SCRIPT = [1.0, 9.0, 9.0, 0.9, 9.0, 9.0]  # the recorded times of the first six points, in the space's order


def _scripted(tmp_path):
    """A recorded space whose first six points (the grid's first asks) take SCRIPT's times, the rest 9 ms."""
    _write(tmp_path / "k-A.json.gz", time_a)
    first = [(p.params["block_size_x"], p.params["tile"], p.params["flag"])
             for p in Space([load_space(tmp_path / "k-A.json.gz").family()]).all_points()[:6]]
    times = dict(zip(first, SCRIPT))
    path = tmp_path / "k-S.json.gz"
    _write(path, lambda b, t, f: times.get((b, t, f), 9.0))
    rs = load_space(path)
    return rs, Space([rs.family()])


def _told(mod, rs, space, monkeypatch, **kw) -> tuple[list, list[float], float]:
    """(the asks and tells in turn, the points' times in the order told, the device clock at the end)."""
    log: list = []
    ask, tell = strategies_base.Strategy.ask, strategies_base.Strategy.tell

    def asking(self):
        log.append("ask")
        return ask(self)

    def telling(self, point, score):
        log.append(score)
        return tell(self, point, score)

    monkeypatch.setattr(strategies_base.Strategy, "ask", asking)
    monkeypatch.setattr(strategies_base.Strategy, "tell", telling)
    from kfactory.strategies import make_strategy
    camp = mod.DeviceCampaign(rs, make_strategy("grid", space, seed=0), 3, 6, **kw)
    assert camp.run() == SCRIPT
    return log, [e for e in log if e != "ask"], camp.clock


def test_screen_first_tells_a_point_that_passed_its_screen_after_later_ones_screened_out(tmp_path, monkeypatch):
    """Worked by hand, device costs screen 1, verify 1.5, measure 1.5, factor 1.5, three in flight: the first
    three pass their screens (nothing is measured yet), the first measurement (1.0 ms, at 9) sets the bar; the
    fourth point (0.9) passes its screen at 13, and the fifth and sixth (9, over 1.5 x 1.0) are screened out at
    14 and 15, before the fourth's measurement ends at 18."""
    mod = _bench()
    rs, space = _scripted(tmp_path)
    log, told, clock = _told(mod, rs, space, monkeypatch, order="screen")
    assert told == [1.0, 9.0, 9.0, 9.0, 9.0, 0.9] and clock == 6 * 1 + 4 * (1.5 + 1.5)
    assert log[:5] == ["ask", "ask", "ask", 1.0, "ask"]  # a slot freed is asked for at once
    # verify first: every point verified (1.5) and screened (1), the four that pass measured: the same order
    _, told, clock = _told(mod, rs, space, monkeypatch, order="verify")
    assert told == [1.0, 9.0, 9.0, 9.0, 9.0, 0.9] and clock == 6 * (1.5 + 1) + 4 * 1.5
    # told at its screen, the fourth point comes back in the order asked; the device's work is the same
    _, told, clock = _told(mod, rs, space, monkeypatch, order="screen", early=True)
    assert told == [1.0, 9.0, 9.0, 0.9, 9.0, 9.0] and clock == 18
    # held: no ask while a point that passed its screen is out, so the fourth waits for the third's measurement
    log, told, _ = _told(mod, rs, space, monkeypatch, order="screen", hold=True)
    assert log[:9] == ["ask", "ask", "ask", 1.0, 9.0, 9.0, "ask", "ask", "ask"] and told[3:] == [9.0, 9.0, 0.9]

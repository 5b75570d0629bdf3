"""Shared helpers for model-based strategies: every valid point of a space, once, with a numeric encoding.

The recorded and built-in spaces are small enough (thousands of points) to enumerate, so model-based
strategies score every unseen valid point each step instead of optimising an acquisition function.

Encoding: per family, each parameter with more than one value becomes one column. Ordered numeric values
map to their rank scaled to [0, 1] (neighbouring values are near each other whatever their spacing);
other values become one-hot columns. With several families, a one-hot family indicator is added and a
family's columns are 0 for the other families' points.

Integer parameters also get alignment columns where they say something the rank does not: whether the value
is a power of two, and how many times 2 divides it (its trailing zero bits, by rank). GPU times are combs in
launch geometry, not smooth curves: a block width that divides the problem evenly, or a multiple of the warp
or of a memory transaction, can beat its neighbours by 3x and more (convolution on an A4000: 32, 64, 128 and
256 wide blocks against 48, 80, 96, ...), or by the few per cent that decide the optimum (dedispersion on an
MI250X: block heights that are multiples of 32 against those of 8). A GP over the rank alone sees that as noise.
With these columns, the default strategy's geometric mean of best/optimum over the hard recorded spaces went
from 1.357 / 1.094 / 1.027 to 1.237 / 1.064 / 1.013 at 50 / 100 / 200 evaluations (bench/search_quality.py,
30 seeds).
"""
from __future__ import annotations

import weakref

import numpy as np

from kfactory.strategies.base import Point, Seen, Space

_CACHE: "weakref.WeakKeyDictionary[Space, SpaceIndex]" = weakref.WeakKeyDictionary()


def _ordered(values: list) -> bool:
    return len(values) > 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _scaled_ranks(values) -> dict:
    """Each distinct value's rank among them, scaled to [0, 1]."""
    order = sorted(values)
    return {v: i / (len(order) - 1) for i, v in enumerate(order)}


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _power_of_two(v) -> bool:
    return _positive_int(v) and v & (v - 1) == 0


def _v2(v) -> int:
    """How many times 2 divides v (its trailing zero bits); 0 for anything but a positive int."""
    return (v & -v).bit_length() - 1 if _positive_int(v) else 0


def _mixed_powers_of_two(values: list) -> bool:
    """Whether a power-of-two column says anything: some values are powers of two and some are not."""
    return len({_power_of_two(v) for v in values}) == 2


def _valuation_adds(values: list) -> bool:
    """Whether a trailing-zeros column says anything the rank does not: positive ints whose 2-adic valuation
    is not already in the order of their values (1, 2, 4, 8 is; 32, 40, 48, ..., 256 is not)."""
    if not all(_positive_int(v) for v in values):
        return False
    tz = [_v2(v) for v in sorted(values)]
    return len(set(tz)) > 1 and tz != sorted(tz)


class SpaceIndex:
    """points[i] <-> X[i]; pos[point] == i."""

    def __init__(self, space: Space):
        self.points: list[Point] = space.all_points()
        self.pos: dict[Point, int] = {p: i for i, p in enumerate(self.points)}
        fams = list(space.families.values())
        cols: list[tuple] = []  # (family, param, kind, payload)
        for f in fams:
            for name, values in f.spec.params.items():
                if len(values) < 2:
                    continue
                if _ordered(values):
                    cols.append((f.name, name, "rank", _scaled_ranks(values)))
                    if _mixed_powers_of_two(values):
                        cols.append((f.name, name, "pow2", None))
                    if _valuation_adds(values):  # rank of the valuation, as for the values themselves
                        cols.append((f.name, name, "v2", _scaled_ranks({_v2(v) for v in values})))
                else:
                    for v in values:
                        cols.append((f.name, name, "onehot", v))
        multi = len(fams) > 1
        d = len(cols) + (len(fams) if multi else 0)
        X = np.zeros((len(self.points), max(d, 1)))
        fam_col = {f.name: len(cols) + i for i, f in enumerate(fams)}
        for i, p in enumerate(self.points):
            params = p.params
            for j, (fam, name, kind, payload) in enumerate(cols):
                if fam != p.family:
                    continue
                if kind == "rank":
                    X[i, j] = payload[params[name]]
                elif kind == "v2":
                    X[i, j] = payload[_v2(params[name])]
                elif kind == "pow2":
                    X[i, j] = 1.0 if _power_of_two(params[name]) else 0.0
                else:
                    X[i, j] = 1.0 if params[name] == payload else 0.0
            if multi:
                X[i, fam_col[p.family]] = 1.0
        self.X = X
        # integer codes: one column per (family, parameter), -1 for the other families' points
        keys = [(f.name, name, values) for f in fams for name, values in f.spec.params.items()]
        codes = np.full((len(self.points), len(keys)), -1, dtype=np.int32)
        for i, p in enumerate(self.points):
            params = p.params
            for j, (fam, name, values) in enumerate(keys):
                if fam == p.family:
                    codes[i, j] = values.index(params[name])
        self.codes = codes
        self.family_of = np.array([list(space.families).index(p.family) for p in self.points], dtype=np.int32)
        # groups of columns that belong to one parameter (for neighbourhoods and per-parameter lengthscales)
        self.columns = cols

    def __len__(self) -> int:
        return len(self.points)

    def rows(self, points) -> np.ndarray:
        """The rows of those of `points` that are in the index (other points are skipped)."""
        return np.array([i for p in points if (i := self.pos.get(p)) is not None], dtype=np.int64)

    def hamming(self, i: int) -> np.ndarray:
        """How many parameters each point differs from point i in (other families: a large number)."""
        return self.hamming_to(self.codes[i], int(self.family_of[i]))

    def hamming_to(self, codes: np.ndarray, family: int) -> np.ndarray:
        """The same for any point of family number `family` given as a row of codes (one need not be valid)."""
        d = (self.codes != codes).sum(axis=1)
        return np.where(self.family_of == family, d, 1 << 20)

    def neighbours(self, i: int) -> np.ndarray:
        """Indices of the points one step from point i (same family): those that differ from it in exactly one
        parameter, and, for a value of a parameter that no such point takes because a constraint ties it to
        another parameter (a tile size of 1 needs a stride of 0), the points that take that value and differ
        in one other parameter. Without them a local search could never step across a constraint."""
        d = self.hamming(i)
        one, two = np.flatnonzero(d == 1), np.flatnonzero(d == 2)
        if len(two) == 0:
            return one
        here, c1, c2 = self.codes[i], self.codes[one], self.codes[two]
        cut = np.zeros(len(two), dtype=bool)
        for j in range(self.codes.shape[1]):
            reached = np.unique(c1[:, j])
            cut |= (c2[:, j] != here[j]) & ~np.isin(c2[:, j], reached)
        return np.sort(np.concatenate([one, two[cut]]))


class SeenMask:
    """Which rows of an index a strategy has seen, brought up to date on each call by reading only the points
    added to its `seen` since the last one (rebuilding it from the whole set on every ask cost a planner with
    ten thousand results more than its model did)."""

    def __init__(self, idx: SpaceIndex, seen: Seen):
        self.idx, self.seen, self.read = idx, seen, 0
        self.mask = np.zeros(len(idx), dtype=bool)

    def __call__(self) -> np.ndarray:
        new = self.seen.added[self.read:]
        self.read += len(new)
        if new:
            self.mask[self.idx.rows(new)] = True
        return self.mask


def fit_subset(y: np.ndarray, limit: int) -> np.ndarray:
    """Indices of at most `limit` of the values y (lower is better) for an exact GP to fit: the best half
    (where the search looks) and an even spread of the rest. An exact GP is cubic in its rows; past a few
    hundred, more rows cost the planner far more than they add to the model."""
    order = np.argsort(y, kind="stable")
    if len(order) <= limit:
        return order
    half = limit // 2
    rest = order[half:]
    return np.concatenate([order[:half], rest[np.linspace(0, len(rest) - 1, limit - half, dtype=int)]])


def index_of(space: Space) -> SpaceIndex:
    """The (cached) index of a space's valid points."""
    idx = _CACHE.get(space)
    if idx is None:
        idx = _CACHE[space] = SpaceIndex(space)
    return idx

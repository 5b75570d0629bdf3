"""The design space a strategy searches (all families of a problem on a target) and the strategy interface."""
from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from random import Random  # the name `random` inside Space is its method: annotations there say Random

from kfactory.problems import Family, ProblemError


@dataclass(frozen=True)
class Point:
    """A design point: a family and one value per parameter."""
    family: str
    params_json: str

    @property
    def params(self) -> dict:
        return json.loads(self.params_json)

    @classmethod
    def of(cls, family: str, params: dict) -> "Point":
        return cls(family, json.dumps(params, sort_keys=True))


@dataclass(frozen=True)
class Evidence:
    """One measurement from another campaign: a point, its score over that campaign's best, and the source."""
    point: Point
    relative: float
    source: str


#: answers of Space.valid kept at most (a space of millions of combinations keeps evaluating past these)
VALID_MEMO_MAX = 1 << 20


class Space:
    """The union of the families' valid points; with `max_threads`, only the points whose kernel runs at most
    that many threads (a campaign asked to run kernels on 1 thread must not measure a point that starts 2: on a
    host whose other core is busy its timings are bimodal, and it holds a core the user did not give it)."""

    def __init__(self, families: list[Family], max_threads: int = 0):
        if not families:
            raise ValueError("no family to search")
        self.families = {f.name: f for f in families}
        self.max_threads = max_threads
        # a planner asks thousands of times whether a point is valid and, late in a campaign, for every valid
        # point; each answer evaluates the constraints, so both are kept
        self._points: list[Point] | None = None
        self._valid: dict[Point, bool] = {}

    def all_points(self) -> list[Point]:
        """Every valid point, in a fixed order (a new list: the caller may reorder it)."""
        if self._points is None:
            self._points = [Point.of(f.name, p) for f in self.families.values() for p in f.points()
                            if self._fits(f, p)]
        return list(self._points)

    def random(self, rng: Random, tries: int = 1000) -> Point:
        for _ in range(tries):
            fam = rng.choice(list(self.families.values()))
            params = fam.random_point(rng)
            if self._fits(fam, params):
                return Point.of(fam.name, params)
        raise ProblemError(f"no point of {', '.join(self.families)} runs on at most {self.max_threads} threads in "
                         f"{tries} random draws")

    def _fits(self, fam: Family, params: dict) -> bool:
        return not self.max_threads or fam.threads_at(params) <= self.max_threads

    def valid(self, point: Point) -> bool:
        ok = self._valid.get(point)
        if ok is None:
            fam = self.families.get(point.family)
            ok = fam is not None and fam.valid(point.params) and self._fits(fam, point.params)
            if len(self._valid) < VALID_MEMO_MAX:
                self._valid[point] = ok
        return ok

    def mutate(self, point: Point, rng: Random, n: int = 1) -> Point:
        """Change n parameters: ordered numeric values move to a neighbour, others to a random value."""
        fam = self.families[point.family]
        params = point.params
        for name in rng.sample(list(fam.spec.params), k=min(n, len(fam.spec.params))):
            values = fam.spec.params[name]
            i = values.index(params[name])
            if all(isinstance(v, (int, float)) for v in values) and len(values) > 2:
                j = min(len(values) - 1, max(0, i + rng.choice((-1, 1))))
            else:
                j = rng.randrange(len(values))
            params[name] = values[j]
        return Point.of(point.family, params)

    def crossover(self, a: Point, b: Point, rng: Random) -> Point:
        if a.family != b.family:
            return a
        pa, pb_ = a.params, b.params
        return Point.of(a.family, {k: rng.choice((pa[k], pb_[k])) for k in pa})


class Seen(set[Point]):
    """A strategy's seen points, and the order they were added in (`added`), so that an index of them can be
    kept up to date by reading only what is new."""

    def __init__(self):
        super().__init__()
        self.added: list[Point] = []

    def add(self, point: Point) -> None:
        if point not in self:
            super().add(point)
            self.added.append(point)

    def update(self, *others: Iterable[Point]) -> None:
        for points in others:
            for p in points:
                self.add(p)

    def __ior__(self, other: Iterable[Point]) -> Seen:  # type: ignore[override,misc]  # any iterable, like update
        self.update(other)
        return self


class Strategy(ABC):
    """ask/tell search over a Space; never proposes the same point twice."""

    def __init__(self, space: Space, seed: int):
        self.space = space
        self.rng = random.Random(seed)
        self.seen = Seen()
        self.results: dict[Point, float | None] = {}
        #: the strategy whose in-flight points count as this one's (a portfolio sets itself on its members)
        self.outer: Strategy | None = None

    def pending(self) -> int:
        """Points asked and not yet told (of the portfolio this strategy is a member of, if any): how blind a
        model fitted to the results is to what is already in flight."""
        s = self.outer or self
        return len(s.seen) - len(s.results)

    def trust(self):
        """How far this strategy trusts each source of its evidence now (agreement.Trust: each source's rank
        agreement with this campaign's results and its weight), or None when it measures no such thing (no
        evidence, or a strategy that cannot use it)."""
        return None

    def warm(self, evidence: list) -> None:
        """Evidence from other campaigns (Evidence: point, relative score, source) to learn from before
        any result of this one; strategies that cannot use it ignore it (the planner still proposes the best
        of it first)."""

    @abstractmethod
    def _next(self) -> Point | None: ...

    def ask(self) -> Point | None:
        """The next unseen valid point, or None when the strategy has nothing left to propose."""
        point = self._next()
        if point is not None:
            self.seen.add(point)
        return point

    def tell(self, point: Point, score: float | None) -> None:
        """Record a result: seconds (lower is better), or None for a failure of any kind."""
        self.seen.add(point)
        self.results[point] = score

    def _fresh_random(self, tries: int = 200) -> Point | None:
        for _ in range(tries):
            p = self.space.random(self.rng)
            if p not in self.seen:
                return p
        rest = [p for p in self.space.all_points() if p not in self.seen]
        return self.rng.choice(rest) if rest else None

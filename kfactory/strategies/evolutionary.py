"""Evolutionary search on islands: several sub-populations breed apart and periodically exchange their best.

It starts with random points; once `warmup` results are in, each ask goes to the next island in turn, which
breeds a child from its elite (the best `elite` points the island has measured or received), by tournament
selection, crossover and mutation, with a little random immigration so it does not collapse. Every
`migrate_every` results, each island sends its best `migrants` to the next island (a ring). With islands=1 it
is the former single-population search (same options: warmup, elite, immigration).

Failures are results: a failed point is in `seen` and never asked again, and children near failures are
penalised: a child within `fail_radius` parameters of a failed point is rejected with probability
`fail_reject` (the search keeps a chance to cross a failing border, but pays for few failures).

Each island's elite and the global one are kept as results come in (a sorted list of at most `elite`), not
sorted again from every result on every ask: that sort was most of an ask's cost late in a long campaign.
"""
import bisect

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.options import Option

OPTIONS: dict[str, Option] = {
    "warmup": Option("random points measured before breeding starts", 8, int, low=0),
    "elite": Option("best points an island breeds from", 6, int, low=2),
    "immigration": Option("chance that an ask draws a random point instead of breeding", 0.15, float, low=0, high=1),
    "islands": Option("sub-populations that breed apart (1: a single population)", 2, int, low=1),
    "migrate_every": Option("results between two migrations of the best points around the ring", 8, int, low=1),
    "migrants": Option("best points each island sends at a migration", 1, int, low=0),
    "fail_radius": Option("a child within this many changed parameters of a failed point is near a failure", 1, int,
                          low=0),
    "fail_reject": Option("chance of rejecting a child near a failure", 0.8, float, low=0, high=1),
}


class Evolutionary(Strategy):
    def __init__(self, space: Space, seed: int, warmup: int = 8, elite: int = 6, immigration: float = 0.15,
                 islands: int = 2, migrate_every: int = 8, migrants: int = 1, fail_radius: int = 1,
                 fail_reject: float = 0.8):
        super().__init__(space, seed)
        self.warmup, self.elite, self.immigration = warmup, elite, immigration
        self.n_islands = max(1, islands)
        self.migrate_every, self.migrants = migrate_every, migrants
        self.fail_radius, self.fail_reject = fail_radius, fail_reject
        self.islands: list[set[Point]] = [set() for _ in range(self.n_islands)]
        #: the best `elite` results of each island and of all, best first, as (score, params_json, point)
        self.tops: list[list[tuple]] = [[] for _ in range(self.n_islands)]
        self.top: list[tuple] = []
        self.home: dict[Point, int] = {}     # the island that asked a point (results go there)
        self.turn = 0
        self.failed: list[dict] = []
        self._since_migration = 0

    # ---------------------------------------------------------------- selection
    def _elite(self, island: int | None = None) -> list[Point]:
        return [p for _, _, p in (self.top if island is None else self.tops[island])]

    def _keep(self, top: list[tuple], point: Point) -> None:
        """Enter a result in a best-first list of at most `elite` (failures never enter)."""
        score = self.results.get(point)
        if score is None:
            return
        item = (score, point.params_json, point)
        if len(top) < self.elite or item < top[-1]:
            bisect.insort(top, item)
            del top[self.elite:]

    def _join(self, island: int, point: Point) -> None:
        if point not in self.islands[island]:
            self.islands[island].add(point)
            self._keep(self.tops[island], point)

    def _rebuild_tops(self) -> None:
        """From scratch, for a point told a second time with another score (a list cannot forget the first)."""
        self.top, self.tops = [], [[] for _ in range(self.n_islands)]
        for p in self.results:
            self._keep(self.top, p)
        for i, members in enumerate(self.islands):
            for p in members:
                self._keep(self.tops[i], p)

    def _tournament(self, elite: list[Point]) -> Point:
        i, j = self.rng.randrange(len(elite)), self.rng.randrange(len(elite))
        return elite[min(i, j)]  # elite is sorted best-first

    def _near_failure(self, p: Point) -> bool:
        if not self.failed:
            return False
        a = p.params
        for f in self.failed:
            if f.keys() == a.keys() and sum(a[k] != f[k] for k in a) <= self.fail_radius:
                return True
        return False

    # ---------------------------------------------------------------- ask / tell
    def _next(self) -> Point | None:
        island = self.turn % self.n_islands
        self.turn += 1
        p = self._breed(island)
        if p is not None:
            self.home[p] = island
        return p

    def _breed(self, island: int) -> Point | None:
        elite = self._elite(island)
        if len(elite) < 2:
            elite = self._elite()  # an island without its own elite yet borrows the global one
        if len(elite) < 2 or len(self.results) < self.warmup or self.rng.random() < self.immigration:
            return self._fresh_random()
        for _ in range(100):
            a, b = self._tournament(elite), self._tournament(elite)
            child = self.space.crossover(a, b, self.rng) if self.rng.random() < 0.5 else a
            child = self.space.mutate(child, self.rng, n=self.rng.choice((1, 1, 2)))
            if child in self.seen or not self.space.valid(child):
                continue
            if self._near_failure(child) and self.rng.random() < self.fail_reject:
                continue
            return child
        return self._fresh_random()

    def tell(self, point: Point, score: float | None) -> None:
        first = point not in self.results
        retold = not first and self.results[point] != score
        super().tell(point, score)
        island = self.home.get(point)
        if island is None:  # a result it did not ask for (e.g. from a portfolio): the smallest island takes it
            island = min(range(self.n_islands), key=lambda i: len(self.islands[i]))
            self.home[point] = island
        if retold:
            self.islands[island].add(point)
            self._rebuild_tops()
        else:
            if first:
                self._keep(self.top, point)
            self._join(island, point)
        if score is None:
            self.failed.append(point.params)
        self._since_migration += 1
        if self.n_islands > 1 and self._since_migration >= self.migrate_every:
            self._since_migration = 0
            self._migrate()

    def _migrate(self) -> None:
        best = [self._elite(i)[: self.migrants] for i in range(self.n_islands)]
        for i, sent in enumerate(best):
            for p in sent:
                self._join((i + 1) % self.n_islands, p)


def make(space: Space, seed: int, **options) -> Strategy:
    """An island evolutionary search; options as in OPTIONS."""
    return Evolutionary(space, seed, **options)

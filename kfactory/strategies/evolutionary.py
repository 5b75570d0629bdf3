"""A simple evolutionary search: tournament selection among the best, mutation and crossover.

It starts with random points; once `warmup` results are in, each ask breeds a child from the elite
(the best `elite` points measured so far), with a little random immigration so it does not collapse.
Failed points stay in `seen`, so the search never pays for them twice.
"""
from kfactory.strategies.base import Point, Space, Strategy


class Evolutionary(Strategy):
    def __init__(self, space: Space, seed: int, warmup: int = 8, elite: int = 6, immigration: float = 0.15):
        super().__init__(space, seed)
        self.warmup, self.elite, self.immigration = warmup, elite, immigration

    def _elite(self) -> list[Point]:
        good = sorted((s, p.params_json, p) for p, s in self.results.items() if s is not None)
        return [p for _, _, p in good[: self.elite]]

    def _next(self) -> Point | None:
        elite = self._elite()
        if len(elite) < 2 or len(self.results) < self.warmup or self.rng.random() < self.immigration:
            return self._fresh_random()
        for _ in range(100):
            a, b = self._tournament(elite), self._tournament(elite)
            child = self.space.crossover(a, b, self.rng) if self.rng.random() < 0.5 else a
            child = self.space.mutate(child, self.rng, n=self.rng.choice((1, 1, 2)))
            if child not in self.seen and self.space.valid(child):
                return child
        return self._fresh_random()

    def _tournament(self, elite: list[Point]) -> Point:
        i, j = self.rng.randrange(len(elite)), self.rng.randrange(len(elite))
        return elite[min(i, j)]  # elite is sorted best-first


def make(space: Space, seed: int, **options) -> Strategy:
    return Evolutionary(space, seed, **options)

"""Uniform random sampling of valid, unseen points."""
from kfactory.strategies.base import Point, Space, Strategy


class RandomSearch(Strategy):
    def _next(self) -> Point | None:
        return self._fresh_random()


def make(space: Space, seed: int, **options) -> Strategy:
    return RandomSearch(space, seed)

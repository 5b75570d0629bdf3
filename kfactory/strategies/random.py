"""Uniform random sampling of valid, unseen points."""
from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.options import Option

#: none: a uniform draw has nothing to tune
OPTIONS: dict[str, Option] = {}


class RandomSearch(Strategy):
    def _next(self) -> Point | None:
        return self._fresh_random()


def make(space: Space, seed: int, **options) -> Strategy:
    """A random search (it has no options: make_strategy refuses any)."""
    return RandomSearch(space, seed)

"""Every valid point in order (optionally shuffled), each once."""
from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.options import Option

OPTIONS: dict[str, Option] = {
    "shuffle": Option("visit the points in a random order (by the seed) instead of the space's order", False, bool),
}


class GridSearch(Strategy):
    def __init__(self, space: Space, seed: int, shuffle: bool = False):
        super().__init__(space, seed)
        self.order = space.all_points()
        if shuffle:
            self.rng.shuffle(self.order)
        self.i = 0

    def _next(self) -> Point | None:
        while self.i < len(self.order):
            p = self.order[self.i]
            self.i += 1
            if p not in self.seen:
                return p
        return None


def make(space: Space, seed: int, shuffle: bool = False, **options) -> Strategy:
    """A grid search over every valid point."""
    return GridSearch(space, seed, shuffle)

"""Coordinate descent from the space's first point: measure it, then every one-parameter change of it, then move
to the best point measured so far and try its changes, restarting from the next best once the best is done.

The first point of a space is its default (an engine's default design, a family's first valid point), so a small
budget measures the default, each single change of it, and then combinations of the changes that won (two
spinning threads together with unfused gate/up), where a grid in the space's order would still be measuring
single changes. Deterministic for a given space and sequence of results; the seed is not used.

A centre's neighbourhood: for each parameter of its family (the family's order) and each other value of it (the
listed order), the valid point with that value that differs from the centre in the fewest parameters (of those
tied, the first in the space's order). A value a constraint ties to another parameter (spinning needs more than
one thread) is reached through the closest valid point that takes it. One point per value keeps a neighbourhood
at the number of values, not of their combinations: an engine's default on a 16-core host has 30 neighbours,
where every tied point (spinning on each of 2..16 threads, each op on one thread beside each count) made 156.

The next centre is the best told point whose neighbourhood was not expanded yet (failures and points in flight
are never centres); when none is left with an unseen neighbour, the rest of the space follows in its order, so
a budget is always spent.

Option `jump` (percent; 0, the default, is off): a told point that is more than `jump`% faster than the current
centre (its score times 1 + jump/100 below the centre's) becomes the centre at once, its unseen neighbours
proposed next. The rest of the old neighbourhood is set aside, not lost: it follows once no told point has an
unseen neighbour left, before the rest of the space. (Kept queued instead, it came before any later centre:
an engine campaign on 2 cores spent 15 of a budget of 40 on the 1-thread default's leftovers after jumping to
2 threads, and never reached the 2-thread integer decode's own neighbours.)
A neighbourhood can outgrow a small budget (an engine's default on 2 cores has 19 neighbours, most of them slow),
and then best-improvement never combines the change that won with the others; jumping on a clear win does.
"""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.encoding import SpaceIndex, index_of
from kfactory.strategies.options import Option

OPTIONS: dict[str, Option] = {
    "jump": Option("percent: move to a told point at once when it is more than this much faster than the current "
                   "centre (0: only once the centre's neighbourhood is done)", 0.0, float, low=0.0),
}


class Descent(Strategy):
    """Best-improvement coordinate descent with restarts from the next best told point (module docstring)."""

    def __init__(self, space: Space, seed: int, jump: float = 0.0):
        super().__init__(space, seed)
        self.jump = jump
        self.idx: SpaceIndex = index_of(space)
        #: the points whose neighbourhoods were expanded, in order (the first is the space's first point)
        self.centres: list[Point] = []
        self._queue: deque[Point] = deque()
        self._set_aside: deque[Point] = deque()   # old neighbourhoods' rests after jumps, the latest first
        self._done: set[int] = set()          # rows expanded, or whose whole neighbourhood was seen before
        self._ranked: list[tuple[float, int]] = []   # heap of (score, row) of told successes; stale ones skipped
        self._near: dict[int, list[Point]] = {}
        self._rest = 0                          # the fallback's position in the space's order

    def tell(self, point: Point, score: float | None) -> None:
        super().tell(point, score)
        row = self.idx.pos.get(point)
        if score is not None and row is not None:
            # ties go to the point earlier in the space's order: the same sequence of results, the same course
            heapq.heappush(self._ranked, (score, row))
            if row not in self._done and self._beats_centre(score):
                self._expand(row, front=True)

    def _beats_centre(self, score: float) -> bool:
        """Whether `score` is more than `jump`% faster than the current centre's told score."""
        if not self.jump or not self.centres:
            return False
        here = self.results.get(self.centres[-1])
        return here is not None and score * (1 + self.jump / 100) < here

    def _next(self) -> Point | None:
        if not self.centres and len(self.idx):
            self._expand(0, first=True)
        while True:
            if (point := self._first_unseen(self._queue)) is not None:
                return point
            row = self._next_centre()
            if row is None:
                point = self._first_unseen(self._set_aside)
                return point if point is not None else self._fallback()
            self._expand(row)

    def _first_unseen(self, points: deque[Point]) -> Point | None:
        """The first of `points` not seen yet, taken off it with the seen ones before it; None when none is."""
        while points:
            point = points.popleft()
            if point not in self.seen:
                return point
        return None

    def _expand(self, row: int, first: bool = False, front: bool = False) -> None:
        """Make point `row` the centre: its unseen neighbours (and, for the start, itself) are proposed next;
        with `front`, before the points already queued."""
        centre = self.idx.points[row]
        self.centres.append(centre)
        self._done.add(row)
        if first:
            self._queue.append(centre)
        if front:   # a jump: the old neighbourhood's rest waits (module docstring); seen points are skipped later
            self._set_aside.extendleft(reversed(self._queue))
            self._queue = deque(self.neighbours(row))
        else:
            self._queue.extend(self.neighbours(row))

    def _next_centre(self) -> int | None:
        """The best told success not yet expanded that has an unseen neighbour; None when there is none. Each
        told point is looked at once: its neighbourhood was all seen (the seen set only grows), or it is
        expanded now."""
        while self._ranked:
            score, row = self._ranked[0]
            point = self.idx.points[row]
            if row in self._done or self.results.get(point) != score:  # expanded, or told again since
                heapq.heappop(self._ranked)
                continue
            if any(p not in self.seen for p in self.neighbours(row)):
                heapq.heappop(self._ranked)
                return row
            self._done.add(row)
            heapq.heappop(self._ranked)
        return None

    def _fallback(self) -> Point | None:
        """The next unseen point in the space's order; None once every point was seen."""
        points = self.idx.points
        while self._rest < len(points):
            point = points[self._rest]
            self._rest += 1
            if point not in self.seen:
                return point
        return None

    def neighbours(self, row: int) -> list[Point]:
        """Point `row`'s neighbourhood (module docstring), seen or not, in proposal order; computed once."""
        near = self._near.get(row)
        if near is None:
            near = self._near[row] = [self.idx.points[i] for i in self._neighbour_rows(row)]
        return near

    def _neighbour_rows(self, row: int) -> list[int]:
        codes = self.idx.codes
        here = codes[row]
        distance = self.idx.hamming(row)
        spec = self.space.families[self.idx.points[row].family].spec
        # the centre family's columns, in its parameter order: the other families' points have code -1 there
        columns = np.flatnonzero(here >= 0)
        out: dict[int, None] = {}   # an ordered set: a point reached by two changes is proposed at the first
        for col, values in zip(columns, spec.params.values()):
            for value in range(len(values)):
                if value == here[col]:
                    continue
                rows = np.flatnonzero(codes[:, col] == value)
                if len(rows):
                    # the first of the closest in the space's order (argmin's first minimum): one point per
                    # value, so a neighbourhood stays small on a many-core host (spinning from 1 thread is
                    # tried on 2; if more threads win, their own neighbourhood tries spinning there)
                    out[int(rows[np.argmin(distance[rows])])] = None
        return list(out)


def make(space: Space, seed: int, jump: float = 0.0) -> Strategy:
    """Coordinate descent from the space's first point; `jump` as in OPTIONS."""
    return Descent(space, seed, jump)

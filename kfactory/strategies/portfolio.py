"""A portfolio: several member strategies share one budget, which moves to whichever member is improving.

Each ask goes to one member, chosen by a bandit: a member's credit is a discounted count of the times its
proposals improved the best score so far (credit decays by `decay` per result, so recent improvements weigh
most), and members are drawn with probability proportional to credit + `floor` (every member keeps a chance).
Every member is told every result, whoever asked for it, so each models the whole history.
A member's proposal that another member has already asked (a pending point) is skipped, the member is told
it was seen, and it is asked again; a member with nothing left drops out of the draw.
"""
from __future__ import annotations

import importlib

from kfactory.strategies.base import Point, Space, Strategy

DEFAULT_MEMBERS = ("surrogate", "tpe", "evolutionary")
#: members whose model transfers other campaigns' evidence (Strategy.warm); a warm start hedges them
TRANSFER_MEMBERS = ("surrogate",)


class Portfolio(Strategy):
    def __init__(self, space: Space, seed: int, members: tuple[str, ...] | list[str] = DEFAULT_MEMBERS,
                 decay: float = 0.97, floor: float = 0.3, member_options: dict | None = None, hedge: bool = True):
        super().__init__(space, seed)
        opts = self.opts = member_options or {}
        self.seed, self.hedge = seed, hedge
        self.names = list(members)
        self.members: list[Strategy] = [
            importlib.import_module(f"kfactory.strategies.{n}").make(space, seed * 1009 + k, **opts.get(n, {}))
            for k, n in enumerate(self.names)]
        for m in self.members:
            m.outer = self
        self.credit = [0.0] * len(self.members)
        self.alive = [True] * len(self.members)
        self.decay, self.floor = decay, floor
        self.owner: dict[Point, int] = {}
        self.best: float | None = None
        self.asks = [0] * len(self.members)

    def _draw(self) -> int | None:
        live = [i for i, a in enumerate(self.alive) if a]
        if not live:
            return None
        w = [self.credit[i] + self.floor for i in live]
        return self.rng.choices(live, weights=w)[0]

    def _next(self) -> Point | None:
        while (i := self._draw()) is not None:
            m = self.members[i]
            for _ in range(20):
                p = m.ask()
                if p is None:
                    break
                if p not in self.seen:
                    self.owner[p] = i
                    self.asks[i] += 1
                    return p
                m.seen.add(p)  # asked by another member and still pending
            else:
                p = self._fresh_random()
                if p is not None:
                    self.owner[p] = i
                return p
            self.alive[i] = False
        return None

    def warm(self, evidence: list) -> None:
        """Every member learns from the evidence; each member that transfers it (the surrogate) also gets a cold
        twin that does not. Sources can mislead (a device's best point may sit where every other device is
        mediocre), and then the twin keeps exploring with a share of the budget while the bandit moves the rest
        to whichever of the two improves."""
        if not evidence:
            return
        for m in self.members:
            m.warm(evidence)
        for k, name in enumerate(list(self.names)):
            if name in TRANSFER_MEMBERS and self.hedge:
                twin = importlib.import_module(f"kfactory.strategies.{name}").make(
                    self.space, self.seed * 1009 + 101 + k, **self.opts.get(name, {}))
                twin.outer = self
                for p, sc in self.results.items():
                    twin.tell(p, sc)
                self.names.append(f"{name}-cold")
                self.members.append(twin)
                self.credit.append(0.0)
                self.alive.append(True)
                self.asks.append(0)

    def tell(self, point: Point, score: float | None) -> None:
        super().tell(point, score)
        self.credit = [c * self.decay for c in self.credit]
        if score is not None and (self.best is None or score < self.best):
            if self.best is not None and point in self.owner:  # the first result is no improvement
                self.credit[self.owner[point]] += 1.0
            self.best = score
        for m in self.members:
            m.tell(point, score)


def make(space: Space, seed: int, **options) -> Strategy:
    return Portfolio(space, seed, **options)

"""When results reach the search in a campaign on one device, with either judge order (kfactory/judge/order.py):
the completion order bench/search_parallel.py's `screen` and `verify` arrivals replay.

Screen first (the default): a point's short timing comes first; one slower than screen_factor x the best measured
so far is screened out and its result reaches the search at once, any other is verified and measured first, so a
good point's result comes back late, after the fast results of points asked after it. Verify first (the order
before issue 23): every point is verified, then screened, then measured if it passed. Each stage holds the one
device for its cost, and the device takes stages in the order they became ready (the lease is first come, first
served). The costs are in units of a screen; the defaults are this host's ratios (issue 23's notes: a screen
about 0.65 device-s a candidate, a verification and measurement together about 1.9).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Costs:
    """Device time of each stage, in the same unit, and the screen's factor."""
    screen: float = 1.0
    verify: float = 1.5
    measure: float = 1.5
    factor: float = 1.5


#: the stages a point goes through in each order, up to the screen's decision and after it
ORDERS = {"screen": (("screen",), ("verify", "measure")), "verify": (("verify", "screen"), ("measure",))}


class DeviceCampaign:
    """One campaign of `budget` asks with `parallel` points out at a time on one device; `order` is "screen" or
    "verify" (ORDERS). `hold` asks nothing new while a point that passed its screen is still out. `early` tells the
    search a passed screen's time at once (the recorded time: a screen and a measurement of one kernel agree here)
    instead of when its measurement ends."""

    def __init__(self, rs, strategy, parallel: int, budget: int, order: str = "screen", costs: Costs = Costs(),
                 hold: bool = False, early: bool = False):
        self.rs, self.s, self.parallel, self.limit = rs, strategy, parallel, budget
        self.before, self.after = ORDERS[order]
        self.costs, self.hold, self.early = costs, hold, early
        self.queue: list[tuple[float, int, int, int]] = []  # (ready, sequence, point, stage index)
        self.seq = 0
        self.clock = 0.0
        self.best = math.inf
        self.points: list[tuple] = []
        self.stages: dict[int, tuple[str, ...]] = {}  # the stages still ahead of each point out
        self.passed: set[int] = set()
        self.told: set[int] = set()

    def run(self) -> list[float | None]:
        """The recorded times of the points asked, in asking order."""
        self._fill()
        while self.queue:
            ready, _, i, _ = heapq.heappop(self.queue)
            stage = self.stages[i][0]
            self.clock = max(self.clock, ready) + getattr(self.costs, stage)
            self._after(i, stage)
        return [t for _, t in self.points]

    def _after(self, i: int, stage: str) -> None:
        t = self.points[i][1]
        rest = self.stages[i][1:]
        if t is None:  # a point that fails (in the recordings: did not compile or launch) is told at once
            return self._finish(i)
        if stage == "screen":
            if t > self.costs.factor * self.best:
                return self._finish(i)
            rest = rest + self.after
            self.passed.add(i)
            if self.early:
                self._tell(i)
        if not rest:
            self.best = min(self.best, t)
            return self._finish(i)
        self.stages[i] = rest
        self._push(i)

    def _finish(self, i: int) -> None:
        del self.stages[i]
        self.passed.discard(i)
        self._tell(i)
        self._fill()

    def _tell(self, i: int) -> None:
        if i not in self.told:
            self.told.add(i)
            self.s.tell(*self.points[i])

    def _fill(self) -> None:
        while len(self.points) < self.limit and len(self.stages) < self.parallel:
            if self.hold and self.passed:
                return
            p = self.s.ask()
            if p is None:
                self.limit = len(self.points)
                return
            rec = self.rs.lookup(p.params)
            self.points.append((p, rec.time_ms if rec is not None else None))
            i = len(self.points) - 1
            self.stages[i] = self.before
            self._push(i)

    def _push(self, i: int) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (self.clock, self.seq, i, 0))

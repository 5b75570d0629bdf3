"""A portfolio: several member strategies share one budget, which moves to whichever member is improving.

Each ask goes to one member, chosen by a bandit: a member's credit is a discounted count of the times its
proposals improved the best score so far (credit decays by `decay` per result, so recent improvements weigh
most), and members are drawn with probability proportional to credit + `floor` (every member keeps a chance).
Every member is told every result, whoever asked for it, so each models the whole history.
A member's proposal that another member has already asked (a pending point) is skipped, the member is told
it was seen, and it is asked again; a member with nothing left drops out of the draw.

Warm-started (evidence from other campaigns), the members stay as they are, cold, and each member that can
transfer evidence (the surrogate) gets an evidence-led copy that learns from it. How the asks are split between
the evidence-led members and the cold ones follows the evidence's say (agreement.Trust.evidence, the sources'
total weight, measured on this campaign's results after each one): each ask goes to an evidence-led member with
that probability, else to the bandit over the cold members.

The cold members search exactly as a cold start's would. They are not told the evidence-led results (the warm
start's priors and the evidence-led members' points): where the other devices' best points are merely good here,
such a result becomes the cold members' incumbent and holds their search where the evidence points (on
convolution A100, eight priors told to a cold portfolio kept 3 of 5 seeds from coming within 5% of the optimum
in 400 evaluations; cold, all 5 did). When a cold member asks for a point the evidence-led side has measured, it
is answered from that result at no evaluation, with the bandit's bookkeeping of a cold result, and the draw goes
on. So the cold members ask the points a cold start asks, in its order, and evidence that misleads costs the
evaluations it was given, never the cold search's course; evidence that agrees finds the optimum first.

The say measures how well the sources order this device's points, not whether following them still pays: on
convolution A100 the A4000's evidence orders the measured points better than the own model does (Kendall 0.65
against 0.49 after 50 results) and leads to a point 13% off the optimum within 30 evaluations, but the only point
within 5% lies where that evidence ranks 802nd; the evidence-led member then spent some 50 more evaluations
(bench seed 1) around its best without improving it. So the evidence-led share is also halved for every
STALE_HALF evidence-led results in a row that did not improve the best of all results, and restored by one that
does: evidence that keeps finding better points keeps its share, evidence that has stopped paying hands the
evaluations back to the cold search.
(Telling the cold members the evidence-led results that cannot become their incumbent, those slower than their
best, was tried and is worse: on convolution A100 seeds 0, 1 and 3 it needed 215, 544 and 297 evaluations to
within 5% of the optimum, against 197, 196 and 144 without it and 189, 172 and 135 cold.)
"""
from __future__ import annotations

import importlib
import random

from kfactory.strategies.base import Point, Space, Strategy
from kfactory.strategies.options import Option

DEFAULT_MEMBERS = ("surrogate", "tpe", "evolutionary")
#: the strategies a portfolio may hold (not a portfolio: members are single searches)
MEMBER_STRATEGIES = ("random", "grid", "evolutionary", "surrogate", "tpe", "cma")
OPTIONS: dict[str, Option] = {
    "members": Option("the member strategies, comma-separated (MEMBER.OPTION=VALUE sets a member's option)",
                      DEFAULT_MEMBERS, tuple, choices=MEMBER_STRATEGIES),
    "decay": Option("credit a member keeps per result (the bandit's discount)", 0.97, float, low=0, high=1),
    "floor": Option("weight every member keeps in the draw beside its credit", 0.3, float, low=0),
    "member_options": Option("options per member, {member: {option: value}} (MEMBER.OPTION=VALUE sets one)", None,
                             dict),
}
#: what Portfolio._ask returns for a cold member's ask answered from an evidence-led result
_ANSWERED = Point("", "")
#: members whose model transfers other campaigns' evidence (Strategy.warm): a warm start adds an evidence-led copy
TRANSFER_MEMBERS = ("surrogate",)
#: evidence-led results in a row without a new best that halve the evidence-led share (module docstring)
STALE_HALF = 8.0


class Portfolio(Strategy):
    def __init__(self, space: Space, seed: int, members: tuple[str, ...] | list[str] = DEFAULT_MEMBERS,
                 decay: float = 0.97, floor: float = 0.3, member_options: dict | None = None):
        super().__init__(space, seed)
        opts = self.opts = member_options or {}
        self.seed = seed
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
        self.asks = [0] * len(self.members)
        #: the evidence-led members (indices), empty on a cold start
        self.led: list[int] = []
        #: draws the evidence-led versus cold split, apart from the bandit's stream, so that a warm start whose
        #: evidence has no say asks its cold members in a cold start's order
        self.split_rng = random.Random(seed ^ 0x7A57)
        #: evidence-led results the cold members have not learned (see tell), and the best of the cold members'
        self.withheld: dict[Point, float | None] = {}
        self.cold_best: float | None = None
        #: the best of all results, and the evidence-led results since one of them last improved it
        self.best: float | None = None
        self.led_stale = 0

    def _draw(self) -> int | None:
        """A cold member, by the bandit (every member on a cold start)."""
        cold = [i for i, a in enumerate(self.alive) if a and i not in self.led]
        if not cold:
            return None
        w = [self.credit[i] + self.floor for i in cold]
        return self.rng.choices(cold, weights=w)[0]

    def _say(self) -> float:
        """The evidence-led share of the asks: the evidence's say, halved for every STALE_HALF evidence-led
        results since the evidence-led side last found a new best (module docstring)."""
        trust = self.trust()
        say = 1.0 if trust is None else trust.evidence
        return say * 0.5 ** (self.led_stale / STALE_HALF)

    def trust(self):
        """The evidence-led members' measure of the sources (agreement.Trust), None on a cold start."""
        for i in self.led:
            if (t := self.members[i].trust()) is not None:
                return t
        return None

    def _next(self) -> Point | None:
        led = [i for i in self.led if self.alive[i]]
        cold_left = any(a and i not in self.led for i, a in enumerate(self.alive))
        # one draw per evaluation between the evidence-led members and the cold ones, by the evidence's say
        if led and (not cold_left or self.split_rng.random() < self._say()):
            for i in ([led[0]] if len(led) == 1 else self.split_rng.sample(led, len(led))):
                if (p := self._ask(i)) is not None:
                    return p
        while (drawn := self._draw()) is not None:
            p = self._ask(drawn)
            if p is not None and p is not _ANSWERED:
                return p
        for i in led:  # the cold members have nothing left
            if (p := self._ask(i)) is not None:
                return p
        return None

    def _ask(self, i: int) -> Point | None:
        """Member i's next point; None when it has nothing left (it drops out of the draw); _ANSWERED when a cold
        member asked for an evidence-led result it had not learned: it learns it now, as a cold start would have
        learned it when asking (the bandit's bookkeeping and every cold member told), and costs no evaluation."""
        m = self.members[i]
        for _ in range(20):
            p = m.ask()
            if p is None:
                self.alive[i] = False
                return None
            if i not in self.led and p in self.withheld:
                self.owner[p] = i
                self._tell_cold(p, self.withheld.pop(p), answered=True)
                return _ANSWERED
            if p not in self.seen:
                self.owner[p] = i
                self.asks[i] += 1
                return p
            m.seen.add(p)  # asked by another member and still pending
        p = self._fresh_random()
        if p is not None:
            self.owner[p] = i
        return p

    def warm(self, evidence: list) -> None:
        """Add an evidence-led copy of each member that transfers evidence (TRANSFER_MEMBERS), told every result
        so far; the cold members stay cold (see the module docstring). Evidence that no member can use (no
        source with enough points in this space) changes nothing."""
        if not evidence or self.led:
            return
        for k, name in enumerate(list(self.names)):
            if name not in TRANSFER_MEMBERS:
                continue
            lead = importlib.import_module(f"kfactory.strategies.{name}").make(
                self.space, self.seed * 1009 + 101 + k, **self.opts.get(name, {}))
            lead.outer = self
            for p, sc in self.results.items():
                lead.tell(p, sc)
            lead.warm(evidence)
            if lead.trust() is None:
                continue  # nothing it could learn from
            self.led.append(len(self.members))
            self.names.append(f"{name}-warm")
            self.members.append(lead)
            self.credit.append(0.0)
            self.alive.append(True)
            self.asks.append(0)

    def tell(self, point: Point, score: float | None) -> None:
        super().tell(point, score)
        improved = score is not None and (self.best is None or score < self.best)
        if improved:
            self.best = score
        # a warm start's own points (told without a member asking: the planner's priors) and its evidence-led
        # members' are evidence-led results: the evidence-led members learn them now, the cold members only if
        # they ask for one themselves (see _ask), so that the evidence never draws them to where it points
        if self.led and self.owner.get(point, self.led[0]) in self.led:
            for i, m in enumerate(self.members):
                # a cold member that asked for it while it was in flight (and was told it was seen) learns it too
                if i in self.led or point in m.seen:
                    m.tell(point, score)
            self.withheld[point] = score
            self.led_stale = 0 if improved else self.led_stale + 1
            return
        self._tell_cold(point, score)

    def _tell_cold(self, point: Point, score: float | None, answered: bool = False) -> None:
        """A cold member's result: every member learns it, and the bandit's credit (for improving the best of the
        cold members' results) and its decay follow the cold members' results only, so that they ask as a cold
        start's members would. `answered`: an evidence-led result, which the members that know it already (the
        evidence-led ones) are not told twice."""
        self.credit = [c * self.decay for c in self.credit]
        if score is not None and (self.cold_best is None or score < self.cold_best):
            if self.cold_best is not None and point in self.owner:  # the first result is no improvement
                self.credit[self.owner[point]] += 1.0
            self.cold_best = score
        for m in self.members:
            if not (answered and point in m.results):
                m.tell(point, score)


def make(space: Space, seed: int, **options) -> Strategy:
    """A portfolio of member strategies sharing one budget; options as in OPTIONS."""
    return Portfolio(space, seed, **options)

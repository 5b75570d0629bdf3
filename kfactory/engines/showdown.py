"""An engine campaign's last word: its closest designs timed against each other, alternately, in one stretch.

A design's campaign figures are the medians of its timing rounds, and its rounds ran minutes apart from another
design's: on a shared host the load drifts within minutes, so two designs a few percent apart can swap places
(two campaigns measured the table kernel x0.930 and x1.033 of the conversion kernel, where timing the two
alternately gives x0.835 at 1 thread). The showdown times the few designs that can still win in `rounds` more
rounds, each round every contender once, each contender first in turn (round k starts with contender k), and
decides by the median over rounds of each contender's decode tok/s over the reference's of the same round
(the reference: the fastest by the campaign's figures, or the next still in should it fault). A ratio taken
within one round cancels the load that both timings shared; its median over rounds is what bench/engine_ab.py
reports for two builds.

Contenders: the verified designs whose decode tok/s lies within `margin` of the fastest's (the larger of
MARGIN and the campaign's own noise figure: a design further behind cannot be the fastest), at most
CONTENDERS of them by the campaign's figures; fewer than two, no showdown. The winner is the rule of every
engine campaign (design.prefer_calm: the fastest, unless it spins and a calm one is within SPIN_MARGIN) applied
to the showdown's ratios. Each showdown timing also joins its design's rounds (its figures stay the medians of
all its timings); a contender that faults is bench_failed, as in any later round.

The local campaign runs it in its process (kfactory/engines/campaign.py); through the services each timing is a
re-timing request to the benchmarker (kfactory/engines/finale.py) and this module folds the Measured events
back (kfactory/engines/pipeline.py).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# the defaults live in a module of their own that the CLI's parser reads without importing this one
from kfactory.engines.defaults import CONTENDERS, MARGIN, ROUNDS, TIMING_ROUNDS  # noqa: F401 (re-exported)
from kfactory.engines.design import prefer_calm

if TYPE_CHECKING:
    from kfactory.engines.campaign import DesignResult


@dataclass(frozen=True)
class Rule:
    """How a campaign ends: `rounds` showdown rounds (0: none) among at most `size` contenders, the designs
    whose decode tok/s is within `margin` of the fastest's (or within the campaign's noise figure, if larger)."""
    rounds: int = 0
    size: int = CONTENDERS
    margin: float = MARGIN

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise ValueError(f"showdown rounds must be 0 (none) or more, not {self.rounds}")
        if self.size < 2:
            raise ValueError(f"a showdown needs at least 2 contenders, not {self.size}")
        if not self.margin >= 1.0 or self.margin == float("inf"):   # NaN compares false: refused here too
            raise ValueError(f"the showdown margin is a ratio of at least 1 (1.15: within 15%), not {self.margin}")

    def margin_of(self, noise: dict[str, Any] | None) -> float:
        """The contenders' margin: `margin`, or the campaign's noise figure (its decode ratio either way) if that
        moved further."""
        r = noise["decode_ratio"] if noise else 0.0
        return max(self.margin, r, 1.0 / r) if r > 0 else self.margin

    def contenders(self, results: list[DesignResult], noise: dict[str, Any] | None = None) -> list[DesignResult]:
        """The verified designs that can still be the fastest (see the module docstring), the fastest first; []
        when fewer than two, or no rounds are asked for."""
        verified = sorted((r for r in results if r.verified), key=lambda r: r.rate, reverse=True)
        if len(verified) < 2 or self.rounds < 1:
            return []
        top, m = verified[0].rate[0], self.margin_of(noise)
        near = [r for r in verified if r.rate[0] * m >= top][:self.size]
        return near if len(near) >= 2 else []

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "size": self.size, "margin": self.margin}


def schedule(ids: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, design id) in timing order: each round every contender once, round k starting with contender k."""
    n = len(ids)
    return [(k, ids[(k + j) % n]) for k in range(rounds) for j in range(n)]


@dataclass
class Showdown:
    """The showdown of `ids` (design ids, the fastest by the campaign's figures first) over `rounds` rounds;
    `timings[id][k]` is [decode tok/s, prefill tok/s] of round k, None while untimed or after a fault."""
    ids: list[str]
    rounds: int
    timings: dict[str, list[list[float] | None]] = field(default_factory=dict)
    #: design ids that faulted during the showdown (bench_failed: out of it)
    faulted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i in self.ids:
            self.timings.setdefault(i, [None] * self.rounds)

    def add(self, design_id: str, k: int, decode_tok_s: float, prefill_tok_s: float) -> None:
        """Contender `design_id`'s timing in round `k`."""
        self.timings[design_id][k] = [decode_tok_s, prefill_tok_s]

    def fault(self, design_id: str) -> None:
        """Contender `design_id` faulted: it leaves the showdown."""
        if design_id not in self.faulted:
            self.faulted.append(design_id)

    @property
    def standing(self) -> list[str]:
        """The contenders still in, in the order of `ids`."""
        return [i for i in self.ids if i not in self.faulted]

    def ratios(self) -> dict[str, dict[str, Any]]:
        """Per contender still in: the median over rounds of its decode and prefill tok/s over the reference's
        (the first contender still in) in the same round, and the rounds both were timed in; {} when none is."""
        standing = self.standing
        if not standing:
            return {}
        ref = self.timings[standing[0]]
        out: dict[str, dict[str, Any]] = {}
        for i in standing:
            pairs = [(a, b) for a, b in zip(ref, self.timings[i]) if a is not None and b is not None]
            if not pairs:
                continue
            out[i] = {"decode_ratio": statistics.median(b[0] / a[0] for a, b in pairs),
                      "prefill_ratio": statistics.median(b[1] / a[1] for a, b in pairs), "rounds": len(pairs)}
        return out

    def ranked(self, spins: dict[str, bool]) -> tuple[str | None, str | None]:
        """(the winner by prefer_calm over the ratios, the fastest by them); (None, None) when no contender has
        a ratio. `spins`: design id -> whether it spins."""
        ratios = self.ratios()
        if not ratios:
            return None, None
        rate = lambda i: (ratios[i]["decode_ratio"], ratios[i]["prefill_ratio"])  # noqa: E731
        ids = list(ratios)
        return prefer_calm(ids, rate, lambda i: spins.get(i, False)), max(ids, key=rate)

    def as_dict(self, spins: dict[str, bool]) -> dict[str, Any]:
        """The record's "showdown": contenders, rounds, each one's timings and ratios, the faulted, the winner
        and the fastest."""
        winner, fastest = self.ranked(spins)
        return {"contenders": list(self.ids), "rounds": self.rounds, "reference": next(iter(self.standing), None),
                "timings": {i: t for i, t in self.timings.items()}, "ratios": self.ratios(),
                "faulted": list(self.faulted), "winner": winner, "fastest": fastest}


def spins_of(results: list[DesignResult]) -> dict[str, bool]:
    """design id -> whether the design spins (its threads hold their cores between regions)."""
    return {r.design_id: r.spins for r in results}


def report_lines(showdown: dict[str, Any]) -> list[str]:
    """The showdown in the campaign's report: each contender's median ratio to the reference, and the winner."""
    lines = [f"showdown: {len(showdown['contenders'])} closest designs timed alternately in {showdown['rounds']} "
             f"rounds (median per-round decode ratio to {showdown['reference']}):"]
    for i in showdown["contenders"]:
        r = showdown["ratios"].get(i)
        what = ("faulted: out" if i in showdown["faulted"] else "no timing" if r is None else
                f"decode x{r['decode_ratio']:.3f}, prefill x{r['prefill_ratio']:.3f} ({r['rounds']} rounds)")
        lines.append(f"  {i:<40} {what}" + ("  <- winner" if i == showdown["winner"] else ""))
    return lines

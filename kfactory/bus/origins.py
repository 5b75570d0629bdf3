"""Where a design point, and the candidate made from it, came from: its origin.

On the wire (PointProposed.origin, Candidate.origin) an origin is a string `kind:detail`, or the bare kind for
the reference kernel. Those strings are archived and shown to users, so their format never changes; code builds
and reads them only through this module:

    template:<family>   a point the campaign's search strategy proposed
    warm:<family>       a point of an earlier campaign, proposed first (a warm start)
    agent:<persona>     a kernel an LLM agent persona wrote
    manual:<name>       a kernel the user submitted with the campaign
    reference           the problem's own reference kernel

This module imports nothing of kfactory, so every part (planner, coder, memory, judge, CLI) can use it.
"""
from __future__ import annotations

from enum import StrEnum


class Origin(StrEnum):
    """The kind of an origin; its value is the origin string's kind part, exactly as it is on the wire."""
    TEMPLATE = "template"
    WARM = "warm"
    AGENT = "agent"
    MANUAL = "manual"
    REFERENCE = "reference"

    def of(self, detail: str = "") -> str:
        """The origin string of this kind with `detail` (a family, persona or name): `kind:detail`, or the bare
        kind for REFERENCE, which has no detail."""
        if self is Origin.REFERENCE:
            if detail:
                raise ValueError(f"the reference origin has no detail (got {detail!r})")
            return self.value
        return f"{self.value}:{detail}"

    @property
    def prefix(self) -> str:
        """What every origin string of this kind starts with (`kind:`; the whole string for REFERENCE)."""
        return self.value if self is Origin.REFERENCE else f"{self.value}:"


#: origins of the points the search strategy is told about (its own and the warm start's)
STRATEGY: tuple[Origin, ...] = (Origin.TEMPLATE, Origin.WARM)
#: origins of the work a search produced, counted against a campaign's candidate budget: the strategy's points
#: and agent tasks
SEARCHED: tuple[Origin, ...] = STRATEGY + (Origin.AGENT,)


def parse(origin: str) -> tuple[Origin | None, str]:
    """(kind, detail) of an origin string; (None, "") for a string that is no origin (an empty one, an unknown
    kind, a kind without its `:`)."""
    if origin == Origin.REFERENCE.value:
        return Origin.REFERENCE, ""
    kind, sep, detail = origin.partition(":")
    if not sep or kind == Origin.REFERENCE.value or kind not in Origin.__members__.values():
        return None, ""
    return Origin(kind), detail


def kind_of(origin: str) -> Origin | None:
    """The kind of an origin string (None when it is no origin)."""
    return parse(origin)[0]


def detail_of(origin: str) -> str:
    """The detail of an origin string (family, persona or name; "" for the reference or no origin)."""
    return parse(origin)[1]


def is_kind(origin: str, *kinds: Origin) -> bool:
    """Whether the origin string is of one of `kinds`."""
    return kind_of(origin) in kinds


def sql_match(column: str, kinds: tuple[Origin, ...]) -> str:
    """An SQL condition that is true where `column` holds an origin of one of `kinds` (parenthesised)."""
    return "(" + " OR ".join(f"{column} LIKE '{k.prefix}%'" if k is not Origin.REFERENCE
                             else f"{column}='{k.value}'" for k in kinds) + ")"

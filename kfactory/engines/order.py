"""The order of an engine campaign's designs: the default first, then by how many fields differ from it; and
the strategy that searches them.

Shared by the local campaign (kfactory/engines/campaign.py) and the engine problem the services search
(kfactory/engines/problem.py): the order is the space's (the search's first point, and the rest of the space
once the search runs out of neighbourhoods), and both take designs as the STRATEGY asks for them, so both
evaluate the same designs for the same budget wherever their timings rank the designs alike.
"""
from __future__ import annotations

import itertools
from dataclasses import fields

from kfactory.engines.design import Q4_DECODES, EngineDesign

#: the strategy an engine campaign searches with (kfactory/strategies/descent.py): the default's one-field
#: changes, then those of the fastest design so far, so a budget beyond the first neighbourhood combines the
#: changes that won (a fixed order would spend it on two-field changes of the default, most of them slow)
STRATEGY = "descent"
#: its `jump` option (percent): a design that decodes more than 40% faster than the current centre becomes the
#: centre at once. With AVX512-VNNI the 1-thread default on 2 cores has 19 neighbours, 7 of them op_threads
#: choices on sleeping threads (66-104 tok/s against the default's 105-131 on a Zen 4), so a budget of 16 ended
#: inside that neighbourhood and never tried 2 threads with the integer decode (x1.25 at 1 thread); 2 threads
#: waiting bounded or spinning decoded x1.44-2.26 the default there, past the host's noise (the default timed
#: twice minutes apart: x0.96-1.31)
JUMP = 40.0
#: the options an engine campaign's spec gives STRATEGY (`kfactory engine run`, `kfactory submit engine:MODEL`)
STRATEGY_OPTIONS = {"jump": repr(JUMP)}


def distance(a: EngineDesign, b: EngineDesign) -> int:
    """How many fields differ."""
    return sum(getattr(a, f.name) != getattr(b, f.name) for f in fields(EngineDesign))


#: fields that apply only with more than one thread (how idle threads wait, how they share a step): with
#: `threads` changed from the default's one thread, their values are variants of that change, not changes of
#: their own
THREAD_FIELDS = ("spin", "wait", "team")


def order(points: list[EngineDesign], default: EngineDesign | None = None) -> list[EngineDesign]:
    """`points` by distance from the default design (stable: space order within a distance), so the first
    points are the default and its one-field changes, field by field in EngineDesign's field order. A change of
    `threads` counts once with whatever THREAD_FIELDS it brings: more threads sleeping, spinning or spinning a
    while, in a region an op or one a step, are all one step from the default's one thread (each is measured in
    a small budget)."""
    default = default or EngineDesign()
    names = [f.name for f in fields(EngineDesign)]

    def key(item: tuple[int, EngineDesign]) -> tuple[int, int, int]:
        i, d = item
        changed = [k for k, n in enumerate(names) if getattr(d, n) != getattr(default, n)]
        if d.threads != default.threads:
            changed = [k for k in changed if names[k] not in THREAD_FIELDS]
        return (len(changed), changed[0] if changed else -1, i)

    return [d for _, d in sorted(enumerate(points), key=key)]


def with_kernels(points: list[EngineDesign], kernel_ids: dict[str, str]) -> list[EngineDesign]:
    """`points` and, for every point that can link a searched kernel (weights "q4_1"), the same design with each
    non-empty set of the searched kernels `kernel_ids` ({op problem: candidate id}) in place of the engine's
    own, all in campaign order (`order()`, the default first). So each kernel alone on the default is one field
    away from it, a kernel can join whichever design wins (the search's later neighbourhoods try it there), and
    a kernel that loses is never forced onto another kernel's measurement. Shared by the local campaign and the
    problem the services search, so both hold the same designs."""
    if not kernel_ids or not points:
        return list(points)
    ops = sorted(kernel_ids)
    subsets = [c for n in range(1, len(ops) + 1) for c in itertools.combinations(ops, n)]
    out = []
    for d in points:
        out.append(d)
        if d.weights == "q4_1":
            # a searched Q4_1 kernel replaces the one q4_decode picks: it joins the design at its default only
            out += [EngineDesign.from_dict({**d.as_dict(), **{op: kernel_ids[op] for op in subset}})
                    for subset in subsets if d.q4_decode == Q4_DECODES[0] or "matvec_q4_1" not in subset]
    return order(out, points[0])

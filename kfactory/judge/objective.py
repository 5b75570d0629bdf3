"""A campaign's objective over its problem's optimisation shapes: the score every decision ranks by.

A problem that names no weights is scored on its first optimisation shape alone (its median there), as before.
One whose problem.yaml gives `shapes.weights` (one per optimisation shape: for a workload, how often each shape
runs in it) is scored on the weighted sum of the medians over the shapes of positive weight, so that a kernel fast
at one of them and slow at another ranks by what the workload spends. Every consumer of a score reads it here:

- the full measurement sets Measured.score_s, and records the weights in Measured.objective (empty for the first
  shape alone), so that the score can be checked without the problem (kfactory.evidence.trust);
- a screen times one scored shape (screen_shape) and bounds the whole score from below with the other shapes'
  speed-of-light floors (score_bound): the bound, not that shape's time, is held against the campaign's best;
- a showdown times every scored shape and ranks by their weighted sum (combine), labelled with the objective's
  name (label), from which the planner reads back which shapes were scored (scored_names);
- the summary and `kfactory check` report the speedup of the weighted sums (speedup).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal

from kfactory.v1 import events_pb2 as pb


def weights(problem) -> list[float]:
    """One weight per optimisation shape, in their order (the first shape alone where the problem names none)."""
    n = len(problem.shapes("optimize"))
    given = problem.spec.shapes.weights
    return [float(w) for w in given] if given is not None else first_alone(n)


def first_alone(n: int) -> list[float]:
    """The weights of the first of n shapes alone: the objective of a problem that names none."""
    return [1.0] + [0.0] * (n - 1)


def scored(problem) -> list[tuple[dict[str, int], float]]:
    """(shape, weight) of every optimisation shape of positive weight, in their order."""
    return [(s, w) for s, w in zip(problem.shapes("optimize"), weights(problem)) if w > 0]


def by_name(problem) -> dict[str, float]:
    """Measured.objective: weight by shape name of the scored shapes; empty when the score is the first shape's
    median alone (as every score was before weights existed, so that those read the same), whether by naming no
    weights or by weighing it 1 and the others 0."""
    if weights(problem) == first_alone(len(problem.shapes("optimize"))):
        return {}
    return {problem.shape_str(s): w for s, w in scored(problem)}


def spelled_out(problem) -> dict[str, float]:
    """The weights by shape name the score sums, spelled out: by_name, or the first shape's name alone, weight 1."""
    return by_name(problem) or {label(problem): 1.0}


def recorded_as(weights: Mapping[str, float], timings: Iterable[pb.ShapeTiming]) -> dict[str, float]:
    """Measured.objective for a score of `weights` (spelled out) over `timings`: empty where it is the first
    timing's shape alone, weight 1 (as every score read before weights), else the weights."""
    first = next(iter(timings), None)
    alone = first is not None and dict(weights) == {first.shape: 1.0}
    return {} if alone else dict(weights)


def label(problem) -> str:
    """The objective's name: the first shape's name where it is that shape alone (unweighted), else
    named_label(by_name(problem)) (Comparison.shape of a showdown)."""
    named = by_name(problem)
    return named_label(named) if named else problem.shape_str(problem.shapes("optimize")[0])


def named_label(objective: Mapping[str, float]) -> str:
    """"W*SHAPE+W*SHAPE..." over the shapes of a Measured.objective (non-empty), in the order of their names (a
    protobuf map keeps none: the same objective reads the same wherever it was stored)."""
    return "+".join(f"{_number(objective[name])}*{name}" for name in sorted(objective))


def _number(w: float) -> str:
    """A weight as its shortest decimal without an exponent (an exponent's "+" would split a label)."""
    return format(Decimal(repr(w)).normalize(), "f")


def is_label(text: str) -> bool:
    """Whether a ShapeTiming's shape is a weighted objective's label (a showdown's), not one shape's name."""
    return "*" in text


def scored_names(text: str) -> set[str]:
    """The shape names a label (label) scores."""
    return {part.rsplit("*", 1)[-1] for part in text.split("+")}


def score(timings: Iterable[pb.ShapeTiming], objective: Mapping[str, float]) -> float:
    """The score of a measurement's timings under `objective` (Measured.objective): the first timing's median
    where it is empty, else the sum of weight x median over its shapes. KeyError names a scored shape that was
    not timed."""
    timings = list(timings)
    if not objective:
        return timings[0].median_s
    at = {t.shape: t.median_s for t in timings}
    return sum(w * at[name] for name, w in objective.items())


def scored_by(m: pb.Measured) -> dict[str, float]:
    """The weights a full measurement was scored with, spelled out: its objective, else its first timing's shape
    alone ({} where it has no timing)."""
    if m.objective:
        return dict(m.objective)
    return {m.timings[0].shape: 1.0} if m.timings else {}


def rescore(m: pb.Measured, problem) -> bool:
    """Score a full measurement (one from the result cache) under `problem`'s objective as it is now, its
    objective recorded with it; False, leaving it as it was, where a shape that objective scores was not timed
    (without weights: where its first timing is not the problem's first shape; the cache is by candidate, and
    one source may have run under another package of the problem's name, with other shapes)."""
    if not by_name(problem) and (not m.timings or m.timings[0].shape != label(problem)):
        return False
    weights = spelled_out(problem)
    try:
        restate(m, score(m.timings, weights), weights)
    except KeyError:
        return False
    return True


def restate(m: pb.Measured, score_s: float, weights: Mapping[str, float]) -> None:
    """Set m's score to `score_s`, the score of `weights` (spelled out) over its timings, and the objective it
    records to match (recorded_as), so that trust reads the two as one: where a measurement is scored again."""
    m.score_s = score_s
    m.objective.clear()
    m.objective.update(recorded_as(weights, m.timings))


def screen_shape(problem, device: pb.DeviceInfo | None) -> dict[str, int]:
    """The shape a screen times: of the scored shapes, the one that bounds the score the most (the largest weight x
    speed-of-light floor on `device`; the first of the largest weights where no floor is known)."""
    from kfactory.judge.measure import sol_floor_s   # (the judge's runner and numpy: not for score's readers)

    shapes = scored(problem)
    floors = [w * sol_floor_s(problem, s, device) for s, w in shapes]
    if any(floors):
        return shapes[floors.index(max(floors))][0]
    top = max(w for _, w in shapes)
    return next(s for s, w in shapes if w == top)


def score_bound(problem, shape: dict[str, int], median_s: float, device: pb.DeviceInfo | None) -> float:
    """A lower bound on the score of a kernel whose median at scored `shape` is `median_s`: its weighted time
    there plus every other scored shape's weighted speed-of-light floor (no kernel that passes a measurement is
    faster than its floor). The median itself where the score is that shape alone."""
    from kfactory.judge.measure import sol_floor_s

    total = 0.0
    for s, w in scored(problem):
        total += w * (median_s if s == shape else sol_floor_s(problem, s, device))
    return total


def screen_bar(problem, shape: dict[str, int], device: pb.DeviceInfo | None, limit_s: float) -> float:
    """The median at scored `shape` over which a kernel's score_bound passes `limit_s` (a screen's: screen_factor
    x the campaign's best); 0 where the other shapes' floors alone pass it."""
    weight = next(w for s, w in scored(problem) if s == shape)
    return max(0.0, limit_s - score_bound(problem, shape, 0.0, device)) / weight


def combine(problem, per_shape: Mapping[str, pb.ShapeTiming]) -> pb.ShapeTiming:
    """One kernel's timings at every scored shape (by shape name) as one ShapeTiming of the objective (label):
    medians, quartiles and interval ends summed with their weights (the sum of the intervals' ends holds the sum of
    the medians wherever each holds its own), samples summed, bandwidth from the weighted bytes, the bandwidth
    fraction the time-weighted mean of the shapes', outputs checked only if at every shape."""
    named = by_name(problem)
    if not named:   # the first shape alone: its own timing, as before weights
        return per_shape[label(problem)]
    parts = [(per_shape[name], w) for name, w in named.items()]
    out = pb.ShapeTiming(shape=label(problem), mode=parts[0][0].mode,
                         output_checked=all(t.output_checked for t, _ in parts),
                         samples=sum(t.samples for t, _ in parts))
    for field in ("median_s", "q1_s", "q3_s", "ci_low_s", "ci_high_s"):
        setattr(out, field, sum(w * getattr(t, field) for t, w in parts))
    med = out.median_s
    if med > 0:
        out.noise = (out.q3_s - out.q1_s) / med
        out.gbps = sum(w * t.gbps * t.median_s for t, w in parts) / med
        out.sol_fraction = sum(w * t.sol_fraction * t.median_s for t, w in parts) / med
    return out


def speedup(problem, medians: Mapping[str, Mapping[str, float]], kernel: str, against: str = "candidate"
            ) -> float | None:
    """The objective's speedup of `against` over `kernel` (how many times faster): the weighted sum of `kernel`'s
    medians over `against`'s, from medians[shape name][kernel name] (a final comparison's); None where a scored
    shape lacks either."""
    named = spelled_out(problem)
    try:
        mine = sum(w * medians[name][kernel] for name, w in named.items())
        theirs = sum(w * medians[name][against] for name, w in named.items())
    except KeyError:
        return None
    return mine / theirs if theirs > 0 else None

"""What an event must be before the planner or memory believes it (issue 22's forged events).

Anyone who can publish on the events stream can publish anything there (the open profile has no users). So a
result is believed only as the end of a chain the services' own events built: a candidate created by the coder,
compiled by the compiler, verified by the verifier, then measured by the benchmarker (or, for a screened-out timing
that is never a result, compiled and timed by the benchmarker), each by the role that
`security.PERMISSIONS` lets publish that kind; and only with figures a measurement can have (finite, positive,
at least a nanosecond, the score being the first shape's median or its objective's weighted sum). The planner
checks the chain as it folds the stream (stream order is causal: each stage publishes its event before it queues
the next stage's work); memory, whose order can differ after a restart, holds a measurement back until its chain
is archived.

What no check here can stop in the open profile (RELIABILITY.md says so): an event forged with a real
producer name and a whole forged chain of its own, or one published under the id of an event a service has yet
to publish (JetStream then drops the real one as a duplicate). The secure profile stops both: each role may
publish only its own kinds' subjects, and `events.decode_event` refuses a body of another kind than its subject.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from kfactory.bus import events as ev
from kfactory.judge import objective
from kfactory.platform.security import PERMISSIONS
from kfactory.v1 import events_pb2 as pb

#: the evidence chain of a measured candidate, in the order its events are published
CHAIN = ("candidate_created", "compiled", "verified")
#: the chain of a screened-out timing: the search's candidates are screened before they are verified
#: (kfactory/judge/order.py), and a screened-out one is never verified, so it is never a result (best, compared,
#: exported): its timing only tells the search how slow that point was
SCREENED_CHAIN = ("candidate_created", "compiled")
#: no kernel call completes in under a nanosecond: a few clock cycles, less than any call or launch costs
MIN_SECONDS = 1e-9
#: the states a campaign can finish in (kfactory/services/planner)
FINISH_STATES = ("completed", "failed", "cancelled", "expired")


def producers(kind: str) -> frozenset[str] | None:
    """The roles that publish events of `kind`, from the one permissions table; None for kinds no service role
    owns (dead letters: every consumer; resend requests: the CLI)."""
    roles = frozenset(name for name, role in PERMISSIONS.items() if kind in role.publishes)
    return roles or None


def producer_flaw(event: pb.Event) -> str:
    """Why the event's producer may not have published it ("" when it may)."""
    kind = ev.kind_of(event)
    allowed = producers(kind)
    if allowed is None or event.producer in allowed:
        return ""
    return f"{kind} is published by {', '.join(sorted(allowed))}, not by {event.producer[:40]!r}"


def missing_links(kinds: Iterable[str], screened_out: bool = False) -> list[str]:
    """The links of CHAIN (SCREENED_CHAIN for a screened-out timing) absent from `kinds` (the kinds of the
    candidate's events seen so far)."""
    have = set(kinds)
    return [k for k in (SCREENED_CHAIN if screened_out else CHAIN) if k not in have]


def _seconds_flaw(what: str, s: float) -> str:
    if not math.isfinite(s) or s < MIN_SECONDS:
        return f"{what} {s!r} s is not a time a kernel can take (finite, at least {MIN_SECONDS:g} s)"
    return ""


def timing_flaw(t: pb.ShapeTiming, what: str) -> str:
    """Why a shape's timing cannot be a measurement ("" when it can). A showdown's timing of a weighted objective
    (its shape a label, objective.is_label) holds weighted sums: finite and positive, however small the weights."""
    if t.samples < 1:
        return f"{what}: {t.samples} samples"
    summed = objective.is_label(t.shape)
    for name in ("median_s", "q1_s", "q3_s", "ci_low_s", "ci_high_s"):
        value = getattr(t, name)
        if name != "median_s" and value == 0.0:
            continue  # optional statistics (a replayed recording has no interval)
        if summed and (not math.isfinite(value) or value <= 0):
            return f"{what}: {name} {value!r} is not a finite, positive weighted sum"
        if not summed and (flaw := _seconds_flaw(f"{what}: {name}", value)):
            return flaw
    for name in ("noise", "gbps", "sol_fraction"):
        value = getattr(t, name)
        if not math.isfinite(value) or value < 0:
            return f"{what}: {name} {value!r} is not a finite, non-negative number"
    return ""


def measurement_flaw(m: pb.Measured) -> str:
    """Why a Measured cannot be a real measurement ("" when it can)."""
    if m.objective:   # a weighted sum: its terms' medians are held to a kernel's time below, the sum to its weights
        if not math.isfinite(m.score_s) or m.score_s <= 0:
            return f"score {m.score_s!r} is not a finite, positive weighted sum of medians"
    elif flaw := _seconds_flaw("score", m.score_s):
        return flaw
    if not m.timings:
        return "no shape timings"
    for t in m.timings:
        if flaw := timing_flaw(t, f"shape {t.shape[:40]!r}"):
            return flaw
    if flaw := _score_flaw(m):
        return flaw
    target = m.candidate.target.split(":")[0]
    if m.device.target and m.device.target != target:
        return f"measured on a {m.device.target[:20]!r} device, but the candidate is for the {target!r} target"
    return ""


def _score_flaw(m: pb.Measured) -> str:
    """Why a Measured's score is not what its timings and objective make it ("" when it is,
    kfactory/judge/objective.py): the first shape's median where it has no objective; else the weighted sum of
    its shapes' medians, and for a screened-out one (one timing) a bound no lower than that shape's share."""
    if not m.objective:
        if m.score_s != m.timings[0].median_s:
            return f"score {m.score_s!r} s is not the first shape's median ({m.timings[0].median_s!r} s)"
        return ""
    if any(not math.isfinite(w) or w < 0 for w in m.objective.values()) or not any(m.objective.values()):
        return "its objective's weights are not finite, non-negative numbers with one at least positive"
    if m.screened_out:
        t = m.timings[0]
        share = m.objective.get(t.shape, 0.0) * t.median_s
        if not share or m.score_s < share * (1 - SCORE_RTOL):
            return f"screened-out score {m.score_s!r} s is under its screen's share of the objective ({share!r} s)"
        return ""
    try:
        expected = objective.score(m.timings, m.objective)
    except KeyError as e:
        return f"its objective scores shape {str(e)[:40]} that it did not time"
    if not math.isclose(m.score_s, expected, rel_tol=SCORE_RTOL):
        return f"score {m.score_s!r} s is not its objective's weighted sum of medians ({expected!r} s)"
    return ""


#: how far a score may stand from its timings' weighted sum (a sum's rounding, in any order of its terms)
SCORE_RTOL = 1e-9


def comparison_flaw(c: pb.Comparison) -> str:
    """Why a Comparison cannot be a real one ("" when it can); one that says it failed (error) carries none."""
    for e in c.entries:
        if e.HasField("timing") and (flaw := timing_flaw(e.timing, f"comparison entry {e.name[:40]!r}")):
            return flaw
    for name, value in c.speedups.items():
        if not math.isfinite(value) or value <= 0:
            return f"speedup of {name[:40]!r} {value!r} is not a finite, positive ratio"
    if not math.isfinite(c.seconds) or c.seconds < 0:   # a campaign's device-time budget adds it up
        return f"device time {c.seconds!r} s is not a finite, non-negative number"
    return ""


def start_flaw(s: pb.CampaignStarted) -> str:
    """Why a CampaignStarted cannot be the planner's ("" when it can): its comparisons' reserve is device time the
    search leaves of its budget (judge.order.compare_reserve), a finite, non-negative figure (the search's share
    is the budget less at most half of it, however large: judge.order.search_budget)."""
    if not math.isfinite(s.compare_reserve_s) or s.compare_reserve_s < 0 or s.compare_reserve_campaigns < 0:
        return (f"comparisons' reserve {s.compare_reserve_s!r} s from {s.compare_reserve_campaigns} campaigns is "
                "not a finite, non-negative figure")
    return ""


def finish_flaw(f: pb.CampaignFinished) -> str:
    """Why a CampaignFinished cannot be the planner's ("" when it can)."""
    if f.state not in FINISH_STATES:
        return f"state {f.state[:40]!r} is none of {', '.join(FINISH_STATES)}"
    negative = [fd.name for fd in pb.Counts.DESCRIPTOR.fields if getattr(f.counts, fd.name) < 0]
    if negative:
        return f"negative counts: {', '.join(negative)}"
    return ""


#: the keys of the events a campaign has one of (events.make_event's `<campaign>:<kind>:<key>` ids)
ONLY_KEYS = {"campaign_started": "start", "campaign_finished": "finish"}


def id_flaw(event: pb.Event) -> str:
    """Why the event's id is not one a service makes (events.make_event) ("" when it is): `<campaign>:<kind>:`
    and a key, the fixed one for a campaign's start and end."""
    kind = ev.kind_of(event)
    key = ONLY_KEYS.get(kind)
    want = f"{event.campaign_id}:{kind}:{key or ''}"
    if event.id == want if key else event.id.startswith(want) and len(event.id) > len(want):
        return ""
    return f"event id {event.id[:120]!r} is not {want}{'' if key else '<key>'}"


def body_flaw(event: pb.Event) -> str:
    """Why the event's own content cannot be believed, whatever came before it ("" when it can): its id, its
    producer, and the figures of the kinds that carry them."""
    if flaw := id_flaw(event) or producer_flaw(event):
        return flaw
    kind = ev.kind_of(event)
    if kind == "measured":
        return measurement_flaw(event.measured)
    if kind == "comparison":
        return comparison_flaw(event.comparison)
    if kind == "campaign_started":
        return start_flaw(event.campaign_started)
    if kind == "campaign_finished":
        return finish_flaw(event.campaign_finished)
    return ""

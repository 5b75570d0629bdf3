"""Lessons: what helped and what failed for a problem on a target, distilled from the archive with the figures
behind each (relative times, counts, the worst input's errors). Agents' prompts include them; the Evidence
service's Lessons RPC and `kfactory lessons PROBLEM` show them. Computed from the archive on each request, so
they are as current as the archive and are rebuilt with it."""
from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict

from kfactory.bus.origins import STRATEGY, Origin, is_kind, sql_match
from kfactory.judge import objective
from kfactory.services.memory.archive import target_matches
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb


def lessons(archive, problem: str, target: str = "", limit: int = 6) -> list[spb.Lesson]:
    """Every lesson for (problem, target): the best kernel, parameter effects, failure patterns, agents."""
    campaigns = [cid for cid, prob, tgt in archive.q("SELECT id, problem, target FROM campaigns")
                 if archive.problem_name(prob) == problem and target_matches(tgt or "", target)]
    if not campaigns:
        return []
    marks = ",".join("?" * len(campaigns))
    rows = archive.q(f"SELECT m.campaign, m.score_s, m.payload, c.origin, c.params_json, c.compile_flags FROM "
                     f"measurements m JOIN candidates c ON c.campaign=m.campaign AND c.id=m.candidate "
                     f"WHERE m.campaign IN ({marks})", tuple(campaigns))
    everything = [_Row(*r) for r in rows]
    # its timing is of a kernel that computes the wrong thing (found so by any campaign, on any target)
    wrong = archive.problem_verdicts(problem, results=False).wrong
    measured = [r for r in everything if not r.m.screened_out and r.m.candidate.id not in wrong]
    best: dict[str, float] = {}
    for r in measured:
        best[r.campaign] = min(best.get(r.campaign, r.score), r.score)
    for r in measured:
        r.relative = r.score / best[r.campaign]
    out = _best(measured, len(campaigns))
    out += _effects(measured, limit)
    out += _failures(archive, campaigns, marks, limit)
    out += _agents(archive, campaigns, marks, measured, everything)
    return out


def as_text(items: list[spb.Lesson]) -> str:
    """The lessons as prompt text, one line each."""
    return "\n".join(f"- {x.kind}: {x.text}" for x in items)


class _Row:
    def __init__(self, campaign, score, payload, origin, params, flags):
        self.campaign, self.score, self.origin, self.flags = campaign, score, origin, flags
        self.m = pb.Measured.FromString(payload)
        self.params = json.loads(params or "{}")
        self.relative = 1.0


def _best(measured: list[_Row], n_campaigns: int) -> list[spb.Lesson]:
    ref = {r.campaign: r.score for r in measured if r.origin == Origin.REFERENCE.of()}
    mine = [r for r in measured if r.origin != Origin.REFERENCE.of()]
    if not mine:
        return []
    # every campaign's best is 1.0x its campaign's best: among those, the one furthest ahead of its reference
    b = min(mine, key=lambda r: (r.relative, -ref.get(r.campaign, 0.0) / r.score))
    t = b.m.timings[0] if b.m.timings else None
    speed = f", {ref[b.campaign] / b.score:.2f}x the reference kernel" if b.campaign in ref else ""
    # a weighted score is the objective's (kfactory/judge/objective.py), not one shape's: named so, and the
    # bandwidth named with the shape it was reached at
    where = objective.named_label(b.m.objective) if b.m.objective else (t.shape if t else "?")
    bw = (f", {t.gbps:.1f} GB/s = {t.sol_fraction * 100:.0f}% of measured bandwidth"
          f"{f' at {t.shape}' if b.m.objective else ''}") if t and t.gbps else ""
    what = f"{b.origin} {json.dumps(b.params, sort_keys=True)} flags '{b.flags}'" if b.params else \
        f"{b.origin} flags '{b.flags}'"
    return [spb.Lesson(kind="best", value=b.score, count=len(mine),
                       text=f"fastest so far ({len(mine)} kernels measured in {n_campaigns} campaigns, "
                            f"{b.m.device.model}): {what}: {b.score * 1e3:.4g} ms at {where}"
                            f"{speed}{bw}")]


def _effects(measured: list[_Row], limit: int) -> list[spb.Lesson]:
    """Per design parameter of the template families: the value whose kernels came closest to their campaign's
    best against the one that came furthest (medians of relative times)."""
    by = defaultdict(list)
    for r in measured:
        if is_kind(r.origin, *STRATEGY):
            for k, v in r.params.items():
                by[(k, json.dumps(v))].append(r.relative)
    params: defaultdict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
    for (k, v), rel in by.items():
        if len(rel) >= 2:
            params[k][v] = (statistics.median(rel), len(rel))
    found = []
    for k, vals in params.items():
        if len(vals) < 2:
            continue
        (bv, (bm, bn)), (wv, (wm, wn)) = min(vals.items(), key=lambda x: x[1][0]), max(vals.items(),
                                                                                      key=lambda x: x[1][0])
        found.append(spb.Lesson(kind="helped", value=wm / bm, count=bn + wn,
                                text=f"{k}={bv}: median {bm:.2f}x its campaign's best ({bn} kernels) vs "
                                     f"{k}={wv}: {wm:.2f}x ({wn} kernels)"))
    return sorted(found, key=lambda x: -x.value)[:limit]


def _failures(archive, campaigns, marks, limit: int) -> list[spb.Lesson]:
    """Failure reasons with counts and the worst figures, and design values that failed most of the time."""
    rows = archive.q(f"SELECT payload FROM events WHERE kind IN ('rejected', 'compile_failed') AND campaign IN "
                     f"({marks})", tuple(campaigns))
    reasons: Counter = Counter()
    worst: dict[str, tuple[float, str]] = {}
    failed_values: Counter = Counter()
    for (payload,) in rows:
        e = pb.Event.FromString(payload)
        body = e.rejected if e.HasField("rejected") else e.compile_failed
        if body.reason == pb.DUPLICATE or (e.HasField("rejected") and e.rejected.HasField("agent")):
            continue
        name = pb.RejectReason.Name(body.reason)
        reasons[name] += 1
        for k, v in json.loads(body.candidate.params_json or "{}").items():
            failed_values[(k, json.dumps(v))] += 1
        checks = [c for c in getattr(body, "checks", []) if not c.passed]
        if checks:
            c = max(checks, key=lambda c: c.norm_rel_err if c.norm_rel_err == c.norm_rel_err else float("inf"))
            fig = (c.norm_rel_err, f"worst: max rel err {c.max_rel_err:.3g}, norm-relative {c.norm_rel_err:.3g} on "
                                   f"{c.distribution} {c.shape}")
            if name not in worst or not fig[0] <= worst[name][0]:
                worst[name] = fig
        elif name not in worst and body.message:
            worst[name] = (0.0, "e.g. " + body.message.strip().splitlines()[0][:160])
    out = [spb.Lesson(kind="failed", value=n, count=n, text=f"{n} kernels {reason}" +
                      (f" ({worst[reason][1]})" if reason in worst else ""))
           for reason, n in reasons.most_common(limit)]
    totals = _value_totals(archive, campaigns, marks)
    for (k, v), n in failed_values.most_common():
        total = totals.get((k, v), 0)
        if n >= 2 and total and n / total >= 0.5 and len(out) < 2 * limit:
            out.append(spb.Lesson(kind="failed", value=n / total, count=total,
                                  text=f"{k}={v}: {n} of {total} kernels failed"))
    return out


def _value_totals(archive, campaigns, marks) -> Counter:
    totals: Counter = Counter()
    for (params,) in archive.q(f"SELECT params_json FROM candidates WHERE campaign IN ({marks}) AND "
                               f"{sql_match('origin', STRATEGY)}", tuple(campaigns)):
        for k, v in json.loads(params or "{}").items():
            totals[(k, json.dumps(v))] += 1
    return totals


def _agents(archive, campaigns, marks, measured: list[_Row], everything: list[_Row]) -> list[spb.Lesson]:
    """Per agent persona: tasks, measured kernels and how close the best came, and why the others failed."""
    tasks: Counter = Counter()
    failures: dict[str, Counter] = defaultdict(Counter)
    for (payload,) in archive.q(f"SELECT payload FROM events WHERE kind IN ('rejected', 'candidate_created') AND "
                                f"campaign IN ({marks})", tuple(campaigns)):
        e = pb.Event.FromString(payload)
        info = e.rejected.agent if e.HasField("rejected") else e.candidate_created.candidate.agent
        if not info.persona:
            continue
        tasks[info.persona] += 1
        if e.HasField("rejected"):
            failures[info.persona][pb.RejectReason.Name(e.rejected.reason)] += 1
    out = []
    for persona, n in sorted(tasks.items()):
        origin = Origin.AGENT.of(persona)
        rel = sorted(r.relative for r in measured if r.origin == origin)
        screened = sum(1 for r in everything if r.origin == origin and r.m.screened_out)
        got = f"{len(rel)} measured, best {rel[0]:.2f}x its campaign's best" if rel else "none measured in full"
        if screened:
            got += f", {screened} screened out (a short timing far slower than the best at the time)"
        why = ", ".join(f"{k} {v}" for k, v in failures[persona].most_common())
        out.append(spb.Lesson(kind="agent", value=rel[0] if rel else 0.0, count=n,
                              text=f"persona {persona}: {n} tasks, {got}" + (f"; failures: {why}" if why else "")))
    return out

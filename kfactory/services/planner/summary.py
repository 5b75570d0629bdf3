"""A campaign's summary: what `kfactory run --json` prints and CampaignFinished.summary_json carries.

Read-only questions over a CampaignState (kfactory/services/planner/campaign.py); nothing here changes it.
"""
from __future__ import annotations

import json

from google.protobuf.json_format import MessageToDict

from kfactory.evidence import warm_sources
from kfactory.judge import objective
from kfactory.judge.stats import significant
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.coders import TEMPLATE
from kfactory.v1 import events_pb2 as pb


def coder_summary(st: CampaignState) -> dict:
    """The summary's coder sections: per arm (yields), per agent persona, and the agents' token use."""
    arms = st.coders.summary(st.token_seconds)
    agents = {name: {k: a[k] for k in ("proposed", "candidates", "measured", "improvements", "tokens_in",
                                        "tokens_out", "failures")}
              for name, a in arms.items() if name != TEMPLATE}
    out = {"coders_used": list(st.spec.coders) or [TEMPLATE], "coders": arms, "agents": agents}
    if "agent" in st.spec.coders:
        failures: dict[str, int] = {}
        for a in agents.values():
            for reason, n in a["failures"].items():
                failures[reason] = failures.get(reason, 0) + n
        out["agent_tokens"] = {"in": sum(a["tokens_in"] for a in agents.values()),
                               "out": sum(a["tokens_out"] for a in agents.values()),
                               "budget": st.spec.token_budget}
        out["agent_failures"] = failures
        note = st.agent_note or (f"agents paused after {st.coders.endpoint_streak} endpoint failures in a "
                                 f"row (last: {st.coders.last_endpoint_failure})"
                                 if st.coders.endpoint_paused() else "")
        if note:
            out["agent_note"] = note
    return out


def campaign_summary(st: CampaignState, problem) -> dict:
    """The campaign summary (the CLI's --json output, less what only the CLI knows); `problem` is None when
    it no longer loads."""
    best = st.best()
    out = {"campaign_id": st.id, "problem": st.spec.problem, "target": st.spec.target,
           "device": st.device.model, "strategy": st.spec.strategy,
           "device_info": MessageToDict(st.device, preserving_proto_field_name=True),
           "counts": {f.name: getattr(st.counts, f.name) for f in pb.Counts.DESCRIPTOR.fields},
           "elapsed_seconds": round(st.elapsed(), 3), "best": None}
    outcomes = st.counts.measured + st.counts.rejected + st.counts.compile_failed
    # all it held the device for, of which the showdowns' and final comparisons' (a candidate's cost is the rest,
    # an engine's timing rounds after the search included: they are measurements)
    out["device_seconds"] = round(st.device_s, 3)
    out["device_seconds_comparisons"] = round(st.compare_device_s, 3)
    # one showdown's and one result's final comparison, for a later campaign's reserve (judge.order.
    # compare_reserve): the largest, where a result found wrong made the next best compared too (one found wrong
    # at its first shape ended early; none: 0)
    out["device_seconds_showdown"] = round(max(st.showdown_device_by.values(), default=0.0), 3)
    out["device_seconds_final_comparison"] = round(max(st.final_device_by.values(), default=0.0), 3)
    out["device_seconds_per_candidate"] = round(st.search_device_s / outcomes, 3) if outcomes else None
    out.update(coder_summary(st))
    if st.priors.points:  # a warm start: each source, how far it was trusted, and what it ended with
        out["warm_start"] = warm_sources.campaign_section(st.source_trust(), st.priors, st.source_devices)
    # `--goal`: whether a candidate reached it (and which; none found wrong since), which ended the search
    if st.spec.goal_fraction > 0:
        reached = st.goal_reached()
        out["goal"] = {"fraction": st.spec.goal_fraction, "reached_by": reached.candidate.id if reached else None}
    # kernels a showdown or the final comparison found wrong: no result, whatever their score
    if own := sorted(c for c in st.disqualified if c not in st.known_wrong):
        out["found_wrong"] = own
    # kernels it measured that another campaign found wrong, with that campaign (no result here either)
    if known := {c: st.known_wrong[c] for c in sorted(st.known_wrong) if c in st.measured}:
        out["known_wrong"] = known
    pick = st.search_best()
    if pick is not None and (sd := st.showdowns.get(pick.candidate.id)) is not None:
        out["showdown"] = _showdown_section(st, sd)
    if best is not None:
        out["best"] = _best_section(st, best, problem)
    return out


def _showdown_section(st: CampaignState, sd: pb.Comparison) -> dict:
    """The showdown `sd` of the search's best (kfactory/services/planner/driver.py _showdown): each kernel's median in
    the interleaved timing and the one it decided, or why it decided nothing (and which kernel it found wrong)."""
    pick = st.measured.get(sd.candidate_id)
    winner, why = st.showdown_decision(pick) if pick is not None else (None, "")
    return {"shape": sd.shape, "search_best": sd.candidate_id, "error": sd.error or None,
            "found_wrong": sorted({s.failed_candidate for s in st.showdowns.values() if s.failed_candidate}) or None,
            "winner": winner, "decided": why or None,
            "timed": {e.candidate_id: {"median_seconds": e.timing.median_s, "ci_seconds": [e.timing.ci_low_s,
                                                                                           e.timing.ci_high_s],
                                       "search_score_seconds": st.measured[e.candidate_id].score_s
                                       if e.candidate_id in st.measured else None}
                      for e in sd.entries if e.HasField("timing")}}


def _best_section(st: CampaignState, best: pb.Measured, problem) -> dict:
    """The best kernel: its identity, its timing per shape and how it compared with the reference and baselines;
    at the top, its score, what it scores (`shape`: the objective's label, kfactory/judge/objective.py) and the
    objective's speedups."""
    cand = best.candidate
    compared = {t.shape: c for t in best.timings
                # of a result found wrong there: not this kernel's
                if (c := st.comparisons.get(t.shape)) is not None and c.candidate_id == cand.id}
    shapes = {}
    for t in best.timings:
        comp = compared.get(t.shape)
        speed = dict(comp.speedups) if comp else {}
        shapes[t.shape] = {"median_seconds": t.median_s, "noise": t.noise, "samples": t.samples,
                           "gbps": t.gbps, "fraction_of_measured_bandwidth": t.sol_fraction,
                           "speedup_vs_reference": speed.get("reference"),
                           "speedup_vs_baselines": {k: v for k, v in speed.items()
                                                    if k not in ("reference", "candidate")},
                           "significant": _significance(comp), "compared": _entries(comp)}
    if problem is None:  # a package gone since the campaign ran: its first timed shape, as scored before weights
        label = best.timings[0].shape if best.timings else ""
        speed = dict(compared[label].speedups) if label in compared else {}
    else:
        label = objective.label(problem)
        medians = {s: {e.name: e.timing.median_s for e in c.entries if e.HasField("timing")}
                   for s, c in compared.items()}
        names = {n for c in compared.values() for n in c.speedups}
        speed = {n: x for n in names if (x := objective.speedup(problem, medians, n)) is not None}
    return {"candidate_id": cand.id, "family": cand.family, "origin": cand.origin,
            "params": json.loads(cand.params_json or "{}"), "compile_flags": cand.compile_flags,
            "median_seconds": best.score_s, "shape": label,
            "speedup_vs_reference": speed.get("reference"),
            "speedup_vs_baselines": {k: v for k, v in speed.items() if k not in ("reference", "candidate")},
            "shapes": shapes}


def _entries(comp: pb.Comparison | None) -> dict[str, dict]:
    """Per kernel of the final comparison: its median, bandwidth, roofline fraction and how it was timed."""
    if comp is None:
        return {}
    return {e.name: {"median_seconds": e.timing.median_s, "gbps": e.timing.gbps, "samples": e.timing.samples,
                     "fraction_of_measured_bandwidth": e.timing.sol_fraction, "mode": e.timing.mode or "wall",
                     "throttled": e.timing.telemetry.throttled}
            for e in comp.entries if e.HasField("timing")}


def _significance(comp: pb.Comparison | None) -> dict[str, bool]:
    """Per compared kernel: whether its median's 95% CI is apart from the candidate's (a real difference)."""
    if comp is None:
        return {}
    entries = {e.name: e.timing for e in comp.entries if e.HasField("timing")}
    cand = entries.get("candidate")
    return {name: significant(cand, t) for name, t in entries.items() if cand is not None and name != "candidate"}

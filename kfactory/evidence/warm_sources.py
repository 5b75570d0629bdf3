"""A warm start's sources as the user sees them: in a campaign's summary (and so its report), and in
`kfactory priors`.

A source is one earlier campaign whose measurements a warm start learns from (memory's priors, every source's).
While a campaign runs, its strategy judges each source on the campaign's own results (strategies/agreement.py):
a rank agreement (Kendall's tau) with a 90% interval, and a weight won against the campaign's own model. The
summary keeps what it ended with; the report shows it as a table; `kfactory priors` says which sources a new
campaign would learn from, how far it would trust each at its start, and what earlier campaigns measured of them.
"""
from __future__ import annotations

import json

#: what a campaign's trust in its sources rests on, said wherever the weights are shown
HOW = ("agreement is Kendall's tau between a source's predictions and the campaign's measurements (1: same order, "
       "0: none, -1: reversed), with a 90% interval from bootstrap resamples of the measured points; a source's "
       "weight comes from how often, over those resamples, it orders them better than the campaign's own model (a "
       "GP predicting each point without it): none for a source no better than that model, and the evidence's "
       "say (the weights' sum) is the best source's margin over it")


def campaign_section(trust, priors, devices: dict[str, str]) -> dict:
    """The summary's `warm_start` section: each source with the device it ran on, its points, its agreement with
    this campaign's results and the weight it ended with; the evidence's say (the sources' total weight) and the
    own model's; how many of the evidence's points were proposed first and why that stopped. `trust` is the
    strategy's agreement.Trust (None when the strategy weighs no sources: then every source counted the same),
    `priors` the campaign's transfer.WarmPriors, `devices` source -> device."""
    names = sorted(priors.points)
    by_name = {s.source: s for s in trust.sources} if trust is not None else {}
    sources = []
    for name in names:
        row = {"source": name, "device": devices.get(name, ""), "points": priors.points[name]}
        s = by_name.get(name)
        if s is not None:
            row.update({k: v for k, v in s.as_dict().items() if k != "source"})
        else:   # a strategy that weighs no sources counts each the same; one that does had none from this one
            # (too few of its points in this campaign's space to predict from: transfer.PriorMean)
            row.update({"agreement": None, "interval_90": [None, None],
                        "weight": round(1.0 / len(names), 3) if trust is None else 0.0})
        sources.append(row)
    out = {"measured": trust is not None, "results_judged": trust.results if trust is not None else 0,
           "evidence_say": round(trust.evidence, 3) if trust is not None else 1.0,
           "own_model_weight": round(trust.own, 3) if trust is not None else 0.0,
           "own_model_agreement": (None if trust is None or trust.own_tau is None else round(trust.own_tau, 3)),
           "priors_proposed": priors.proposed, "priors_stopped": priors.stopped, "sources": sources}
    return out


def _tau(v) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _interval(iv) -> str:
    return "" if not iv or iv[0] is None else f" [{iv[0]:+.2f}, {iv[1]:+.2f}]"


def source_lines(section: dict) -> list[str]:
    """One line per source: device, agreement with its interval, and weight (for a console)."""
    return [f"{s['source']} ({s['device'] or 'device unknown'}, {s['points']} points): agreement "
            f"{_tau(s['agreement'])}{_interval(s['interval_90'])}, weight {s['weight']:.2f}"
            for s in section.get("sources", [])]


def report_lines(summary: dict) -> list[str]:
    """The report's section on the warm start's sources (nothing for a cold start)."""
    w = summary.get("warm_start")
    if not w or not w.get("sources"):
        return []
    lines = ["## Warm start: how far each source was trusted", ""]
    if w["measured"]:
        lines += [f"After {w['results_judged']} results the sources had {w['evidence_say']:.2f} of the say and this "
                  f"campaign's own model {w['own_model_weight']:.2f} (own model's agreement "
                  f"{_tau(w['own_model_agreement'])}); {HOW}.", ""]
    else:
        lines += ["This campaign's strategy does not weigh its sources: every source counted the same.", ""]
    lines += ["| source campaign | device | points | agreement (Kendall tau) [90%] | final weight |",
              "|---|---|---|---|---|"]
    lines += [f"| {s['source']} | {s['device'] or '?'} | {s['points']} | {_tau(s['agreement'])}"
              f"{_interval(s['interval_90'])} | {s['weight']:.2f} |" for s in w["sources"]]
    stop = f" ({w['priors_stopped']})" if w.get("priors_stopped") else ""
    lines += ["", f"Points of the evidence proposed first: {w['priors_proposed']}{stop}.", ""]
    return lines


# -- kfactory priors ------------------------------------------------------------------------------------------
def sources_of(priors) -> list[dict]:
    """The sources a new campaign would learn from, one per earlier campaign in memory's every-source priors:
    its device, how many of its points it would learn from, and its best time."""
    out: dict[str, dict] = {}
    seen: dict[str, set] = {}
    for p in priors:
        s = out.setdefault(p.campaign_id, {"source": p.campaign_id, "device": p.device, "points": 0,
                                           "best_seconds": p.score_s})
        points = seen.setdefault(p.campaign_id, set())
        if (p.family, p.params_json) not in points:  # a point counts once, as the campaign counts it
            points.add((p.family, p.params_json))
            s["points"] += 1
        s["best_seconds"] = min(s["best_seconds"], p.score_s)
    return sorted(out.values(), key=lambda s: s["source"])


def history_of(statuses, problem: str, sources: list[dict], resolve=None) -> list[dict]:
    """What finished campaigns of `problem` (among `statuses`, CampaignStatus messages) measured of these sources:
    one entry per campaign whose summary has a measured warm-start section that judged any of them, with each such
    source's agreement and final weight there. `resolve(locator)` names a spec's problem (default: as this
    machine loads it; memory's Archive.problem_name also knows the names imported evidence brought)."""
    from kfactory.problems.loader import problem_name  # here: the query clients import the report, and so this

    resolve = resolve or problem_name
    known, name = {s["source"] for s in sources}, resolve(problem)
    out = []
    for st in statuses:
        if not st.summary_json or not st.spec.problem or resolve(st.spec.problem) != name:
            continue
        try:
            w = json.loads(st.summary_json).get("warm_start") or {}
        except ValueError:
            continue
        judged = [s for s in w.get("sources", []) if s.get("source") in known]
        if w.get("measured") and judged:
            out.append({"campaign": st.id, "device": st.device.model, "results_judged": w.get("results_judged", 0),
                        "evidence_say": w.get("evidence_say"), "sources": judged})
    return out


def priors_view(sources: list[dict], history: list[dict] | None) -> dict:
    """`kfactory priors`'s account of trust: which sources a new campaign would learn from, the weight each
    starts with, why, and (when known) what earlier campaigns measured of them."""
    from kfactory.strategies.agreement import PRIORS_JUDGED  # here: the query clients import this module
    from kfactory.strategies.transfer import MIN_POINTS

    usable = [s for s in sources if s["points"] >= MIN_POINTS]
    start = round(1.0 / len(usable), 3) if usable else 0.0
    why = ("a new campaign has no result of its own to judge the sources by, so each starts with the same weight "
           f"(a source with fewer than {MIN_POINTS} points has none: no landscape is fitted to so few, and its "
           "points are proposed first only when no source has more); after each result, " + HOW + "; a source "
           "that misorders the new campaign's results loses its say, and the evidence's points stop being "
           f"proposed first once every source, judged on at least {PRIORS_JUDGED} results, orders them confidently "
           "against the campaign (its interval's upper end below 0)")
    return {"sources": [{**s, "start_weight": start if s["points"] >= MIN_POINTS else 0.0} for s in sources],
            "why": why, "measured_before": history if history is not None else None}


def priors_text(view: dict) -> str:
    """The text form of priors_view."""
    if not view["sources"]:
        return "no sources: a new campaign of this problem would start cold"
    usable = [s for s in view["sources"] if s["start_weight"] > 0]
    if not usable:
        return ("no source with enough points to learn a landscape from ("
                + ", ".join(f"{s['source']}: {s['points']} point(s)" for s in view["sources"])
                + "): a new campaign would propose their best points first, all sources counting the same, and "
                "then search as a cold start does")
    lines = [f"a new campaign would learn from {len(usable)} source(s), trusting each the same at first:"]
    lines += [f"  {s['source']} on {s['device'] or 'an unknown device'}: {s['points']} points, best "
              f"{s['best_seconds'] * 1e3:.3f} ms, start weight {s['start_weight']:.2f}" for s in view["sources"]]
    lines.append(f"why: {view['why']}.")
    history = view.get("measured_before")
    if history:
        lines.append("what earlier campaigns measured of them (agreement with that campaign's results, final weight):")
        for h in history:
            parts = "; ".join(f"{s['source']} ({s.get('device') or '?'}) {_tau(s.get('agreement'))}"
                              f"{_interval(s.get('interval_90'))}, weight {s.get('weight', 0):.2f}"
                              for s in h["sources"])
            lines.append(f"  {h['campaign']} on {h['device'] or '?'} after {h['results_judged']} results: {parts}")
    elif history is not None:
        # (a source is a campaign's measurements: "measured them" read as if its own campaign had not)
        lines.append("no finished campaign has started warm from them yet, so none has judged how well they predict.")
    return "\n".join(lines)

"""Campaign reports: markdown with the comparison, leaderboard, failures and noisy measurements, plus a plot per
optimisation shape of every candidate's time beside the best so far (PNG, kfactory/evidence/plots.py)."""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.bus.causes import cause_name
from kfactory.bus.origins import Origin
from kfactory.evidence import plots
from kfactory.evidence import warm_sources
from kfactory.evidence.verdicts import NOTES, Verdicts, found_wrong
from kfactory.v1 import events_pb2 as pb


#: every report.md kfactory writes starts so (_markdown's title, naming the campaign in full)
TITLE = "# Campaign "
TITLE_RE = re.compile(r"# Campaign ([A-Za-z0-9_-]{1,64}):")
#: the whole of that first line ("# Campaign c1464cd5ba8d1: softmax on cpu"): a report.md that does not start so is
#: the user's own, "# Campaign notes: what I tried" too
WHOLE_TITLE = re.compile(r"# Campaign [A-Za-z0-9_-]{1,64}: .+ on .+\n")
#: the files a report is (report.md, then plot.png)
FILES = ("report.md", "plot.png")


def foreign_files(out_dir: Path) -> list[str]:
    """The files a report written into `out_dir` would write over that are no report's: a report.md that is not
    one, and a plot.png beside no report.md of kfactory's."""
    md = out_dir / "report.md"
    try:
        ours = md.is_file() and WHOLE_TITLE.match(md.read_text(errors="replace")) is not None
    except OSError:
        ours = False
    return [name for name in FILES if os.path.lexists(out_dir / name) and not ours]


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g} ms"


def build(events: list[pb.Event], noise_bound: float | None = None,
          known: dict[str, pb.KnownWrong] | None = None) -> tuple[str, bytes]:
    """(markdown, plot PNG) for one campaign's events. `noise_bound`: the relative IQR over which a timing is
    flagged as noisy (default: the measure_noise setting, KFACTORY_MEASURE_NOISE, that the benchmarker samples
    towards). `known`: kernels other campaigns found wrong (memory's verdicts of the problem), marked too."""
    md, title = _markdown(events, noise_bound, known)
    return md, plots.render(plots.panels(events), title)


def markdown(events: list[pb.Event], noise_bound: float | None = None,
             known: dict[str, pb.KnownWrong] | None = None) -> str:
    """The report's markdown alone (build's first half, without drawing the plot it links to)."""
    return _markdown(events, noise_bound, known)[0]


def _markdown(events: list[pb.Event], noise_bound: float | None,
              known: dict[str, pb.KnownWrong] | None = None) -> tuple[str, str]:
    """(markdown, the plot's title)."""
    started = next((e.campaign_started for e in events if e.HasField("campaign_started")), None)
    finished = next((e.campaign_finished for e in events if e.HasField("campaign_finished")), None)
    cid = events[0].campaign_id if events else "?"
    spec = started.spec if started else pb.CampaignSpec()
    summary = json.loads(finished.summary_json) if finished and finished.summary_json else {}
    measured = [e.measured for e in events if e.HasField("measured")]
    from kfactory.engines.problem import PREFIX as ENGINE_PREFIX
    from kfactory.problems.loader import problem_name  # here: the query clients import this module too

    name = problem_name(spec.problem) if spec.problem else "?"
    engine = spec.problem.startswith(ENGINE_PREFIX)
    lines = [f"{TITLE}{cid}: {name} on {spec.target}", ""]
    if name != spec.problem:  # a package directory or a recorded space: say where the problem came from
        lines += [f"- problem: {name}, from `{spec.problem}`"]
    lines += [f"- device: {started.device.model if started else '?'}",
              f"- strategy: {spec.strategy}; budget: {_budget(spec)}; threads: {spec.threads}",
              f"- state: {finished.state if finished else 'running'}"
              + (f" ({finished.reason})" if finished and finished.reason else ""),
              f"- counts: {format_params(summary.get('counts', {}))}", ""]
    lines += noise_warning(events, default_noise_bound() if noise_bound is None else noise_bound)
    lines += _best_section(summary, events, engine)
    lines += warm_sources.report_lines(summary)
    verdicts = Verdicts.of(events)   # its own comparisons, and what its start knew other campaigns found wrong
    verdicts.add_wrong(known or {})
    lines += _leaderboard(measured, cid, verdicts)
    lines += _failures(events)
    lines += _dead_letters(events)
    shape_panels = plots.panels(events)
    lines += ["## Every candidate and the best so far", "",
              f"One plot per optimisation shape ({', '.join(p.shape for p in shape_panels if p.shape) or 'none timed'})"
              ": each candidate's median time in the order results came, failures marked along the top by "
              "reason, the best so far, and the reference kernel (dashed).", "",
              "![every candidate and the best so far](plot.png)", ""]
    return "\n".join(lines), f"{name} on {spec.target}: campaign {cid}"


def default_noise_bound() -> float:
    """The benchmarker's noise bound as this process's settings give it (KFACTORY_MEASURE_NOISE)."""
    from pydantic import ValidationError

    from kfactory.platform.config import Settings

    try:
        return Settings().measure_noise
    except ValidationError:  # a bad setting elsewhere (refused by the CLI before this): the default bound
        return Settings.model_fields["measure_noise"].default


def noisy_timings(events: list[pb.Event], bound: float) -> tuple[int, list[tuple[float, str, str]]]:
    """(timings looked at, [(relative IQR, what, shape)] of those over `bound`, noisiest first). Looked at:
    every full measurement's timing per shape and every kernel of the final comparison; not screening timings
    (short by design) nor replayed ones (recorded elsewhere: rerunning here changes nothing)."""
    seen, over = 0, []
    for e in events:
        if e.HasField("measured") and not (e.measured.screened_out or e.measured.replayed):
            m = e.measured
            is_ref = m.candidate.origin == Origin.REFERENCE.of()
            what = "reference kernel" if is_ref else f"candidate {m.candidate.id[:12]}"
            timings = [(what, t) for t in m.timings]
        elif e.HasField("comparison"):
            where = "the showdown" if e.comparison.showdown else "the final comparison"
            timings = [(f"{en.name} {en.candidate_id[:12]} in {where}" if e.comparison.showdown else
                        f"{en.name} in {where}", en.timing) for en in e.comparison.entries if en.HasField("timing")]
        else:
            continue
        for what, t in timings:
            seen += 1
            if t.noise > bound:
                over.append((t.noise, what, t.shape))
    return seen, sorted(over, reverse=True)


def noise_warning(events: list[pb.Event], bound: float, shown: int = 5) -> list[str]:
    """Markdown lines warning that timings were noisier than the bound (nothing when none were): the host was
    busy, so the figures (and which kernel won) may not hold on an idle one."""
    seen, over = noisy_timings(events, bound)
    if not over:
        return []
    worst = [f"{n:.0%} ({what} at {shape})" for n, what, shape in over[:shown]]
    return [f"> **Warning: noisy measurements.** {len(over)} of {seen} timings had a relative IQR over the noise "
            f"bound of {bound:.0%}; the noisiest: {', '.join(worst)}"
            f"{f' and {len(over) - shown} more' if len(over) > shown else ''}. "
            "Busy host: rerun on an idle machine (or with a longer KFACTORY_MEASURE_MAX_S) before trusting "
            "close differences.", ""]


def format_params(params: str | dict) -> str:
    """A candidate's parameters as compact `key=value key=value` (canonical JSON in, its key order kept); '-' for
    none (the reference kernel, a manual one); the text as given when it is no JSON object."""
    if isinstance(params, str):
        text = params
        try:
            params = json.loads(text) if text else {}
        except ValueError:
            return text
    if not isinstance(params, dict):
        return str(params)
    return " ".join(f"{k}={_value(v)}" for k, v in params.items()) or "-"


def _value(v) -> str:
    """One parameter's value: strings bare (quoted only when they hold a space, '=' or nothing), the rest as
    compact JSON (true, 1.5, [16,32])."""
    if isinstance(v, str):
        return v if v and not any(c.isspace() or c == "=" for c in v) else json.dumps(v)
    return json.dumps(v, separators=(",", ":"))


def _best_section(summary: dict, events: list[pb.Event], engine: bool = False) -> list[str]:
    best = summary.get("best")
    if not best:
        if any(e.HasField("measured") for e in events):   # all screened out, or found wrong (the leaderboard says)
            return ["No measured candidate can be the result: each was screened out or found wrong (below).", ""]
        return ["No candidate was measured.", ""]
    out = ["## Best candidate", "",
           f"`{best['candidate_id'][:16]}` ({best['origin']}), flags `{best['compile_flags']}`",
           "", f"parameters: `{format_params(best['params'])}`", "",
           "## Interleaved comparison (same runner, same threads, A B A B ...)", ""]
    wrong: dict[str, str] = {}  # a result found wrong before this one: its first failure (it is timed on after it)
    for e in events:
        if not e.HasField("comparison") or e.comparison.showdown:  # the showdown: summary.json's "showdown"
            continue
        c = e.comparison
        if c.candidate_id != best["candidate_id"]:  # a result before it, found wrong there: its own figures
            if found_wrong(c):
                wrong.setdefault(c.candidate_id, f"`{c.candidate_id[:16]}`: {c.error}")
            continue
        out += [f"### {c.shape}", ""]
        if c.error:
            out += [f"Not measured: {c.error}", ""]
        out += ["| kernel | median | IQR | 95% CI | samples | GB/s | of measured bandwidth | speedup of best |",
                "|---|---|---|---|---|---|---|---|"]
        for en in c.entries:
            t = en.timing
            sp = c.speedups.get(en.name)
            out.append(f"| {en.name} | {_ms(t.median_s)} | {_ms(t.q1_s)} - {_ms(t.q3_s)} | "
                       f"{_ms(t.ci_low_s)} - {_ms(t.ci_high_s)} | {t.samples} | {t.gbps:.1f} | "
                       f"{t.sol_fraction:.0%} | " + (f"{sp:.2f}x |" if sp else "- |"))
        out.append("")
    if wrong:
        out += ["Found wrong in its final comparison before this one became the result (no result): "
                + "; ".join(wrong.values()), ""]
    if known := summary.get("known_wrong"):
        out += ["Measured here, found wrong by another campaign's comparison (no result): "
                + "; ".join(f"`{c[:16]}` (campaign {by})" for c, by in known.items()), ""]
    return out + _verification(best["candidate_id"], events, engine)


def verification_table(checks) -> list[str]:
    """Markdown: one row per check (shape x distribution, regression inputs, the memoisation probe)."""
    out = ["| shape | distribution | seed | max abs err | max rel err | norm rel err | kernel time | passed |",
           "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        out.append(f"| {c.shape} | {c.distribution} | {c.seed} | {c.max_abs_err:.2e} | {c.max_rel_err:.2e} | "
                   f"{c.norm_rel_err:.2e} | {_ms(c.seconds) if c.seconds else '-'} | "
                   + ("yes" if c.passed else f"**no**: {c.note}") + " |")
    return out


def _verification(best_id: str, events: list[pb.Event], engine: bool = False) -> list[str]:
    checks = next((e.verified.checks for e in events if e.HasField("verified")
                   and e.verified.candidate.id == best_id), None)
    if checks is None:
        return []
    # an engine's checks are the engine verification's (kfactory/engines/verify.py): fixed prompts, no draws
    how = ("every step's logits compared with the model's float64 reference on the same dequantised weights: "
           "prompts of several lengths, decode steps after each, a step after a long context and greedy "
           "generations (docs/engines.md)" if engine else
           "every output element compared with a float64 reference; inputs drawn with fresh seeds (re-draw any "
           "row from its seed)")
    return ["## Verification of the best candidate", "", f"{len(checks)} checks, {how}.", "",
            *verification_table(checks), ""]


def _budget(spec: pb.CampaignSpec) -> str:
    """The spec's budget in words: the limits it set, each (candidates, seconds, device seconds)."""
    parts = [f"{spec.budget_candidates} candidates" if spec.budget_candidates else "",
             f"{_seconds(spec.budget_seconds)} s" if spec.budget_seconds else "",
             f"{_seconds(spec.budget_device_seconds)} device s" if spec.budget_device_seconds else ""]
    return ", ".join(p for p in parts if p) or "none"


def _seconds(s: float) -> str:
    """Seconds as a person writes them: 90, 12.5, 2592000 (never 2.592e+06)."""
    return f"{s:.0f}" if float(s).is_integer() else f"{s:.2f}".rstrip("0")


def _leaderboard(measured: list[pb.Measured], campaign: str, verdicts: Verdicts, limit: int = 10) -> list[str]:
    """The fastest measured kernels by their own scores, each noted when it is the campaign's result or none
    (found wrong by a comparison, screened out: kfactory/evidence/verdicts.py), with its median at every shape
    a full measurement timed (a screened-out one's under the shape it was screened at), and its score where the
    score is a weighted sum (kfactory/judge/objective.py)."""
    full = next((m for m in measured if not m.screened_out), measured[0] if measured else None)
    shapes = [t.shape for t in full.timings] if full is not None else []
    weighted = any(m.objective for m in measured)
    score = ["score"] if weighted else []
    if not measured:
        return ["## Leaderboard", "", "Nothing was measured.", ""]
    header = ["rank", "candidate", "origin", "params", "flags", "note", *score, *shapes]
    out = ["## Leaderboard", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, m in enumerate(sorted(measured, key=lambda m: m.score_s)[:limit], 1):
        c = m.candidate
        params = format_params(c.params_json).replace("|", "\\|")  # a '|' in a value would split the row
        note = "; ".join(NOTES[n] for n in verdicts.notes(campaign, m))
        at = {t.shape: _ms(t.median_s) for t in m.timings}
        cells = ([_ms(m.score_s)] if weighted else []) + [at.get(s, "") for s in shapes]
        row = [str(i), f"`{c.id[:12]}`", c.origin, f"`{params}`", c.compile_flags, note, *cells]
        out.append("| " + " | ".join(row) + " |")
    return out + [""]


def _dead_letters(events: list[pb.Event]) -> list[str]:
    """Work the services gave up on (the full payloads are on the KF_DLQ stream until sent back), and what became
    of a request to send it back (`kfactory dead-letters --replay`): the planner's refusal, or the outcome of the
    work it sent back while the campaign ran."""
    rows: list[list[str]] = []
    waiting: dict[str, list[list[str]]] = {}  # point id -> the rows of its dead letters with no outcome after
    for e in events:
        kind = ev.kind_of(e)
        if kind == "dead_letter":
            d = e.dead_letter
            rows.append([d.stage, cause_name(d.cause), str(d.deliveries),
                         d.reason.splitlines()[0][:200] if d.reason else "", ""])
            if (work := ev.dead_work(d)) is not None:
                waiting.setdefault(work[0], []).append(rows[-1])
        elif kind == "resend_answered":
            a = e.resend_answered
            for row in waiting.get(a.point_id, []):
                row[4] = "sent back, no outcome yet" if a.accepted else f"refused: {a.reason.splitlines()[0][:200]}"
        elif kind in ("measured", "rejected", "compile_failed"):
            body = getattr(e, kind)
            for row in waiting.pop(ev.outcome_point(body), []):
                row[4] = "sent back: " + ("measured" if kind == "measured" else pb.RejectReason.Name(body.reason))
    if not rows:
        return []
    out = ["## Dead letters", "", "| stage | cause | deliveries | reason | then |", "|---|---|---|---|---|"]
    return out + [f"| {' | '.join(r)} |" for r in rows] + [""]


def _failures(events: list[pb.Event]) -> list[str]:
    reasons: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for e in events:
        for kind in ("rejected", "compile_failed"):
            if e.HasField(kind):
                body = getattr(e, kind)
                name = pb.RejectReason.Name(body.reason)
                reasons[name] += 1
                examples.setdefault(name, body.message.splitlines()[0][:160] if body.message else "")
    if not reasons:
        return ["## Failures", "", "none", ""]
    out = ["## Failures", "", "| reason | count | example |", "|---|---|---|"]
    out += [f"| {r} | {n} | {examples[r]} |" for r, n in reasons.most_common()]
    return out + [""]

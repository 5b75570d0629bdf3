"""Campaign reports: markdown with the comparison, leaderboard, failures, plus a best-so-far plot (PNG)."""
from __future__ import annotations

import io
import json
from collections import Counter

from kfactory import events as ev
from kfactory.v1 import events_pb2 as pb


def best_so_far(events: list[pb.Event], reference_id: str = "") -> list[tuple[int, float]]:
    """(candidates evaluated, best score so far) after each terminal result, in arrival order."""
    n, best, curve = 0, float("inf"), []
    for e in events:
        kind = ev.kind_of(e)
        if kind not in ("measured", "rejected", "compile_failed"):
            continue
        body = getattr(e, kind)
        if body.candidate.origin == "reference":
            continue
        n += 1
        if kind == "measured":
            best = min(best, body.score_s)
        curve.append((n, best))
    return curve


def plot_png(curve: list[tuple[int, float]], reference_s: float | None, title: str) -> bytes:
    # imported here: the clients that use this module's tables should not pay for matplotlib
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    xs = [c[0] for c in curve if c[1] != float("inf")]
    ys = [c[1] * 1e3 for c in curve if c[1] != float("inf")]
    ax.step(xs, ys, where="post", label="best so far")
    if reference_s:
        ax.axhline(reference_s * 1e3, color="grey", linestyle="--", label="reference kernel")
    ax.set_xlabel("candidates evaluated")
    ax.set_ylabel("median time at the first optimisation shape (ms)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g} ms"


def build(events: list[pb.Event]) -> tuple[str, bytes]:
    """(markdown, plot PNG) for one campaign's events."""
    started = next((e.campaign_started for e in events if e.HasField("campaign_started")), None)
    finished = next((e.campaign_finished for e in events if e.HasField("campaign_finished")), None)
    cid = events[0].campaign_id if events else "?"
    spec = started.spec if started else pb.CampaignSpec()
    summary = json.loads(finished.summary_json) if finished and finished.summary_json else {}
    measured = [e.measured for e in events if e.HasField("measured")]
    ref = next((m for m in measured if m.candidate.origin == "reference"), None)
    lines = [f"# Campaign {cid}: {spec.problem} on {spec.target}", "",
             f"- device: {started.device.model if started else '?'}",
             f"- strategy: {spec.strategy}; budget: {spec.budget_candidates} candidates, "
             f"{spec.budget_seconds or 'no'} s; threads: {spec.threads}",
             f"- state: {finished.state if finished else 'running'}"
             + (f" ({finished.reason})" if finished and finished.reason else ""),
             f"- counts: {summary.get('counts', {})}", ""]
    lines += _best_section(summary, events)
    lines += _leaderboard(measured)
    lines += _failures(events)
    lines += _dead_letters(events)
    lines += ["## Best so far", "", "![best so far](plot.png)", ""]
    png = plot_png(best_so_far(events), ref.score_s if ref else None, f"{spec.problem} / {cid}")
    return "\n".join(lines), png


def _best_section(summary: dict, events: list[pb.Event]) -> list[str]:
    best = summary.get("best")
    if not best:
        return ["No candidate was measured.", ""]
    out = ["## Best candidate", "", f"`{best['candidate_id'][:16]}` ({best['origin']}), flags `{best['compile_flags']}`",
           "", "```json", json.dumps(best["params"], indent=1, sort_keys=True), "```", "",
           "## Interleaved comparison (same runner, same threads, A B A B ...)", ""]
    for e in events:
        if not e.HasField("comparison"):
            continue
        c = e.comparison
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
    return out + _verification(best["candidate_id"], events)


def verification_table(checks) -> list[str]:
    """Markdown: one row per check (shape x distribution, regression inputs, the memoisation probe)."""
    out = ["| shape | distribution | seed | max abs err | max rel err | norm rel err | kernel time | passed |",
           "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        out.append(f"| {c.shape} | {c.distribution} | {c.seed} | {c.max_abs_err:.2e} | {c.max_rel_err:.2e} | "
                   f"{c.norm_rel_err:.2e} | {_ms(c.seconds) if c.seconds else '-'} | "
                   + ("yes" if c.passed else f"**no**: {c.note}") + " |")
    return out


def _verification(best_id: str, events: list[pb.Event]) -> list[str]:
    checks = next((e.verified.checks for e in events if e.HasField("verified")
                   and e.verified.candidate.id == best_id), None)
    if checks is None:
        return []
    return ["## Verification of the best candidate", "",
            f"{len(checks)} checks, every output element compared with a float64 reference; inputs drawn "
            "with fresh seeds (re-draw any row from its seed).", "", *verification_table(checks), ""]


def _leaderboard(measured: list[pb.Measured], limit: int = 10) -> list[str]:
    out = ["## Leaderboard", "", "| rank | candidate | origin | params | " +
           " | ".join(t.shape for t in (measured[0].timings if measured else [])) + " |",
           "|---|---|---|---|" + "---|" * (len(measured[0].timings) if measured else 0)]
    for i, m in enumerate(sorted(measured, key=lambda m: m.score_s)[:limit], 1):
        c = m.candidate
        out.append(f"| {i} | `{c.id[:12]}` | {c.origin} | `{c.params_json}` {c.compile_flags} | "
                   + " | ".join(_ms(t.median_s) for t in m.timings) + " |")
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
            rows.append([d.stage, str(d.deliveries), d.reason.splitlines()[0][:200] if d.reason else "", ""])
            if (work := ev.dead_work(d)) is not None:
                waiting.setdefault(work[0], []).append(rows[-1])
        elif kind == "resend_answered":
            a = e.resend_answered
            for row in waiting.get(a.point_id, []):
                row[3] = "sent back, no outcome yet" if a.accepted else f"refused: {a.reason.splitlines()[0][:200]}"
        elif kind in ("measured", "rejected", "compile_failed"):
            body = getattr(e, kind)
            for row in waiting.pop(ev.outcome_point(body), []):
                row[3] = "sent back: " + ("measured" if kind == "measured" else pb.RejectReason.Name(body.reason))
    if not rows:
        return []
    out = ["## Dead letters", "", "| stage | deliveries | reason | then |", "|---|---|---|---|"]
    return out + [f"| {' | '.join(r)} |" for r in rows] + [""]


def _failures(events: list[pb.Event]) -> list[str]:
    reasons = Counter()
    examples = {}
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

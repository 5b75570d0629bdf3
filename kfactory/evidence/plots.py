"""The report's plot: for each optimisation shape, every candidate's time in the order results came, failures
marked by their reason, beside the best-so-far curve at that shape and the reference kernel's time.

`panels` turns a campaign's events into plain data (one ShapePanel per optimisation shape); `render` draws
them, one plot per shape stacked in one PNG (the Evidence service's ReportResponse carries one image)."""
from __future__ import annotations

import io
from dataclasses import dataclass, field

from kfactory.bus import events as ev
from kfactory.bus.origins import Origin
from kfactory.v1 import events_pb2 as pb

#: marker and colour per failure reason, given out in order of the reasons' names (so one campaign's plots agree);
#: no colour of the times (C0), the best-so-far curve (C3) or the reference (grey)
FAIL_MARKERS = ("x", "v", "^", "s", "D", "P", "<", ">", "*", "h", "X", "d")
FAIL_COLOURS = ("C1", "C2", "C4", "C5", "C6", "C8", "C9")


@dataclass
class ShapePanel:
    """What one shape's plot shows. x is the candidate's place in the order results came (1 = the first
    candidate with a result; the reference kernel is not counted: it is the dashed line)."""
    shape: str
    times: list[tuple[int, float]] = field(default_factory=list)     # (x, median s): fully measured candidates
    screened: list[tuple[int, float]] = field(default_factory=list)  # (x, screening median s): screened out
    failures: dict[str, list[int]] = field(default_factory=dict)     # reason name -> x of each failed candidate
    best: list[tuple[int, float]] = field(default_factory=list)      # (x, best median s at this shape so far)
    reference_s: float | None = None


def _shapes(measured: list[pb.Measured]) -> list[str]:
    """The optimisation shapes, in the order the benchmarker timed them (the first is the campaign's
    objective unless the package weighs them: kfactory/judge/objective.py); from full measurements, else from
    screening timings when nothing was measured in full."""
    full = [m for m in measured if not m.screened_out] or measured
    out: list[str] = []
    for m in full:
        out += [t.shape for t in m.timings if t.shape not in out]
    return out


def panels(events: list[pb.Event]) -> list[ShapePanel]:
    """One ShapePanel per optimisation shape (a single one named '' when no candidate was timed at all, so the
    failures still show)."""
    measured = [e.measured for e in events if e.HasField("measured")]
    out = {s: ShapePanel(s) for s in _shapes(measured)} or {"": ShapePanel("")}
    ref = next((m for m in measured if m.candidate.origin == Origin.REFERENCE.of()), None)
    for t in ref.timings if ref and not ref.screened_out else ():
        if t.shape in out:
            out[t.shape].reference_s = t.median_s
    x = 0
    best = {s: float("inf") for s in out}
    for e in events:
        kind = ev.kind_of(e)
        if kind not in ("measured", "rejected", "compile_failed"):
            continue
        body = getattr(e, kind)
        if body.candidate.origin == Origin.REFERENCE.of():
            continue
        x += 1
        if kind != "measured":
            for p in out.values():
                p.failures.setdefault(pb.RejectReason.Name(body.reason), []).append(x)
        for t in body.timings if kind == "measured" else ():
            panel = out.get(t.shape)
            if panel is None:
                continue
            if body.screened_out:
                panel.screened.append((x, t.median_s))
            else:
                panel.times.append((x, t.median_s))
                best[t.shape] = min(best[t.shape], t.median_s)
        for s, p in out.items():  # the curve goes on through failures, to the last result
            if best[s] != float("inf"):
                p.best.append((x, best[s]))
    return list(out.values())


def render(shape_panels: list[ShapePanel], title: str) -> bytes:
    """The panels as one PNG, one plot per shape, stacked."""
    # imported here: the clients that use the report's tables should not pay for matplotlib
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator
    from matplotlib.transforms import blended_transform_factory

    reasons = sorted({r for p in shape_panels for r in p.failures})
    marker = {r: (FAIL_MARKERS[i % len(FAIL_MARKERS)], FAIL_COLOURS[i % len(FAIL_COLOURS)])
              for i, r in enumerate(reasons)}
    fig, axes = plt.subplots(len(shape_panels), 1, figsize=(10, 3.4 * len(shape_panels) + 0.5), dpi=100,
                             squeeze=False)
    for ax, p in zip(axes[:, 0], shape_panels):
        timed = bool(p.times or p.screened)
        if p.times:
            ax.plot(*zip(*[(x, s * 1e3) for x, s in p.times]), "o", ms=4, alpha=0.6, label="candidate")
        if p.screened:
            ax.plot(*zip(*[(x, s * 1e3) for x, s in p.screened]), "o", ms=4, mfc="none", color="C0", alpha=0.6,
                    label="screened out (short timing)")
        if p.best:
            ax.step([x for x, _ in p.best], [s * 1e3 for _, s in p.best], where="post", color="C3",
                    label="best so far")
        if p.reference_s:
            ax.axhline(p.reference_s * 1e3, color="grey", linestyle="--", label="reference kernel")
        if timed:
            ax.set_yscale("log")
            # labels at 1, 2 and 5 of each decade only: a label per minor tick crowds the axis (and is slow)
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_minor_locator(LogLocator(subs="auto"))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            low, high = ax.get_ylim()
            ax.set_ylim(low, high * (high / low) ** 0.18)  # a strip along the top, clear of times, for failures
        # failures have no time: marked in that strip, one marker per reason
        top = blended_transform_factory(ax.transData, ax.transAxes)
        for r in reasons:
            xs = p.failures.get(r, [])
            if xs:
                ax.plot(xs, [0.94] * len(xs), marker[r][0], transform=top, ms=6, color=marker[r][1], linestyle="none",
                        label=f"failed: {r} ({len(xs)})")
        ax.set_ylabel(f"median time at {p.shape} (ms)" if p.shape else "no candidate was timed")
        ax.set_xlabel("candidates in the order their results came")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"shape {p.shape}" if p.shape else "failures")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title)
    # fixed margins in inches rather than tight_layout, which lays every label out twice (most of the time a
    # report takes, on a busy host)
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.08, right=0.74, top=1 - 0.8 / height, bottom=0.5 / height, hspace=0.9 / 3.4)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()

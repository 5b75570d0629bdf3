"""What `kfactory run` shows while a campaign runs: how far the search is (n of the budget), the best kernel so far
and its speedup over the problem's reference kernel, an estimate of the time left, and what the run is doing
(searching, the final comparison, finished).

The figures are computed from a Snapshot, a few numbers read off the planner's campaign state, so that they can
be checked without running a campaign."""
from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from kfactory.judge.order import search_budget

@dataclass(frozen=True)
class Snapshot:
    """One moment of a campaign, as progress reports it."""
    done: int                 # points of the search with an outcome (measured, rejected, failed to compile)
    budget: int               # the candidate budget (0: none)
    elapsed_s: float
    budget_s: float = 0.0     # the wall-clock budget (0: none)
    best_s: float | None = None       # the fastest measured candidate's score (not the reference kernel's)
    best_id: str = ""
    reference_s: float | None = None  # the problem's reference kernel's score, once measured
    comparing: str = ""       # the candidate the final comparison times ("" before it starts)
    compared: int = 0         # optimisation shapes the final comparison has reported for it
    shapes: int = 0           # optimisation shapes in all
    finished: str = ""        # the campaign's end state ("" while it runs)
    device_s: float = 0.0     # the device time the search has held so far
    device_share_s: float = 0.0  # under a device budget, what of it the search may hold (judge.order.search_budget)
    searched_s: float = 0.0   # of device_s, its searched candidates' (not the reference kernel's)


def eta_seconds(done: int, budget: int, elapsed_s: float, budget_s: float = 0.0, device_s: float = 0.0,
                device_share_s: float = 0.0, searched_s: float = 0.0) -> float | None:
    """Seconds of search left, or None while there is no estimate. From the rate so far (`done` outcomes in
    `elapsed_s`) for a candidate budget, capped by what is left of a wall-clock budget (which ends the search
    whatever the rate) and by when the device time left to the search (`device_share_s` less `device_s`) is
    spent at the rate its searched candidates held it so far (`searched_s` in `elapsed_s`: a naive reference
    kernel's device time predicts nothing of theirs). The final comparison comes after, and is not included."""
    estimates = []
    if budget and done > 0 and elapsed_s > 0:
        estimates.append(max(0.0, (budget - done) * elapsed_s / done))
    if budget_s:
        estimates.append(max(0.0, budget_s - elapsed_s))
    if device_share_s and searched_s > 0 and elapsed_s > 0:
        estimates.append(max(0.0, (device_share_s - device_s) * elapsed_s / searched_s))
    return min(estimates) if estimates else None


def duration(seconds: float) -> str:
    """A short human duration: 45s, 3m05s, 1h02m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def speedup(snap: Snapshot) -> float | None:
    """The best candidate's speedup over the reference kernel (reference time / best time), once both are
    measured. (The report's figure comes from the final, interleaved comparison; this one from the search's own
    measurements, which is what exists while it runs.)"""
    if snap.best_s and snap.reference_s:
        return snap.reference_s / snap.best_s
    return None


def best_text(snap: Snapshot) -> str:
    """'best 0.123 ms (4.20x the reference)', or what is missing."""
    if snap.best_s is None:
        return "no best yet"
    sp = speedup(snap)
    return f"best {snap.best_s * 1e3:.3f} ms" + (f" ({sp:.2f}x the reference)" if sp else "")


def eta_text(snap: Snapshot) -> str:
    """'about 1m20s left', 'estimating' before the first outcome, or what the run does once the search is over."""
    if snap.finished:
        return f"finished: {snap.finished}"
    if snap.comparing:
        return comparing_text(snap)
    if snap.budget and snap.done >= snap.budget:
        return "the search is done; the final comparison is next"
    device = f" (device {snap.device_s:.1f} of {snap.device_share_s:.1f} s)" if snap.device_share_s else ""
    if snap.device_share_s and snap.device_s >= snap.device_share_s:
        return f"the search's device time is spent{device}; what is in flight ends, the final comparison is next"
    eta = eta_seconds(snap.done, snap.budget, snap.elapsed_s, snap.budget_s, snap.device_s, snap.device_share_s,
                      snap.searched_s)
    if eta is None:
        return f"time left: estimating{device}"
    return f"about {duration(eta)} left{device}, then the final comparison"


def comparing_text(snap: Snapshot) -> str:
    """What the run does once the search is over: the interleaved timing of the best against the baselines."""
    of = f" ({snap.compared}/{snap.shapes} shapes)" if snap.shapes else ""
    return (f"final comparison: timing {snap.best_id[:12] or 'the best'} against the reference kernel and "
            f"baselines, interleaved{of}")


def count_text(snap: Snapshot) -> str:
    """'12/40', or '12' without a candidate budget."""
    return f"{snap.done}/{snap.budget}" if snap.budget else str(snap.done)


def snapshot(st, shapes: int = 0, device_budget_s: float = 0.0) -> Snapshot:
    """A Snapshot of a planner's CampaignState (kfactory/services/planner/campaign.py); `shapes`: the problem's
    number of optimisation shapes (what the final comparison times); `device_budget_s`: the campaign's device
    budget (judge.order.device_budget; 0: none)."""
    _, best = st.reported()
    ref = st.measured.get(st.reference_id) if st.reference_id else None
    comparing = st.comparing
    compared = sum(1 for c in st.comparisons.values() if c.candidate_id == comparing) if comparing else 0
    return Snapshot(done=st.search_done(), budget=st.spec.budget_candidates, elapsed_s=st.elapsed(),
                    budget_s=st.spec.budget_seconds, best_s=best.score_s if best else None,
                    best_id=best.candidate.id if best else "", reference_s=ref.score_s if ref else None,
                    comparing=comparing, compared=compared, shapes=shapes,
                    finished=st.finished.state if st.finished else "", device_s=st.search_device_s,
                    searched_s=st.searched_device_s,
                    device_share_s=search_budget(st, device_budget_s) if device_budget_s else 0.0)


def line(snap: Snapshot, counts) -> str:
    """The progress line printed when stderr is no terminal: time, n/budget, the stages' counts, the best so far
    and the time left (or what the run is doing)."""
    return (f"{snap.elapsed_s:6.0f}s {count_text(snap)} proposed {counts.proposed} compiled {counts.compiled} "
            f"verified {counts.verified} rejected {counts.rejected + counts.compile_failed} "
            f"measured {counts.measured}; {best_text(snap)}; {eta_text(snap)}")


def table(title: str, snap: Snapshot, counts, in_flight: int) -> Table:
    """The live progress table (stderr is a terminal)."""
    t = Table(title=title, caption=eta_text(snap))
    for col in ("done/budget", "proposed", "compiled", "compile_failed", "verified", "rejected", "measured",
                "in flight", "best (ms)", "vs reference", "elapsed"):
        t.add_column(col, justify="right")
    sp = speedup(snap)
    t.add_row(count_text(snap), *(str(getattr(counts, f)) for f in ("proposed", "compiled", "compile_failed",
                                                                      "verified", "rejected", "measured")),
              str(in_flight), f"{snap.best_s * 1e3:.3f}" if snap.best_s is not None else "-",
              f"{sp:.2f}x" if sp else "-", duration(snap.elapsed_s))
    return t

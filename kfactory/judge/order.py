"""The judge's order (issue 23): which candidates a short timing screens before they are verified, and how much work
the pipeline keeps in flight ahead of the device.

A candidate the search proposed (a template point, a warm start, an agent's kernel) goes from the compiler to the
benchmarker first: a short timing at the objective's screen shape (the first optimisation shape unless the package
weighs them: kfactory/judge/objective.py), and one whose score can be no better than screen_factor x the campaign's
best full measurement is recorded as screened out with that timing. It is never verified, so it can
never be a result: the planner's best, memory's best, the final comparison and export all pass it over. One that
can still rank goes on to the verifier, which judges it in full, and then to the full measurement. Verification
costs a hundred times a kernel's run (bench/verify_cost.py), a screen a few runs.

The reference kernel and hand-written kernels are verified first, as before: their verdict is what a person asked
for (and the reference is what every speedup is measured against).
"""
from __future__ import annotations

import math
import os
import statistics

from kfactory.bus.origins import SEARCHED, is_kind
from kfactory.platform.config import COMPARE_RESERVE_MAX
from kfactory.v1 import events_pb2 as pb
from kfactory.bus.topology import Stage

#: the pipeline's settings before issue 23 (bench/throughput.py --baseline-order runs them side by side with
#: today's): every candidate verified before any timing, one compile at a time, two points in flight, a fresh
#: shared-memory file for every call, outputs compared by numpy, inputs drawn while the device is held, timings
#: ended by their noise alone, and no showdown (the search's best by its own score is the result)
BASELINE = {"judge_order": "verify_first", "compile_workers": 1, "default_parallel": 2, "runner_arenas": False,
            "compare_one_pass": False, "draw_ahead": False, "measure_precision": 0.0, "showdown_contenders": 0}


def screens_first(cand: pb.Candidate, settings, target) -> bool:
    """True when `cand` is screened before it is verified: screening is on and the order says so, the candidate
    is the search's, and its target runs kernels (a replayed target answers both from a recording)."""
    return (settings.judge_order == "screen_first" and settings.screen_max_s > 0
            and is_kind(cand.origin, *SEARCHED) and getattr(target, "screens_first", True))


def first_judge_stage(cand: pb.Candidate, settings, target) -> Stage:
    """Where a compiled candidate goes: the benchmarker's screen, or the verifier."""
    return Stage.BENCHMARKER if screens_first(cand, settings, target) else Stage.VERIFIER


def compile_workers(settings) -> int:
    """Compiles a compiler service runs at once: the setting, or one per core."""
    return settings.compile_workers or os.cpu_count() or 1


def default_parallel(settings, target: str = "", agents: int = 0) -> int:
    """Design points a campaign keeps in flight when its spec does not say: the setting, else on the cpu target
    three (every stage after the compile holds the device there: one point on it, the next drawing its inputs
    ahead of it, one compiling) plus one for each agent persona (an agent's task holds its slot for a model's
    reply), and elsewhere one per core plus two (one on the device, one being verified or measured, the rest
    compiling ahead).

    Every point in flight is one the search chooses knowing less: bench/search_parallel.py measures what that
    costs on the recorded spaces, and bench/throughput.py what fewer points cost the device."""
    if settings.default_parallel:
        return settings.default_parallel
    if target == "cpu":
        return 3 + agents
    return (os.cpu_count() or 1) + 2


#: how long a campaign's best score stays in the claims cache (a week: longer than any campaign runs)
BEST_TTL_S = 7 * 86400


def best_key(campaign: str) -> str:
    """The claims-cache key of a campaign's best full score, the screen's threshold: the benchmarker lowers it as it
    measures; the planner raises it again past a kernel found wrong (CampaignDriver._fix_threshold), which must
    not screen honest kernels out."""
    return f"best:{campaign}"


def best_of(raw: bytes | None) -> float | None:
    """The screen's threshold as best_key holds it; None (no screen) when there is none yet, or none that can be
    a result (the planner writes infinity when every kernel measured was found wrong)."""
    if raw is None:
        return None
    try:
        best = float(raw)
    except ValueError:
        return None
    return best if _positive(best) else None


def screen_key(campaign: str, candidate: str) -> str:
    """The claims-cache key under which a passed screen's median is kept: the benchmarker does not screen that
    candidate again after its verification."""
    return f"screened:{campaign}:{candidate}"


def device_seconds(event: pb.Event) -> float:
    """The device time an event reports its work used (the device lease held: kfactory.platform.service.Held): a
    verification's, a screen's or a measurement's (its screen before the verification included), a rejection's
    at either stage, a showdown's or a final comparison's; none for a measurement reused from the result cache.
    A campaign's device-second budget (device_budget) and its summary add these up."""
    kind = event.WhichOneof("body")
    if kind == "comparison":
        return event.comparison.seconds
    if kind == "verified":
        return event.verified.seconds
    if kind == "measured":
        return 0.0 if event.measured.cached else event.measured.seconds
    if kind == "rejected":
        figures = event.rejected.figures
        return figures.get("verify_seconds", 0.0) + figures.get("device_seconds", 0.0)
    return 0.0


def device_budget(spec: pb.CampaignSpec, configured: float) -> float:
    """A campaign's device-time budget in seconds: its spec's budget_device_seconds (`kfactory run
    --device-seconds`), else the planner's configured one (Settings.device_seconds); 0: none."""
    return spec.budget_device_seconds or configured


def compare_reserve(budget_s: float, costs: list, share: float, showdown: bool = True) -> tuple[float, int]:
    """(device seconds, campaigns it is from): what a device budget of `budget_s` (0: none) keeps for the
    campaign's showdown and final comparison. From `costs` (what recent campaigns' comparisons of the problem held
    the device for: memory's ComparisonCost messages), the median final comparison, and with a `showdown` (not
    off: Settings.showdown_contenders) the median showdown of the campaigns that had one (near ties are common,
    but not the rule: a median over every campaign would keep nothing for one as often as not). Without costs,
    `share` of the budget (Settings.compare_reserve: from 0 campaigns). At most COMPARE_RESERVE_MAX of the
    budget. A cost that is no number, or a negative one, is none."""
    if not budget_s:
        return 0.0, 0
    costs = [c for c in costs if _positive(c.final_s) and math.isfinite(c.showdown_s) and c.showdown_s >= 0]
    if not costs:
        return min(share, COMPARE_RESERVE_MAX) * budget_s, 0
    showdowns = [c.showdown_s for c in costs if c.showdown_s > 0] if showdown else []
    seconds = statistics.median(c.final_s for c in costs) + (statistics.median(showdowns) if showdowns else 0.0)
    return min(seconds, COMPARE_RESERVE_MAX * budget_s), len(costs)


def _positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def room(st, budget_s: float) -> int:
    """Points campaign `st` (a planner CampaignState) may have in flight: its spec's `parallel`; under a device-time
    budget of `budget_s` (device_budget; 0: none) no more than the device time left to the search (the budget
    less the comparisons' reserve, st.compare_reserve_s) pays for at the average device time of its searched
    candidates so far (not the reference kernel's: st.searched_device_s), and one at a time until a first searched
    result gives that average, so a search ends within about one candidate's device time of its share."""
    if not budget_s:
        return st.spec.parallel
    done = st.search_done()
    if not done:
        return 1
    average = st.searched_device_s / done
    return min(st.spec.parallel, max(0, int((search_budget(st, budget_s) - st.device_s) / max(average, 1e-9))))


def search_budget(st, budget_s: float) -> float:
    """The device seconds of a budget of `budget_s` the search of campaign `st` may spend: the rest is its
    comparisons' reserve, at most COMPARE_RESERVE_MAX of the budget however the start's reserve came to be (a
    campaign submitted before its spec kept the planner's budget, resumed under a smaller one)."""
    return budget_s - min(st.compare_reserve_s, COMPARE_RESERVE_MAX * budget_s)


def device_budget_spent(st, budget_s: float) -> bool:
    """True when campaign `st` may propose nothing more for its device time: its search's share spent, or with
    nothing in flight and no room for one more candidate at its average (what is in flight finishes either
    way)."""
    return bool(budget_s) and (st.device_s >= search_budget(st, budget_s)
                               or (not st.in_flight() and not room(st, budget_s)))

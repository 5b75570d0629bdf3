"""A final comparison that finds the campaign's result wrong (Comparison.failed_candidate: its outputs on a fresh
set did not match) makes it no result, as a showdown's does: the planner's driver takes the next best through its
own showdown and final comparison, and the campaign finishes with that one. The real planner's driver on the
in-memory bus; no benchmarker runs: the test answers each request with the Comparison a benchmarker publishes,
folded into the state as the planner folds it from the stream."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kfactory.bus import events as ev
from kfactory.bus import topology
from kfactory.bus.origins import Origin
from kfactory.problems import load_problem
from kfactory.services.planner.campaign import CampaignState
from kfactory.services.planner.driver import FINAL_TRIES
from kfactory.services.planner.summary import campaign_summary
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
import evidence_chain  # noqa: E402

PROBLEM = load_problem("softmax")
SHAPES = [PROBLEM.shape_str(s) for s in PROBLEM.shapes("optimize")]


def _state(cid: str, n: int = 2) -> CampaignState:
    """k1 (0.50 s), k2 (0.51 s) ... kn measured in full, and the reference kernel, each with its artifact."""
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=n, strategy="random", seed=1)
    st = CampaignState(cid, spec, pb.DeviceInfo(), Space(list(PROBLEM.families.values())))
    kernels = [(f"k{i}", 0.49 + 0.01 * i, "template:cpu_c") for i in range(1, n + 1)]
    for k, score, origin in kernels + [("ref", 0.90, Origin.REFERENCE.of())]:
        cand = pb.Candidate(id=k, point_id="p-" + k, campaign_id=cid, origin=origin, params_json="{}")
        for e in evidence_chain.links(cid, cand) + [_measured(cid, cand, score)]:
            assert st.apply(e) == "", e
    return st


def _measured(cid: str, cand: pb.Candidate, score: float) -> pb.Event:
    return ev.make_event(cid, "benchmarker", cand.id, measured=pb.Measured(
        candidate=cand, score_s=score, timings=[evidence_chain.timing(score, s) for s in SHAPES]))


def _answer(req: pb.CompareRequest, wrong: dict[str, str]) -> list[pb.Comparison]:
    """The benchmarker's answer: a showdown in which the search's best stays (its contenders 2% slower, outside
    nobody's noise), or the final comparison at every shape, failed on the first for a kernel in `wrong` (with
    the reason it maps to) and timed at the others, as the benchmarker goes on after a failure."""
    cid = req.candidate.id
    if req.contenders:
        comp = pb.Comparison(shape=SHAPES[0], candidate_id=cid, showdown=True)
        for i, c in enumerate([req.candidate, *req.contenders]):
            comp.entries.append(pb.ComparisonEntry(name=c.id, candidate_id=c.id,
                                                   timing=evidence_chain.timing(0.5 * (1 + 0.02 * i), SHAPES[0])))
        return [comp]
    good = [pb.Comparison(shape=s, candidate_id=cid, speedups={"reference": 1.8}) for s in SHAPES]
    if cid in wrong:
        # with the speedup of the timings taken before the failure, as the benchmarker keeps them
        return [pb.Comparison(shape=SHAPES[0], candidate_id=cid, error=f"{wrong[cid]}: row 3", failed_candidate=cid,
                              failed_reason=wrong[cid], speedups={"reference": 1.5}), *good[1:]]
    return good


async def _compare(planner, st: CampaignState, wrong: dict[str, str], limit_s: float = 60) -> list[str]:
    """Run the driver's comparisons of `st` to their end, answering each request as the benchmarker would; the
    requests sent, in order ("showdown k1", "compare k1", ...). Within `limit_s`: before the fix the driver
    waited out COMPARE_WAIT_S for the shapes of a failed comparison."""
    asked: list[str] = []
    seen = len(await planner.bus.stored(topology.WORK_STREAM, ev.work_subject("benchmarker", st.id)))
    driver = asyncio.ensure_future(planner.driver._compare(st))
    try:
        await asyncio.wait_for(asyncio.gather(driver, _benchmarker_answers(planner.bus, st, wrong, asked, driver,
                                                                           seen)), limit_s)
    finally:
        driver.cancel()   # when the answerer failed: the driver would wait for answers until COMPARE_WAIT_S
    return asked


async def _benchmarker_answers(bus, st: CampaignState, wrong: dict[str, str], asked: list[str], driver,
                               seen: int) -> None:
    """Answer every request the driver sends after the first `seen` on the work stream, until it is done."""
    while not driver.done():
        queued = await bus.stored(topology.WORK_STREAM, ev.work_subject("benchmarker", st.id))
        if len(queued) == seen:
            await asyncio.sleep(0.05)
            continue
        for msg in queued[seen:]:
            req = pb.Event.FromString(msg.data).compare_request
            asked.append(("showdown " if req.contenders else "compare ") + req.candidate.id)
            for i, comp in enumerate(_answer(req, wrong)):
                key = ev.showdown_key(req) if req.contenders else f"{req.candidate.id}:{comp.shape}:{i}"
                assert st.apply(ev.make_event(st.id, "benchmarker", key, comparison=comp)) == ""
            st.changed.set()
        seen = len(queued)


async def test_a_result_the_final_comparison_found_wrong_gives_way_to_the_next_best(planner):
    st = _state("c8")
    asked = await _compare(planner, st, {"k1": "WRONG_RESULT"})
    # k1 stays in its showdown, then fails its final comparison; k2 has no contender left (k1 is no result)
    assert asked == ["showdown k1", "compare k1", "compare k2"]
    assert st.disqualified == {"k1"} and st.best().candidate.id == "k2"
    summary = campaign_summary(st, PROBLEM)
    assert summary["best"]["candidate_id"] == "k2" and summary["found_wrong"] == ["k1"]
    # the result's comparison figures are its own, not those of the kernel found wrong before it
    assert {s: v["speedup_vs_reference"] for s, v in summary["best"]["shapes"].items()} == {s: 1.8 for s in SHAPES}


async def test_a_result_that_holds_is_compared_once(planner):
    st = _state("c9")
    asked = await _compare(planner, st, {})
    assert asked == ["showdown k1", "compare k1"] and not st.disqualified and st.best().candidate.id == "k1"


async def test_a_final_comparison_failed_for_a_reason_not_the_kernels_leaves_the_result(planner):
    """A timeout or a crash there may be the host's (a loaded machine, the runner's arena): no verdict on the kernel."""
    for i, reason in enumerate(("TIMEOUT", "CRASHED")):
        st = _state(f"c1{i}")
        asked = await _compare(planner, st, {"k1": reason})
        assert asked == ["showdown k1", "compare k1"] and not st.disqualified and st.best().candidate.id == "k1"


async def test_final_comparisons_give_the_result_to_the_next_best_at_most_final_tries_times(planner):
    st = _state("c20", n=5)
    asked = await _compare(planner, st, {f"k{i}": "WRONG_RESULT" for i in range(1, 6)}, limit_s=120)
    tried = [f"k{i}" for i in range(1, FINAL_TRIES + 1)]
    assert asked == [f"{what} {k}" for k in tried for what in ("showdown", "compare")]
    # the next best is the result, not compared: the summary shows no comparison rather than another's
    assert st.disqualified == set(tried) and st.best().candidate.id == f"k{FINAL_TRIES + 1}"
    best = campaign_summary(st, PROBLEM)["best"]
    assert all(v["speedup_vs_reference"] is None and v["compared"] == {} for v in best["shapes"].values())


async def test_a_restarted_planner_counts_the_results_found_wrong_before_it(planner):
    """Two results found wrong before a restart (folded from the stream): one more final comparison, not three;
    and the driver asked again (the campaign's work sent back meanwhile) sends nothing more."""
    st = _state("c30", n=5)
    for k in ("k1", "k2"):
        comp = _answer(pb.CompareRequest(candidate=st.candidates[k]), {k: "WRONG_RESULT"})[0]
        assert st.apply(ev.make_event(st.id, "benchmarker", f"{k}:old", comparison=comp)) == ""
    assert st.final_wrong == {"k1", "k2"} and st.best().candidate.id == "k3"
    asked = await _compare(planner, st, {"k3": "WRONG_RESULT", "k4": "WRONG_RESULT"})
    assert asked == ["showdown k3", "compare k3"] and st.best().candidate.id == "k4"
    assert await _compare(planner, st, {"k4": "WRONG_RESULT"}) == []


async def test_past_its_time_budget_a_campaign_compares_a_next_best_only_within_the_grace(planner, monkeypatch):
    """A campaign bounded by time is past its budget when its search ends: the next best is still compared
    within GRACE_S (as the points in flight are waited for), and not after it."""
    from kfactory.services.planner import driver as driver_mod

    st = _state("c40")
    st.spec.budget_seconds = 0.001
    await asyncio.sleep(0.01)
    assert st.expired()
    assert await _compare(planner, st, {"k1": "WRONG_RESULT"}) == ["showdown k1", "compare k1", "compare k2"]
    monkeypatch.setattr(driver_mod, "GRACE_S", 0.0)
    st = _state("c41")
    st.spec.budget_seconds = 0.001
    await asyncio.sleep(0.01)
    assert await _compare(planner, st, {"k1": "WRONG_RESULT"}) == ["showdown k1", "compare k1"]
    assert st.best().candidate.id == "k2" and st.disqualified == {"k1"}


async def test_a_next_best_is_compared_only_while_device_time_is_left(planner, monkeypatch):
    """Each comparison reports the device time it held (Comparison.seconds); the campaign counts it against its
    device budget: a next best after a result found wrong is compared while some is left, not after."""
    import test_final_compare_wrong as me

    answer = me._answer

    def timed(req, wrong):   # the benchmarker's answers, each having held the device 0.5 s
        out = answer(req, wrong)
        for comp in out:
            comp.seconds = 0.5
        return out

    monkeypatch.setattr(me, "_answer", timed)
    for budget, asked in ((10.0, ["showdown k1", "compare k1", "compare k2"]), (1.0, ["showdown k1", "compare k1"])):
        st = _state(f"c5{int(budget)}")
        st.spec.budget_device_seconds = budget
        assert await _compare(planner, st, {"k1": "WRONG_RESULT"}) == asked
        # the showdown's 0.5 s, the final comparison's 0.5 s at each shape, and k2's where it was compared
        assert st.compare_device_s == st.device_s == 0.5 * (1 + len(SHAPES) * (len(asked) - 1))
        assert st.best().candidate.id == "k2"


async def test_a_result_learned_wrong_during_its_final_comparison_gives_way_not_past_the_grace(planner,
                                                                                                 monkeypatch):
    """k1 is found wrong by another campaign while its own final comparison runs (its answer: k1 holds). It takes
    no FINAL_TRIES try, but past the time budget's grace the next best is not compared, as after any final
    comparison whose result turned out wrong (within the grace it is: the test above)."""
    from kfactory.services.planner import driver as driver_mod
    import test_final_compare_wrong as me

    answer = me._answer

    def learned(req, wrong):
        if not req.contenders and req.candidate.id == "k1":
            st.learn_wrong("k1", "cOther")
        return answer(req, wrong)

    monkeypatch.setattr(me, "_answer", learned)
    monkeypatch.setattr(driver_mod, "GRACE_S", 0.0)
    st = _state("c60")
    st.spec.budget_seconds = 0.001
    await asyncio.sleep(0.01)
    assert await _compare(planner, st, {}) == ["showdown k1", "compare k1"]
    assert st.final_wrong == set() and st.known_wrong == {"k1": "cOther"} and st.best().candidate.id == "k2"


def test_the_summary_tells_one_showdowns_and_one_results_final_comparisons_device_time():
    """What a later campaign's device budget keeps for its comparisons (judge.order.compare_reserve): the largest
    showdown (k1's, asked twice: 3 s and 1 s) and the largest result's final comparison (k2's 2.5 s at each shape,
    not k1's, cut short when its first shape found it wrong), each its own, not the campaign's sum."""
    st = _state("cs", 2)
    asked = [(pb.Comparison(shape=SHAPES[0], candidate_id="k1", showdown=True), 3.0),
             (pb.Comparison(shape=SHAPES[0], candidate_id="k1", showdown=True), 1.0),
             (pb.Comparison(shape=SHAPES[0], candidate_id="k1", error="WRONG_RESULT: row 3", failed_candidate="k1",
                            failed_reason=pb.WRONG_RESULT), 2.0),
             (pb.Comparison(shape=SHAPES[0], candidate_id="k2", showdown=True), 2.0),
             *[(pb.Comparison(shape=s, candidate_id="k2", speedups={"reference": 1.8}), 2.5) for s in SHAPES]]
    for i, (comp, seconds) in enumerate(asked):
        comp.seconds = seconds
        assert st.apply(ev.make_event("cs", "benchmarker", f"answer{i}", comparison=comp)) == ""
    summary = campaign_summary(st, PROBLEM)
    assert st.final_wrong == {"k1"} and summary["best"]["candidate_id"] == "k2"
    assert summary["device_seconds_comparisons"] == 8.0 + 2.5 * len(SHAPES)
    assert (summary["device_seconds_showdown"], summary["device_seconds_final_comparison"]) == \
        (4.0, 2.5 * len(SHAPES))

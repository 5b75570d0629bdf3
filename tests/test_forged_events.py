"""Events the planner and memory must not believe (issue 22): a body of another kind than its subject, results
with no evidence chain or with figures no measurement can have, a forged end of a live campaign; and the
campaign clock and spec ranges that forged or careless input could break."""
from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest

from evidence_chain import chain, links, measured, timing
from kfactory.bus import events as ev
from kfactory.evidence import trust
from kfactory.platform.security import PERMISSIONS, publish_subjects
from kfactory.bus.topology import subject_matches
from kfactory.problems import load_problem
from kfactory.services.memory.archive import Archive
from kfactory.services.planner.campaign import CampaignState
from kfactory.platform.spec_ranges import RANGES, spec_errors
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb

CID = "c1"


def _cand(cid: str = "k1", target: str = "cpu") -> pb.Candidate:
    return pb.Candidate(id=cid, campaign_id=CID, point_id=f"p-{cid}", problem="softmax", target=target,
                        origin="template:cpu_c", params_json="{}")


def _state() -> CampaignState:
    spec = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=3, strategy="random", seed=1)
    return CampaignState(CID, spec, pb.DeviceInfo(), Space(list(load_problem("softmax").families.values())))


def _forged(kind: str) -> pb.Event:
    """A measurement of candidate k1 (whose chain is real) that no benchmarker could have published."""
    cand = _cand()
    good = measured(CID, cand, 0.5).measured
    m = pb.Measured()
    m.CopyFrom(good)
    if kind in ("score -1", "score nan", "score inf", "score 1e-300"):
        m.score_s = m.timings[0].median_s = float(kind.split()[1])
    elif kind == "negative samples":
        m.timings[0].samples = -5
    elif kind == "no timings":
        del m.timings[:]
    elif kind == "score is not the median":
        m.score_s = 0.001
    elif kind == "a device of another target":
        m.device.CopyFrom(pb.DeviceInfo(target="cuda", model="NVIDIA H100 (fake)"))
    producer = "cli" if kind == "not the benchmarker" else "benchmarker"
    return ev.make_event(CID, producer, cand.id, measured=m)


FORGERIES = ["score -1", "score nan", "score inf", "score 1e-300", "negative samples", "no timings",
             "score is not the median", "a device of another target", "not the benchmarker"]


def test_an_event_whose_body_is_not_its_subjects_kind_is_refused():
    """Permissions are per subject: a compiler's `compiled` subject must not carry a campaign's end."""
    fin = ev.make_event(CID, "compiler", "finish", campaign_finished=pb.CampaignFinished(state="completed"))
    with pytest.raises(ev.BadEvent, match="is for 'compiled' events, but the event's body is 'campaign_finished'"):
        ev.decode_event(fin.SerializeToString(), ev.event_subject("compiled", CID))
    assert ev.decode_event(fin.SerializeToString(), ev.event_subject("campaign_finished", CID)) == fin
    # work subjects carry stage inputs of any kind
    assert ev.decode_event(fin.SerializeToString(), ev.work_subject("coder", CID)) == fin


def test_only_the_planner_may_publish_a_campaigns_start_and_end():
    for role in PERMISSIONS:
        allowed = publish_subjects(role)
        for kind in ("campaign_started", "campaign_finished"):
            may = any(subject_matches(p, ev.event_subject(kind, CID)) for p in allowed)
            assert may == (role == "planner"), (role, kind)
    assert trust.producers("campaign_finished") == {"planner"}
    assert trust.producers("measured") == {"benchmarker"}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_the_planner_believes_no_forged_measurement(forgery):
    st = _state()
    for e in links(CID, _cand()):
        assert st.apply(e) == ""
    why = st.apply(_forged(forgery))
    assert why, forgery
    assert st.counts.measured == 0 and st.best() is None and not st.measured
    assert st.apply(measured(CID, _cand(), 0.5)) == ""  # the real one, with the same id, still counts
    assert st.best().score_s == 0.5


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
def test_the_planner_believes_no_comparison_whose_device_time_no_lease_can_have(seconds):
    """A comparison's device time counts against the campaign's device budget (Comparison.seconds): a negative
    one would give budget back, a NaN would make the budget's arithmetic fail."""
    st = _state()
    for e in chain(CID, _cand(), 0.5):
        assert st.apply(e) == ""
    comp = pb.Comparison(shape="4x4", candidate_id="k1", speedups={"reference": 1.5}, seconds=seconds)
    assert "device time" in st.apply(ev.make_event(CID, "benchmarker", "k1:4x4", comparison=comp))
    assert st.device_s == 0.0 and not st.comparisons
    comp.seconds = 0.25
    assert st.apply(ev.make_event(CID, "benchmarker", "k1:4x4", comparison=comp)) == ""
    assert st.compare_device_s == st.device_s == 0.25


@pytest.mark.parametrize("reserve", [-1.0, math.nan, math.inf])
def test_the_planner_believes_no_start_whose_comparisons_reserve_no_budget_can_have(reserve):
    """A start's reserve is device time its search leaves for the comparisons (CampaignStarted.compare_reserve_s):
    a negative one would let the search spend past its budget, a NaN would make the budget never end it."""
    st = _state()
    start = pb.CampaignStarted(spec=st.spec, compare_reserve_s=reserve)
    assert "reserve" in st.apply(ev.make_event(CID, "planner", "start", campaign_started=start))
    assert st.compare_reserve_s == 0.0
    start.compare_reserve_s = 2.5
    assert st.apply(ev.make_event(CID, "planner", "start", campaign_started=start)) == ""
    assert st.compare_reserve_s == 2.5


def test_the_planner_believes_a_result_only_after_its_chain_in_order():
    st = _state()
    cand = _cand()
    created, compiled, verified = links(CID, cand)
    assert "never verified" in st.apply(measured(CID, cand, 0.5))
    assert "never created" in st.apply(compiled)
    assert "never compiled" in st.apply(verified)
    for e in (created, compiled, verified):
        assert st.apply(e) == ""
    comp = ev.make_event(CID, "benchmarker", "cmp", comparison=pb.Comparison(
        shape="4x4", candidate_id=cand.id, speedups={"reference": 2.0}))
    assert "never measured" in st.apply(comp)
    assert st.apply(measured(CID, cand, 0.5)) == ""
    assert st.apply(comp) == "" and st.comparisons["4x4"].speedups["reference"] == 2.0
    assert st.counts.measured == 1 and st.best().score_s == 0.5


def test_a_forged_end_does_not_end_a_campaign_the_planner_drives():
    st = _state()
    st.driven = True
    forged = ev.make_event(CID, "planner", "finish", campaign_finished=pb.CampaignFinished(
        state="completed", counts=pb.Counts(proposed=5, measured=1_000_000_000)))
    assert "driven by this planner" in st.apply(forged)
    assert st.finished is None and st.state_name() == "running"
    assert "negative counts: proposed" in st.apply(ev.make_event(CID, "planner", "finish", campaign_finished=(
        pb.CampaignFinished(state="completed", counts=pb.Counts(proposed=-1)))))
    own = ev.make_event(CID, "planner", "finish", campaign_finished=pb.CampaignFinished(state="completed"))
    assert st.apply(own, own=True) == "" and st.state_name() == "completed"
    # replaying the stream (not driving yet), the planner believes the end it once published, and only that
    replayed = _state()
    other = ev.make_event(CID, "planner", "forged", campaign_finished=pb.CampaignFinished(state="completed"))
    assert "is not c1:campaign_finished:finish" in replayed.apply(other) and replayed.finished is None
    assert replayed.apply(own) == "" and replayed.state_name() == "completed"


def test_the_campaign_clock_is_the_started_events_not_the_planners():
    """A restarted planner folds the CampaignStarted of a campaign that began 30 s ago: 30 s have elapsed, not
    0; once it finished, its elapsed time stops at its CampaignFinished."""
    st = _state()
    t0 = time.time_ns() - 30 * 10**9
    started = ev.make_event(CID, "planner", "start", campaign_started=pb.CampaignStarted(spec=st.spec))
    started.time_unix_ns = t0
    st.apply(started)
    assert 29.5 < st.elapsed() < 40
    fin = ev.make_event(CID, "planner", "finish", campaign_finished=pb.CampaignFinished(state="completed"))
    fin.time_unix_ns = t0 + 12 * 10**9
    st.apply(fin)
    assert st.elapsed() == pytest.approx(12.0)


def test_memory_keeps_forged_results_out_of_the_evidence(tmp_path):
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        archive.record(ev.make_event(CID, "planner", "start", campaign_started=pb.CampaignStarted(
            spec=pb.CampaignSpec(problem="softmax", target="cpu"))))
        for e in chain(CID, _cand(), 0.5):
            assert archive.record(e)
        fakes = [_forged(f) for f in FORGERIES]
        for i, e in enumerate(fakes):
            e.id = f"{CID}:measured:fake{i}"
            assert not archive.record(e)
        stranger = _cand("k9")  # no chain at all: held, never evidence
        assert not archive.record(measured(CID, stranger, 1e-6))
        assert archive.best("softmax")[0].score_s == 0.5
        assert [r[0] for r in archive.q("SELECT score_s FROM measurements")] == [0.5]
        assert len(archive.refused()) == len(FORGERIES)
        assert [w for _, w in archive.held(CID)] == [
            "waits for candidate_created, compiled, verified of candidate k9"]
        assert not archive.q("SELECT 1 FROM events WHERE kind='' OR id LIKE '%fake%' OR candidate='k9'")
    finally:
        archive.close()


def test_memory_archives_a_result_that_came_before_its_chain_once_the_chain_is_in(tmp_path):
    """After a restart memory may meet a measurement before its verification: it is held, then archived."""
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        cand = _cand()
        *first, last = chain(CID, cand, 0.25)
        comp = ev.make_event(CID, "benchmarker", "cmp", comparison=pb.Comparison(
            shape="4x4", candidate_id=cand.id, entries=[pb.ComparisonEntry(name="candidate", timing=timing(0.25))]))
        assert not archive.record(comp) and not archive.record(last)
        assert not archive.q("SELECT 1 FROM measurements")
        for e in first:
            archive.record(e)
        assert archive.q("SELECT score_s FROM measurements") == [(0.25,)]
        assert archive.q("SELECT COUNT(*) FROM events WHERE kind IN ('measured', 'comparison')") == [(2,)]
        assert archive.held(CID) == []
    finally:
        archive.close()


def test_every_numeric_field_of_a_campaign_spec_has_a_range():
    numeric = {f.name for f in pb.CampaignSpec.DESCRIPTOR.fields
               if f.type not in (f.TYPE_STRING, f.TYPE_MESSAGE, f.TYPE_BOOL) and not f.is_repeated}
    assert numeric == set(RANGES)


@pytest.mark.parametrize("field, value", [("parallel", -1), ("budget_seconds", math.nan),
                                          ("budget_seconds", math.inf), ("warm_start", -1), ("threads", -2),
                                          ("budget_candidates", -1), ("budget_seconds", -3.0)])
def test_a_spec_field_out_of_range_is_refused_naming_it(field, value):
    values = {name: 0 for name in RANGES} | {field: value}
    (err,) = spec_errors(values)
    assert err.startswith(f"{field} ({RANGES[field].flag}): {value!r} is out of range")


@pytest.mark.parametrize("argv", [["submit", "softmax", "--warm", "-1"], ["submit", "softmax", "--seed", "-1"],
                                  ["submit", "softmax", "--budget", "1000000000000"],
                                  ["submit", "softmax", "--budget", "0", "--seconds", "nan"],
                                  ["submit", "softmax", "--parallel", "-1"],
                                  ["run", "softmax", "--seconds", "inf"], ["priors", "softmax", "--limit", "-5"]])
def test_the_cli_refuses_a_number_out_of_range_in_one_line(argv):
    out = subprocess.run([sys.executable, "-m", "kfactory.cli.main", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr and "is out of range: give a number from" in out.stderr, out.stderr
    assert f"argument {argv[-2]}:" in out.stderr.splitlines()[-1]


async def test_bytes_on_a_lifecycle_subject_neither_start_nor_end_a_campaign(nats_url):
    """Work consumers ask the stream whether a campaign started, the dead-letter CLI whether it finished: a
    message there that is no event, or not the planner's, must not answer for the planner."""
    from kfactory.bus.jetstream import NatsBus

    bus = await NatsBus.connect(nats_url, "test")
    try:
        js = bus.js
        await js.publish(ev.event_subject("campaign_started", "cx"), b"")
        await js.publish(ev.event_subject("campaign_started", "cx"), ev.make_event(
            "cx", "coder", "start", campaign_started=pb.CampaignStarted()).SerializeToString())
        assert not await bus.campaign_started("cx")
        real = ev.make_event("cy", "planner", "finish", campaign_finished=pb.CampaignFinished(state="cancelled"))
        await js.publish(ev.event_subject("campaign_finished", "cy"), b"\x08garbage")
        await js.publish(ev.event_subject("campaign_finished", "cy"), real.SerializeToString())
        await js.publish(ev.event_subject("campaign_finished", "cy"), b"")
        assert (await bus.campaign_finished("cy")).state == "cancelled"
        assert await bus.campaign_finished("cx") is None
    finally:
        await bus.close()

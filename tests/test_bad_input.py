"""Bad input at every boundary of a running factory (six services in one process over a real nats-server): each
refused with a reason that says what to fix, nothing crashes, nothing is lost, and a real campaign still runs."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from kfactory.bus import events as ev
from kfactory.platform.app import start_services
from kfactory.bus.deadletters import list_dead_letters
from kfactory.services.planner import campaign as campaign_mod
from kfactory.services.planner.service import SpecError
from kfactory.v1 import events_pb2 as pb

sys.path.insert(0, str(Path(__file__).parent))
from tuning_synth import write_spaces  # noqa: E402


@pytest.fixture
def space(tmp_path) -> Path:
    return write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]


def _spec(space: Path, **kw) -> pb.CampaignSpec:
    base = dict(problem=f"replay:{space}", target=f"replay:{space}", strategy="random", budget_candidates=6,
                parallel=3, seed=5, warm_start=0)
    return pb.CampaignSpec(**{**base, **kw})


async def _until_finished(running, cid: str, timeout: float = 60) -> pb.CampaignFinished:
    st = running.services["planner"].campaigns[cid]
    async with asyncio.timeout(timeout):
        while st.finished is None:
            assert running.failed() is None, running.failed()
            await asyncio.sleep(0.1)
    return st.finished


def memory_rows(running, sql: str) -> list:
    return running.services["memory"].archive.q(sql)


async def _dead_letters(bus, campaign: str, want: int, timeout: float = 20) -> list[pb.DeadLetter]:
    """The dead letters of a campaign ('*' for any), once there are `want` of them."""
    async with asyncio.timeout(timeout):
        while len(out := await list_dead_letters(bus, campaign=None if campaign == "*" else campaign)) < want:
            await asyncio.sleep(0.2)
    return [r.letter for r in out]


async def test_work_of_a_cancelled_campaign_is_not_done_and_says_why(bus_settings, space):
    """Found by a probe of the services: a cancelled campaign's queued work went on (compiled, verified, measured)
    and reached the leaderboard after its counts stopped. Work a stage takes up after the cancellation is
    dead-lettered with the cancellation's reason (cause campaign_cancelled), and nothing of it is measured."""
    running = await start_services(bus_settings, grpc=False)
    try:
        planner = running.services["planner"]
        cid = await planner.submit(_spec(space, budget_candidates=200, parallel=1))
        await planner.cancel(cid, "the user pressed Ctrl-C")
        finished = await _until_finished(running, cid)
        assert finished.state == "cancelled"
        measured = memory_rows(running, f"SELECT COUNT(*) FROM measurements WHERE campaign='{cid}'")[0][0]
        cand = pb.Candidate(id="c" * 64, campaign_id=cid, problem=f"replay:{space}", target=f"replay:{space}",
                            family="recorded", point_id="late", language="replay", source_digest="0" * 64)
        late = ev.make_event(cid, "test", cand.id, candidate_created=pb.CandidateCreated(candidate=cand))
        await running.ctx.bus.js.publish(ev.work_subject("compiler", cid), late.SerializeToString(),
                                         headers={"Nats-Msg-Id": "late:compiler"})
        letters = [d for d in await _dead_letters(running.ctx.bus, cid, 1) if d.cause == pb.CAMPAIGN_CANCELLED]
        assert len(letters) == 1 and letters[0].stage == "compiler", letters
        assert letters[0].reason == (f"campaign {cid} was cancelled (the user pressed Ctrl-C): work of it not begun "
                                     "is not done"), letters[0].reason
        await asyncio.sleep(1.0)   # had the stages gone on, the late candidate would be measured by now
        assert memory_rows(running, f"SELECT COUNT(*) FROM measurements WHERE campaign='{cid}'")[0][0] == measured
        assert running.failed() is None
    finally:
        await running.shutdown()


async def test_bad_work_messages_are_dead_lettered_with_what_to_fix(bus_settings, space):
    settings = bus_settings.model_copy(update={"max_event_bytes": 4096})
    running = await start_services(settings, grpc=False)
    try:
        planner = running.services["planner"]
        cid = await planner.submit(_spec(space))
        js = running.ctx.bus.js
        cand = pb.Candidate(id="b" * 64, campaign_id=cid, problem=f"replay:{space}", target=f"replay:{space}",
                            family="recorded", point_id="bad", language="replay", source_digest="0" * 64)

        async def send(stage: str, data: bytes, campaign: str = cid, key: str = "") -> None:
            await js.publish(ev.work_subject(stage, campaign), data, headers={"Nats-Msg-Id": f"bad:{stage}:{key}"})

        created = ev.make_event(cid, "test", cand.id, candidate_created=pb.CandidateCreated(candidate=cand))
        await send("compiler", b"\x08\x96\x01 garbage", key="garbage")
        await send("compiler", pb.Event(id="x", campaign_id=cid).SerializeToString(), key="nobody")
        big = pb.Candidate()
        big.CopyFrom(cand)
        big.params_json = "x" * 8000  # over this factory's 4096-byte limit
        await send("compiler", ev.make_event(cid, "test", "big", candidate_created=pb.CandidateCreated(
            candidate=big)).SerializeToString(), key="big")
        await send("compiler", created.SerializeToString(), campaign="cother", key="mismatch")
        stranger = ev.make_event("cnobody", "test", cand.id, candidate_created=pb.CandidateCreated(candidate=cand))
        await send("compiler", stranger.SerializeToString(), campaign="cnobody", key="stranger")
        bad_launch = pb.Candidate()
        bad_launch.CopyFrom(cand)
        bad_launch.launch_json = "{grid: 1"
        await send("verifier", ev.make_event(cid, "test", "launch", compiled=pb.Compiled(
            candidate=bad_launch)).SerializeToString(), key="launch")
        # and on the events stream, which the planner and memory follow: garbage, and a result for no campaign
        await js.publish(ev.event_subject("measured", cid), b"\xff\xfe not an event")
        await js.publish(ev.event_subject("measured", "cnobody"), ev.make_event(
            "cnobody", "test", cand.id, measured=pb.Measured(candidate=cand, score_s=1e-9)).SerializeToString())
        finished = await _until_finished(running, cid)
        assert finished.state == "completed"
        letters = await _dead_letters(running.ctx.bus, "*", 6)
        reasons = [d.reason for d in letters]
        for expected in ("malformed protobuf", "no body: set one of the fields", "over the 4096-byte limit",
                         "names another campaign", "unknown campaign 'cnobody'", "launch_json is not JSON"):
            assert sum(expected in r for r in reasons) == 1, (expected, reasons)
        # each with its cause: bytes no stage can read, and a campaign with no start on the events stream
        assert sorted(d.cause for d in letters) == sorted([pb.UNDECODABLE] * 5 + [pb.UNKNOWN_CAMPAIGN]), \
            [(d.reason[:60], d.cause) for d in letters]
        assert [d.cause for d in letters if "unknown campaign 'cnobody'" in d.reason] == [pb.UNKNOWN_CAMPAIGN]
        assert running.failed() is None  # nothing crashed
        assert finished.counts.proposed == 6 and finished.counts.measured >= 3  # nothing lost
        assert "cnobody" not in planner.campaigns  # a result for no campaign starts nothing
        assert not memory_rows(running, "SELECT 1 FROM measurements WHERE campaign='cnobody'")  # nor is evidence
        memory = running.services["memory"]  # and the campaign's report shows its dead letters with the reasons
        async with asyncio.timeout(10):
            while memory.archive.q("SELECT COUNT(*) FROM events WHERE campaign=? AND kind='dead_letter'",
                                   (cid,))[0][0] < 4:
                await asyncio.sleep(0.1)
        md, _ = memory.report(cid)
        section = md.split("## Dead letters", 1)[1].split("##", 1)[0]
        assert section.count("| compiler |") == 3 and "launch_json is not JSON" in section, section
    finally:
        await running.shutdown()


async def test_submit_refuses_malformed_specs_naming_the_field(bus_settings, space, tmp_path):
    settings = bus_settings.model_copy(update={"max_source_bytes": 1024})
    running = await start_services(settings, names=("planner",), grpc=False)
    try:
        planner = running.services["planner"]
        cases = {
            "problem:": _spec(space, problem=str(tmp_path / "nowhere")),
            "target:": _spec(space, target="tpu"),
            "strategy: unknown 'telepathy'": _spec(space, strategy="telepathy"),
            "budget_candidates (--budget): -1 is out of range": _spec(space, budget_candidates=-1),
            # specs that would never end: a negative parallel is always "in flight enough", a NaN or infinite
            # time budget is never spent
            "parallel (--parallel): -1 is out of range": _spec(space, parallel=-1),
            "budget_seconds (--seconds): nan is out of range": _spec(space, budget_candidates=0,
                                                                     budget_seconds=float("nan")),
            "budget_seconds (--seconds): inf is out of range": _spec(space, budget_candidates=0,
                                                                     budget_seconds=float("inf")),
            "warm_start (--warm): -1 is out of range": _spec(space, warm_start=-1),
            "manual_sources[evil].compile_flags: flag '-wrapper'": _spec(
                space, target="cpu", problem="softmax", manual_sources=[pb.ManualSource(
                    name="evil", source="void kernel(void) {}", compile_flags="-O2 -wrapper /bin/sh,-c,touch")]),
            # one name is one origin and one design point: the second kernel would be taken for the first
            "manual_sources (--manual): two kernels are named 'mine'": _spec(space, manual_sources=[
                pb.ManualSource(name="mine", source="void kernel(void) {}"),
                pb.ManualSource(name="mine", source="void kernel(void) { }")]),
            "manual_sources (--manual): the name 'my kernel' is not": _spec(
                space, manual_sources=[pb.ManualSource(name="my kernel", source="void kernel(void) {}")]),
            "manual_sources (--manual): the name '' is not": _spec(
                space, manual_sources=[pb.ManualSource(name="", source="void kernel(void) {}")]),
            "budget: give a candidate count": _spec(space, budget_candidates=0),
            "families: ['nope']": _spec(space, families=["nope"]),
            "manual_sources[huge]: 2000 bytes, over the 1024-byte limit": _spec(
                space, manual_sources=[pb.ManualSource(name="huge", source="x" * 2000)]),
            # each source under the limit, all of them together over what one event may carry
            "manual_sources: the spec is": _spec(
                space, manual_sources=[pb.ManualSource(name=f"s{i}", source="x" * 1000) for i in range(600)]),
            # timing rounds and the showdown after the search are an engine campaign's alone
            "timing_rounds, showdown_rounds: problem softmax is a kernel problem": _spec(
                space, target="cpu", problem="softmax", showdown_rounds=3),
            "showdown_rounds (--showdown): -1 is out of range": _spec(space, showdown_rounds=-1),
            "showdown_margin (--showdown-margin): 0.5 is below 1": _spec(
                space, target="cpu", problem="engine:tiny-llama", strategy="descent", showdown_rounds=3,
                showdown_margin=0.5),
        }
        for why, spec in cases.items():
            with pytest.raises(SpecError) as err:
                await planner.submit(spec)
            assert why in str(err.value), (why, str(err.value))
        assert not planner.campaigns  # none of them started
    finally:
        await running.shutdown()


async def test_an_oversized_source_is_rejected_by_the_coder_not_compiled(bus_settings, space):
    """A proposal that bypassed the planner's check (an agent's or a template's output is only known at the
    coder) is rejected with the size and the limit; the campaign goes on."""
    settings = bus_settings.model_copy(update={"max_source_bytes": 1024})
    running = await start_services(settings, grpc=False)
    try:
        cid = await running.services["planner"].submit(_spec(space))
        pp = pb.PointProposed(point_id="oversized", family="manual", params_json="{}", problem=f"replay:{space}",
                              target=f"replay:{space}", origin="manual:huge",
                              manual=pb.ManualSource(name="huge", source="y" * 5000, language="replay"))
        await running.ctx.bus.send_work("coder", ev.make_event(cid, "test", "oversized", point_proposed=pp))
        await _until_finished(running, cid)
        archive = running.services["memory"].archive
        async with asyncio.timeout(10):
            while not (rows := archive.q("SELECT reason, message FROM outcomes WHERE point_id='oversized'")):
                await asyncio.sleep(0.1)
        assert rows == [("INVALID_POINT", "the source is 5000 bytes, over the 1024-byte limit "
                                          "(KFACTORY_MAX_SOURCE_BYTES): write a smaller kernel")]
        assert not archive.q("SELECT 1 FROM events WHERE kind='candidate_created' AND campaign=? AND "
                             "candidate IN (SELECT candidate FROM outcomes WHERE point_id='oversized')", (cid,))
    finally:
        await running.shutdown()


class _Exploding:
    """A strategy that breaks: in construction, or at its first tell."""

    def __init__(self, when: str):
        if when == "construction":
            raise RuntimeError("boom in __init__")
        self.seen: set = set()
        self.asked = 0

    def ask(self):
        from kfactory.strategies import Point
        self.asked += 1
        return Point("recorded", '{"block_x": 64, "block_y": %d, "tile": 2, "shmem": 1}' % self.asked)

    def tell(self, point, score):
        raise ZeroDivisionError("boom in tell")


@pytest.mark.parametrize("when", ["construction", "tell"])
async def test_a_strategy_that_raises_fails_its_campaign_not_the_planner(bus_settings, space, monkeypatch, when):
    real = campaign_mod.make_strategy
    monkeypatch.setattr(campaign_mod, "make_strategy",
                        lambda name, *a, **k: _Exploding(when) if name == "grid" else real(name, *a, **k))
    running = await start_services(bus_settings, grpc=False)
    try:
        planner = running.services["planner"]
        bad = await planner.submit(_spec(space, strategy="grid"))
        finished = await _until_finished(running, bad)
        assert finished.state == "failed"
        assert finished.reason.startswith(f"strategy 'grid' failed in {when}: ")
        assert ("RuntimeError: boom in __init__" if when == "construction" else "ZeroDivisionError") in finished.reason
        good = await planner.submit(_spec(space))  # the planner goes on serving
        assert (await _until_finished(running, good)).state == "completed"
    finally:
        await running.shutdown()


@pytest.mark.parametrize("env, says", [
    ({"KFACTORY_HANDLER_TIMEOUT_S": "soon"}, "KFACTORY_HANDLER_TIMEOUT_S: Input should be a valid number"),
    ({"KFACTORY_MAX_DELIVER": "0"}, "KFACTORY_MAX_DELIVER: Input should be greater than or equal to 1"),
    # the timings' own: these gave one-sample timings, or timings without end, and a "completed" campaign
    ({"KFACTORY_MEASURE_MAX_S": "-1"}, "KFACTORY_MEASURE_MAX_S: Input should be greater than 0"),
    ({"KFACTORY_MEASURE_MIN_S": "nan"}, "KFACTORY_MEASURE_MIN_S: Input should be a finite number"),
    ({"KFACTORY_COMPARE_MAX_S": "inf"}, "KFACTORY_COMPARE_MAX_S: Input should be a finite number"),
    ({"KFACTORY_MEASURE_MIN_SAMPLES": "-4"}, "KFACTORY_MEASURE_MIN_SAMPLES: Input should be greater than or equal"),
    ({"KFACTORY_MEASURE_NOISE": "-1"}, "KFACTORY_MEASURE_NOISE: Input should be greater than or equal to 0"),
    ({"KFACTORY_SCREEN_MAX_S": "inf"}, "KFACTORY_SCREEN_MAX_S: Input should be a finite number"),
    ({"KFACTORY_LLM_BASE_URL": "http://127.0.0.1:9/v1", "KFACTORY_LLM_MODEL": "m", "KFACTORY_HANDLER_TIMEOUT_S": "60"},
     "handler_timeout_s (60 s) must exceed an agent's worst case with these llm_* settings (1320 s"),
    ({"KFACTORY_ENGINE_OBJECT_CACHE": "objects"},
     "KFACTORY_ENGINE_OBJECT_CACHE: Value error, objects must be an absolute path"),
])
def test_a_bad_setting_is_named_with_what_it_needs_not_a_traceback(monkeypatch, capsys, env, says):
    from kfactory.cli.main import EXIT_USAGE, main
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["status"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("kfactory: bad configuration:\n") and says in err and "Traceback" not in err


@pytest.mark.parametrize("argv, env, says", [
    (["check", "softmax", "--source", "k.c", "--threads", "0"], {},
     "  --threads: Input should be greater than or equal to 1"),
    (["check", "softmax", "--source", "k.c"], {"KFACTORY_THREADS": "0"},
     "  KFACTORY_THREADS: Input should be greater than or equal to 1"),
    (["status", "--planner", "localhost:1"], {"KFACTORY_MAX_DELIVER": "0"}, "  KFACTORY_MAX_DELIVER: Input should be"),
    (["run", "softmax", "--llm-concurrency", "0", "--budget", "1"], {}, "  --llm-concurrency: Input should be"),
])
def test_a_bad_setting_a_flag_gave_is_named_by_the_flag(monkeypatch, capsys, tmp_path, argv, env, says):
    """`check --threads 0` said KFACTORY_THREADS, a variable the user never set."""
    from kfactory.cli.main import EXIT_USAGE, main
    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("kfactory: bad configuration:\n"), err
    assert any(line.startswith(says) for line in err.splitlines()), err


def test_a_path_setting_set_empty_is_unset_not_the_working_directory(monkeypatch):
    """KFACTORY_DATA_DIR= made the working directory the workspace (a check wrote ./so there)."""
    from kfactory.platform.config import Settings, _default_data_dir
    monkeypatch.setenv("KFACTORY_DATA_DIR", "")
    monkeypatch.setenv("KFACTORY_ENGINE_OBJECT_CACHE", "")
    settings = Settings()
    assert settings.data_dir == _default_data_dir() and settings.engine_object_cache is None

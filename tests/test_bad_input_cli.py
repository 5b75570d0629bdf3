"""Bad input met by the command line and the gRPC services (issue 22, defect 8), against a real nats-server and real
services: an undecodable entry on the DLQ stream is listed as such, a filter that is no campaign id is one line and
exit 2, error texts quote at most a clip of megabytes of input, an unknown campaign's leaderboard says so, and work
whose result is over the server's max_payload is dead-lettered at once with what was too large."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kfactory.bus import events as ev
from kfactory.platform.app import start_services
from kfactory.bus.errors import PayloadTooLarge
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.deadletters import NotReplayable, list_dead_letters, replay
from kfactory.platform.grpcserver import MAX_DETAILS_BYTES
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

sys.path.insert(0, str(Path(__file__).parent))
from bus_helpers import work  # noqa: E402
from tuning_synth import write_spaces  # noqa: E402

#: a valid point of the synthetic recorded space (tests/tuning_synth.py)
POINT = {"block_x": 64, "block_y": 1, "tile": 2, "shmem": 1}


@pytest.fixture
def space(tmp_path) -> Path:
    return write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]


def _spec(space: Path, **kw) -> pb.CampaignSpec:
    base = dict(problem=f"replay:{space}", target=f"replay:{space}", strategy="random", budget_candidates=4,
                parallel=2, seed=5, warm_start=0)
    return pb.CampaignSpec(**{**base, **kw})


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kfactory.cli.main", *args], capture_output=True, text=True,
                          timeout=60)


async def _acli(*args: str) -> tuple[int, str, str]:
    """The CLI run beside services of this event loop (a blocking run would stop them answering)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kfactory.cli.main", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None  # communicate() waited for the exit
    return proc.returncode, out.decode(), err.decode()


async def _addr(running, name: str) -> str:
    """Where a service of `running` answers gRPC, once it does."""
    async with asyncio.timeout(20):
        while not running.services[name].grpc_port:
            await asyncio.sleep(0.05)
    return f"127.0.0.1:{running.services[name].grpc_port}"


def _one_line_usage_error(r: subprocess.CompletedProcess, says: str) -> None:
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("kfactory: ") and says in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not r.stdout


# -- 8a: an entry on the DLQ stream that is no dead letter ------------------------------------------------------
def test_an_undecodable_entry_on_the_dlq_stream_is_listed_and_every_dead_letter_with_it(nats_url):
    async def plant() -> None:
        bus = await NatsBus.connect(nats_url, "test")
        async def letter(cid: str) -> None:
            await bus.dead_letter("compiler", ev.work_subject("compiler", cid), work(cid, "p1").SerializeToString(),
                                  "handler error: boom", 5, cid, cause=pb.DELIVERIES_EXHAUSTED)
        await letter("camp-a")
        # between two dead letters: bytes that are no protobuf, and an event that is no dead letter
        await bus.js.publish(f"{ev.DLQ_PREFIX}.coder.camp-a", b"\xff\xfe not protobuf")
        await bus.js.publish(f"{ev.DLQ_PREFIX}.coder.camp-b", work("camp-b", "p2").SerializeToString())
        await letter("camp-b")
        await bus.js.publish(ev.event_subject("resend_requested", "camp-a"), b"\xff\xfe not an event either")
        records = await list_dead_letters(bus)
        assert [(r.campaign_id, bool(r.undecodable)) for r in records] == \
            [("camp-a", False), ("camp-a", True), ("camp-b", True), ("camp-b", False)]
        with pytest.raises(NotReplayable, match="is no dead letter the services wrote: not a serialized"):
            await replay(bus, records[1])
        await bus.close()

    asyncio.run(plant())
    listed = _cli("dead-letters", "--nats-url", nats_url)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
    lines = listed.stdout.splitlines()
    assert lines[0] == "4 dead letter(s)", listed.stdout
    assert "#1 compiler camp-a deliveries_exhausted after 5 deliveries: handler error: boom" in lines[1]
    assert "#2 undecodable entry on kf.v1.dlq.coder.camp-a (15 bytes): not a serialized kfactory.v1.Event" in lines[2]
    assert "#3 undecodable entry on kf.v1.dlq.coder.camp-b" in lines[3] and "without a dead_letter body" in lines[3]
    assert "#4 compiler camp-b deliveries_exhausted after 5 deliveries: handler error: boom" in lines[4]
    only_b = _cli("dead-letters", "--nats-url", nats_url, "--campaign", "camp-b")
    assert only_b.returncode == 0 and only_b.stdout.startswith("2 dead letter(s) in campaign camp-b"), only_b
    # by cause: the entries that are no dead letter are listed as undecodable, the letters by theirs
    undecodable = _cli("dead-letters", "--nats-url", nats_url, "--cause", "undecodable").stdout.splitlines()
    assert undecodable[0] == "2 dead letter(s) caused undecodable" and "#2 undecodable entry" in undecodable[1]
    assert "#3 undecodable entry" in undecodable[2] and len(undecodable) == 3
    exhausted = _cli("dead-letters", "--nats-url", nats_url, "--campaign", "camp-a", "--cause", "deliveries_exhausted")
    assert exhausted.stdout.splitlines()[0] == "1 dead letter(s) in campaign camp-a caused deliveries_exhausted"
    bad = _cli("dead-letters", "--nats-url", nats_url, "--cause", "bug")
    assert bad.returncode == 2 and "argument --cause: invalid choice: 'bug'" in bad.stderr
    assert "harness_failed" in bad.stderr     # the valid causes are named


# -- 8b: a filter that is no campaign id ------------------------------------------------------------------------
@pytest.mark.parametrize("args, says", [
    (("dead-letters", "--campaign", "a b.c>*"), "--campaign 'a b.c>*' is not a campaign id: 1-64 letters"),
    (("dead-letters", "--stage", "coder.>"), "--stage 'coder.>' is not a stage name"),
    (("dead-letters", "--stage", "bogus"), "--stage 'bogus' is not a stage name: coder, compiler, verifier, "),
    (("best", "--campaign", "a b.c>*", "--memory", "127.0.0.1:1"), "--campaign 'a b.c>*' is not a campaign id"),
])
def test_a_filter_that_is_no_campaign_id_is_one_line_and_exit_2(nats_url, args, says):
    _one_line_usage_error(_cli(*args, *(("--nats-url", nats_url) if args[0] == "dead-letters" else ())), says)


@pytest.mark.parametrize("args", [("submit", "softmax", "--budget", "1", "--planner", "127.0.0.1:1"),
                                  ("status", "--planner", "127.0.0.1:1"),
                                  ("best", "softmax", "--memory", "127.0.0.1:1")])
def test_a_service_that_cannot_be_reached_is_exit_69_to_try_again_later(args):
    """UNAVAILABLE was exit 1, as a campaign that failed; `kfactory run` exits 69 (EX_UNAVAILABLE) when the host is
    too busy to check a reference, and a script retries on 69."""
    r = _cli(*args)
    assert r.returncode == 69 and r.stderr.startswith("kfactory: 127.0.0.1:1: UNAVAILABLE: "), r
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and not r.stdout


# -- 8d: an unknown campaign's leaderboard ----------------------------------------------------------------------
async def test_best_of_an_unknown_campaign_says_so_and_fails(bus_settings, space):
    running = await start_services(bus_settings, names=("planner", "memory"))
    try:
        memory = await _addr(running, "memory")
        rc, out, err = await _acli("best", "--campaign", "cNOPE", "--memory", memory)
        assert rc == 1 and "NOT_FOUND: no campaign 'cNOPE' in the archive" in err and not out, (rc, out, err)
        # a campaign memory knows, with nothing measured yet (no stage runs here): its empty leaderboard, exit 0
        cid = await running.services["planner"].submit(_spec(space))
        archive = running.services["memory"].archive
        async with asyncio.timeout(20):
            while not archive.counts_by_producer(cid):
                await asyncio.sleep(0.1)
        rc, out, err = await _acli("best", "--campaign", cid, "--memory", memory)
        assert rc == 0 and out.strip() == "no measurements", (rc, out, err)
    finally:
        await running.shutdown()


# -- 8c: error texts that quote megabytes of input -------------------------------------------------------------
async def test_error_texts_quote_a_clip_of_megabytes_of_input_not_all_of_it(bus_settings, space):
    running = await start_services(bus_settings, names=("planner", "memory"))
    try:
        planner, memory = await _addr(running, "planner"), await _addr(running, "memory")
        huge = "x" * (4_000_000 - 200)  # with the rest of the request, under gRPC's 4 MiB receive limit
        async with grpc.aio.insecure_channel(planner) as ch:
            campaigns = sgrpc.CampaignsStub(ch)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await campaigns.Submit(spb.SubmitRequest(spec=_spec(space, strategy=huge)))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            text = _clipped(err.value)  # its head names the field, its tail what to give instead
            assert text.startswith("strategy: unknown 'xxx") and "'; known: " in text[-200:], text[-200:]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await campaigns.Submit(spb.SubmitRequest(spec=_spec(space, problem=huge)))
            # the loader quotes a clip of the name itself, so nothing is left for the interceptor to cut
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()[:300]
            assert err.value.details().startswith("problem: no problem 'xxx")
            assert len(err.value.details().encode()) <= MAX_DETAILS_BYTES
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await campaigns.Get(spb.GetCampaignRequest(id=huge))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and _clipped(err.value).startswith("no campaign")
        async with grpc.aio.insecure_channel(memory) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await sgrpc.EvidenceStub(ch).Best(spb.BestRequest(problem="p" + huge, shape="s" * 100_000))
            _clipped(err.value)
        # the command line: an argument of 120 KB, not ASCII (percent-encoded in the trailer), in one clipped line
        rc, out, err_text = await _acli("status", "c" + "é" * 60_000, "--planner", planner)
        assert rc == 1 and "NOT_FOUND: no campaign 'c" in err_text and "characters cut" in err_text, err_text
        assert err_text.count("\n") == 1 and len(err_text) < MAX_DETAILS_BYTES + 200
        assert running.failed() is None
    finally:
        await running.shutdown()


def _clipped(e: grpc.aio.AioRpcError) -> str:
    """The error's text, checked to be a clip (the error itself, not RESOURCE_EXHAUSTED in its place)."""
    assert e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
    assert "characters cut" in e.details() and len(e.details().encode()) <= MAX_DETAILS_BYTES, e.details()[:300]
    return e.details()


# -- 8e: a result over the server's max_payload -----------------------------------------------------------------
async def test_work_whose_result_is_over_max_payload_is_dead_lettered_at_once_with_what_was_too_large(
        bus_settings, space):
    running = await start_services(bus_settings, grpc=False)
    try:
        bus = running.ctx.bus
        limit = bus.nc.max_payload
        cid = await running.services["planner"].submit(_spec(space))
        # a valid point whose params_json is padded (JSON allows the blanks) so that the work item just fits and
        # the candidate it becomes, which adds its id and digest, does not
        pp = pb.PointProposed(point_id="padded", family="recorded", problem=f"replay:{space}",
                              target=f"replay:{space}", origin="test", params_json=json.dumps(POINT))
        bare = ev.make_event(cid, "test", "padded", point_proposed=pp).ByteSize()
        pp.params_json += " " * (limit - 60 - bare)
        item = ev.make_event(cid, "test", "padded", point_proposed=pp)
        assert limit - 64 < item.ByteSize() < limit - 56
        await bus.js.publish(ev.work_subject("coder", cid), item.SerializeToString(), headers={"Nats-Msg-Id": "pad"})
        async with asyncio.timeout(40):
            while not (letters := [r.letter for r in await list_dead_letters(bus, "coder", cid)]):
                await asyncio.sleep(0.2)
        [letter] = letters
        assert letter.deliveries == 1, letter.reason  # not retried: it would never fit
        assert letter.reason.startswith(f"coder: the message for {ev.event_subject('candidate_created', cid)} is ")
        assert f"over the NATS server's max_payload of {limit} bytes (its largest field: " \
               "candidate_created.candidate.params_json" in letter.reason and "artifact store" in letter.reason
        assert running.failed() is None
        # sending such a message at all is refused before it reaches the server, with the same reason
        big = ev.make_event(cid, "test", "big", point_proposed=pb.PointProposed(point_id="big",
                                                                                params_json="x" * limit))
        with pytest.raises(PayloadTooLarge, match="its largest field: point_proposed.params_json"):
            await bus.send_work("coder", big)
    finally:
        await running.shutdown()

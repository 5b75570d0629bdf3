"""A campaign submitted while NATS is down, against a real nats-server stopped and started again: the client hears
UNAVAILABLE with what to do, the planner holds no campaign that would stay "running" undriven, it keeps
answering and takes the next submission once NATS is back, and a start that reached the stream after its
client was refused is recorded as cancelled, never run, with the reason its status shows (not left unfinished,
nor failed: a failure its user was never told of); a start whose acknowledgement alone was lost runs its
campaign."""
from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import grpc
import nats.errors
import pytest

from kfactory.bus import events as ev
from kfactory.bus import jetstream
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.natsd import EmbeddedNats
from kfactory.bus.topology import EVENTS_STREAM
from kfactory.platform.app import start_services
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

sys.path.insert(0, str(Path(__file__).parent))
from bus_helpers import planner_serving  # noqa: E402
from ports import free_port  # noqa: E402
from tuning_synth import write_spaces  # noqa: E402


def _spec(space: Path) -> pb.CampaignSpec:
    return pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}", strategy="random",
                           budget_candidates=2, parallel=1, seed=3, warm_start=0)


async def _until(check, timeout_s: float, what: str):
    """Poll `check` (an async callable returning a value or None) until it returns a value."""
    async with asyncio.timeout(timeout_s):
        while (value := await check()) is None:
            await asyncio.sleep(0.2)
    assert value is not None, what
    return value


async def _planner(config):
    """A planner started on `config`, once it serves gRPC and has folded the stream: (the running app, it)."""
    running = await start_services(config, names=("planner",))
    planner = running.services["planner"]
    try:
        await planner_serving(planner)
    except BaseException:
        await running.shutdown()
        raise
    return running, planner


async def _late_start(url: str, cid: str, space: Path, planner):
    """Publish campaign `cid`'s start (a refused submission's, reaching the stream after all) and wait until
    `planner` has finished it; its state."""
    bus = await NatsBus.connect(url, "test")
    try:
        start = pb.CampaignStarted(spec=_spec(space))
        await bus.publish(ev.make_event(cid, "planner", "start", campaign_started=start))
    finally:
        await bus.close()

    async def finished():
        st = planner.campaigns.get(cid)
        return st if st is not None and st.finished is not None else None
    return await _until(finished, 30, "the late start finished")


async def test_a_submit_while_nats_is_down_is_refused_cleanly_and_the_planner_carries_on(settings, tmp_path,
                                                                                      monkeypatch):
    # the publish gives up after 1 s of retries instead of a minute (the behaviour is the same, only sooner)
    monkeypatch.setattr(jetstream, "PUBLISH_RETRY_S", 1.0)
    space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
    port = free_port()   # restarted on the same port below: one of this worker's own (tests/ports.py)
    server = EmbeddedNats(tmp_path / "nats", port=port)
    url = server.start()
    running = await start_services(settings.model_copy(update={"nats_url": url}), names=("planner",))
    planner = running.services["planner"]
    try:
        await planner_serving(planner)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{planner.grpc_port}") as ch:
            campaigns = sgrpc.CampaignsStub(ch)
            server.stop()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await campaigns.Submit(spb.SubmitRequest(spec=_spec(space)), timeout=60)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value
            text = err.value.details()
            assert "nothing was started" in text and "submit it again once NATS answers" in text, text
            assert "lists the campaign as cancelled, never run" in text, text
            refused = re.match(r"campaign (c[0-9a-f]+): ", text)
            assert refused, text
            listed = await campaigns.List(spb.ListCampaignsRequest())
            assert list(listed.campaigns) == [] and planner.campaigns == {}

            # NATS back on the same port: the planner reconnects and takes the same campaign again
            server = EmbeddedNats(tmp_path / "nats", port=port)
            server.start()

            async def submitted():
                try:
                    return await campaigns.Submit(spb.SubmitRequest(spec=_spec(space)), timeout=60)
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                    return None
            status = await _until(submitted, 60, "a submission once NATS is back")
            assert status.id != refused.group(1) and status.id in planner.campaigns

            # the refused start reaching the stream after all: cancelled, never run, with the reason
            st = await _late_start(url, refused.group(1), space, planner)
            assert st.finished.state == "cancelled", st.finished
            assert st.finished.reason.startswith("never run: its submission was refused while NATS was unreachable"), \
                st.finished.reason
            assert st.counts.proposed == 0 and refused.group(1) not in planner.replay.abandoned
            status = await campaigns.Get(spb.GetCampaignRequest(id=refused.group(1)))   # what `kfactory status` prints
            assert status.state == "cancelled" and status.reason == st.finished.reason, status
    finally:
        await running.shutdown()
        server.stop()


async def test_a_start_whose_acknowledgement_was_lost_runs_its_campaign(settings, tmp_path):
    """The publish reached the stream but its acknowledgement did not come back (a NATS timeout after the
    message landed): the planner has read the start back, so the campaign runs and the client gets its id."""
    space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
    with EmbeddedNats(tmp_path / "nats") as server:
        running = await start_services(settings.model_copy(update={"nats_url": server.url}), names=("planner",))
        planner = running.services["planner"]
        real_publish = planner.bus.publish

        async def lost_ack(event: pb.Event) -> None:
            await real_publish(event)
            if event.HasField("campaign_started"):
                async with asyncio.timeout(20):   # the planner's own fold reads it back
                    while event.campaign_id not in planner.replay.landed:
                        await asyncio.sleep(0.05)
                raise nats.errors.TimeoutError

        try:
            await planner_serving(planner)
            planner.bus.publish = lost_ack
            async with grpc.aio.insecure_channel(f"127.0.0.1:{planner.grpc_port}") as ch:
                status = await sgrpc.CampaignsStub(ch).Submit(spb.SubmitRequest(spec=_spec(space)), timeout=60)
            assert status.id in planner.campaigns and status.id in planner.loops
            assert status.state == "running" and status.id not in planner.replay.abandoned
        finally:
            planner.bus.publish = real_publish
            await running.shutdown()


async def test_a_refused_start_that_lands_under_a_restarted_planner_is_cancelled_too(settings, tmp_path, monkeypatch,
                                                                                      redis_url_session):
    """The planner that refused the submission is gone (restarted) when the start reaches the stream: the new
    planner finds the refusal in the claims store (a real Redis) and cancels the campaign, never runs it; a planner
    restarted after that replays the cancel and publishes no second one (a review found each restart did)."""
    monkeypatch.setattr(jetstream, "PUBLISH_RETRY_S", 1.0)
    monkeypatch.setattr(jetstream, "DUPLICATE_WINDOW_S", 1.0)   # the stream would drop a second finish sooner
    space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
    port = free_port()   # restarted on the same port below: one of this worker's own (tests/ports.py)
    server = EmbeddedNats(tmp_path / "nats", port=port)
    url = server.start()
    config = settings.model_copy(update={"nats_url": url, "redis_url": redis_url_session})
    running, planner = await _planner(config)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{planner.grpc_port}") as ch:
            server.stop()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await sgrpc.CampaignsStub(ch).Submit(spb.SubmitRequest(spec=_spec(space)), timeout=60)
        refused = re.match(r"campaign (c[0-9a-f]+): ", err.value.details())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and refused, err.value
    finally:
        async with asyncio.timeout(60):
            await running.shutdown()   # the refusing planner goes, and its memory of the refusal with it
    server = EmbeddedNats(tmp_path / "nats", port=port)
    server.start()
    running, planner = await _planner(config)
    try:
        assert refused.group(1) not in planner.replay.abandoned
        st = await _late_start(url, refused.group(1), space, planner)
        assert st.finished.state == "cancelled" and st.counts.proposed == 0, st.finished
        assert st.finished.reason.startswith("never run: its submission was refused while NATS was unreachable")
        ended = st.finished_wall
    finally:
        await running.shutdown()
    # a later restart (past the stream's duplicate window) replays the finish: it cancels nothing again
    try:
        await asyncio.sleep(jetstream.DUPLICATE_WINDOW_S + 1.0)
        running, planner = await _planner(config)
        try:
            await asyncio.sleep(1.0)   # what a second cancel would publish
            st = planner.campaigns[refused.group(1)]
            assert st.finished.state == "cancelled" and st.finished_wall == ended
            bus = await NatsBus.connect(url, "test")
            try:
                subject = ev.event_subject("campaign_finished", refused.group(1))
                info = await bus.js.stream_info(EVENTS_STREAM, subjects_filter=subject)
                assert (info.state.subjects or {}).get(subject) == 1, info.state.subjects
            finally:
                await bus.close()
        finally:
            await running.shutdown()
    finally:
        server.stop()

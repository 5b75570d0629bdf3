"""What only one bus does: NATS's connection errors, and the in-memory bus's brokers and selection by settings.
What both must do is the contract suite, tests/test_bus_contract.py."""
from __future__ import annotations

import pytest

from kfactory.bus.errors import BusUnavailable
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.memory import MemoryBus, forget
from kfactory.platform.app import WiringError, open_bus, serve

from bus_helpers import work as _work


async def test_unreachable_nats_is_a_clear_error():
    with pytest.raises(BusUnavailable, match="cannot reach NATS at nats://127.0.0.1:1"):
        await NatsBus.connect("nats://127.0.0.1:1", "test", timeout_s=1)


async def test_memory_brokers_are_separate_and_outlive_their_buses():
    """Buses on one broker name share it (as services share a server), others do not see it, and what a closed
    bus left is there for the next (as after a restart) until the broker is forgotten."""
    try:
        a, b = await MemoryBus.connect("memory://one", "a"), await MemoryBus.connect("memory://two", "b")
        await a.send_work("coder", _work("m1", "p"))
        assert len(await b.stored("KF_WORK", "kf.v1.work.>")) == 0
        await a.close()
        assert not a.connected
        again = await MemoryBus.connect("memory://one", "a")
        assert [s.subject for s in await again.stored("KF_WORK", "kf.v1.work.>")] == ["kf.v1.work.coder.m1"]
    finally:
        forget("one")
        forget("two")


async def test_the_settings_choose_the_bus(settings):
    bus = await open_bus(settings.model_copy(update={"bus": "memory"}), "test")
    try:
        assert isinstance(bus, MemoryBus) and bus.ack_wait_s == settings.ack_wait_s
    finally:
        await bus.close()
        forget("default")
    with pytest.raises(BusUnavailable, match="cannot reach NATS at nats://127.0.0.1:1"):
        await open_bus(settings, "test")  # nats, at the settings' unreachable URL


async def test_serve_refuses_the_in_memory_bus(settings):
    """`serve` runs one service of several processes: an in-process bus would connect it to nobody."""
    with pytest.raises(WiringError, match="KFACTORY_BUS=nats"):
        await serve("coder", settings.model_copy(update={"bus": "memory"}))


def test_the_topology_is_closed_and_the_services_consume_what_it_says():
    """Every stage is queued by some role and consumed by exactly one, and each service's own stage is the one
    its role consumes: a stage added to the pipeline without its route (or its permissions) fails here."""
    from kfactory.bus.topology import ROLES, STAGES, consumer_of
    from kfactory.platform.app import SERVICE_NAMES, service_class

    queued = {s for r in ROLES.values() for s in r.queues}
    consumed = [s for r in ROLES.values() for s in r.consumes]
    assert queued == set(consumed) == set(STAGES) and len(consumed) == len(set(consumed))
    assert set(ROLES) == set(SERVICE_NAMES)
    for name in SERVICE_NAMES:
        stage = service_class(name).stage
        assert stage is None or consumer_of(stage) == name


async def test_stored_waits_out_a_server_that_stalls_and_reads_a_missing_stream_as_an_error(tmp_path):
    """stored() reads every message of the subject through a stall of the server (the old one took 0.5 s without
    an answer for the end of the list; this stall lands before that read began, so both pass it: the walk's end
    is the server's word, by construction), and a stream that does not exist is an error, not an empty list."""
    import asyncio
    import os
    import signal

    import nats.js.errors

    from kfactory.bus import events as ev
    from kfactory.bus.natsd import EmbeddedNats
    from kfactory.bus.topology import DLQ_STREAM

    server = EmbeddedNats(tmp_path / "nats")
    bus = await NatsBus.connect(server.start(), "t")
    try:
        for stage in ("verifier", "compiler", "coder"):
            await bus.js.publish(f"{ev.DLQ_PREFIX}.{stage}.c1", stage.encode(), stream=DLQ_STREAM)
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)   # the server stalls for 1.5 s while the list is read
        asyncio.get_running_loop().call_later(1.5, os.kill, server.proc.pid, signal.SIGCONT)
        got = await bus.stored(DLQ_STREAM, f"{ev.DLQ_PREFIX}.*.c1")
        assert [m.data for m in got] == [b"verifier", b"compiler", b"coder"]
        with pytest.raises(nats.js.errors.NotFoundError, match="stream not found"):
            await bus.stored("KF_NO_SUCH_STREAM", "a.b")
        with pytest.raises(nats.js.errors.NotFoundError, match="stream not found"):   # the lifecycle reads too
            await bus._next_on_subject("KF_NO_SUCH_STREAM", "a.b", 1)
        assert await bus._next_on_subject(DLQ_STREAM, f"{ev.DLQ_PREFIX}.*.c2", 1) is None   # only no message is
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)
        await bus.close()
        server.stop()

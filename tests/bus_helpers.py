"""Helpers for tests that drive a bus (the in-memory one or NATS) directly, or the services on it."""
from __future__ import annotations

import asyncio

from kfactory.bus import events as ev
from kfactory.bus.base import Bus
from kfactory.v1 import events_pb2 as pb


def work(cid: str, key: str) -> pb.Event:
    """A small work event (a proposed point) for campaign `cid`."""
    return ev.make_event(cid, "test", key, point_proposed=pb.PointProposed(point_id=key))


async def consume_until(bus: Bus, stage: str, handler, until, timeout: float = 20.0) -> None:
    """Run one consumer of `stage` with `handler` until `until()` is true (or fail after `timeout`)."""
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume(stage, handler, 1, stop))
    try:
        async with asyncio.timeout(timeout):
            while not until():
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task


async def events_until(bus: Bus, cid: str, done, timeout: float = 20.0) -> list[pb.Event]:
    """The events of campaign `cid` from the start of the stream, read until `done(events)` is true (or fail after
    `timeout`): no fixed wait, on either bus."""
    out: list[pb.Event] = []
    stop = asyncio.Event()
    async with asyncio.timeout(timeout):
        async for e, msg in bus.follow(None, ev.event_subject("*", cid), stop=stop):
            out.append(e)
            await msg.ack()
            if done(out):
                stop.set()
    return out


async def planner_serving(planner, timeout: float = 20.0) -> None:
    """Wait until a started planner service listens for gRPC and has caught up with the stream (or fail after
    `timeout`)."""
    async with asyncio.timeout(timeout):
        while not planner.grpc_port or not planner.caught_up.is_set():
            await asyncio.sleep(0.05)

"""Timing rounds of an engine campaign through the services: after the planner's campaign ends, its verified
designs go to the benchmarker again, as the local campaign times them again (kfactory/engines/campaign.py
`retime`, `noise`).

Round 1 is the measurement each design got after its verification. Rounds 2..R send every verified design's
Verified event to the benchmarker's work subject again with `round` set, all designs in proposal order within a
round (a pair of designs is then also timed close together: on a shared host the load drifts within minutes);
then, when two or more designs verified, the first one once more (round R + 1): its ratio to its first timing
is the noise figure. Each timing is the benchmarker's own Measured event (`Measured.round`), archived by memory
like any other; kfactory/engines/pipeline.py folds them into the record (medians over rounds, the noise).
Then the showdown (kfactory/engines/showdown.py): its contenders, chosen from the archived figures of rounds
1..R and the noise figure, are sent again in rounds R + 2 .. R + 1 + S in showdown.schedule's order; a contender
whose timing is rejected (a fault) is sent no more, as the local campaign times it no more.
One request at a time: the benchmarker holds the device lease for each anyway, and the order is the local one.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from kfactory.bus import events as ev
from kfactory.bus.topology import Stage
from kfactory.engines import pipeline
from kfactory.engines.design import EngineDesign
from kfactory.engines.showdown import Rule, schedule
from kfactory.v1 import events_pb2 as pb

if TYPE_CHECKING:
    from kfactory.platform.app import Running
    from kfactory.services.memory.service import MemoryService
    from kfactory.services.planner.service import PlannerService

#: how long one re-timing may take before the campaign's record is written without it (an engine's bench is
#: seconds; a dead-lettered request never answers)
RETIME_WAIT_S = 600.0


class RetimeFailed(RuntimeError):
    """A re-timing got no answer: the services failed, or the request was dead-lettered or timed out."""


def requests(events: list[pb.Event], rounds: int) -> list[pb.Verified]:
    """The re-timing requests, in order: rounds 2..`rounds` over the designs verified and measured in round 1
    (proposal order), then the noise timing of the first one when two or more were measured."""
    order = {e.point_proposed.point_id: i for i, e in enumerate(events) if e.HasField("point_proposed")}
    verified = sorted(_measured(events), key=lambda v: order.get(v.candidate.point_id, len(order)))
    plan = [(r, v) for r in range(2, rounds + 1) for v in verified]
    if len(verified) >= 2:
        plan.append((rounds + 1, verified[0]))
    return [_request(v, r) for r, v in plan]


def _request(v: pb.Verified, round_: int) -> pb.Verified:
    req = pb.Verified()
    req.CopyFrom(v)
    req.round = round_
    return req


def _measured(events: list[pb.Event]) -> list[pb.Verified]:
    """The Verified events of the candidates measured in round 1, in event order."""
    measured = {e.measured.candidate.id for e in events
                if e.HasField("measured") and e.measured.round == 0 and not e.measured.screened_out}
    return [e.verified for e in events if e.HasField("verified") and e.verified.candidate.id in measured]


def showdown_requests(events: list[pb.Event], rounds: int, rule: Rule) -> list[tuple[str, pb.Verified]]:
    """The showdown's requests in timing order, each with its design id: `rule.rounds` rounds (R + 2 on) over
    the contenders `rule` chooses from the archived events of rounds 1..R and the noise timing; [] when there are
    none."""
    before = pipeline.results_of(events, None, rounds, showdown=False)
    ids = pipeline.showdown_ids(before, events, rounds, rule)
    verified = {EngineDesign.from_dict(json.loads(v.candidate.params_json)).design_id(): v
                for v in _measured(events)}
    return [(i, _request(verified[i], rounds + 2 + k)) for k, i in schedule(ids, rule.rounds) if i in verified]


async def retime(planner: PlannerService, memory: MemoryService, running: Running, cid: str, rounds: int,
                 showdown: Rule | None = None) -> int:
    """Send campaign `cid`'s re-timing requests (see `requests`), then its showdown's (`showdown_requests`), to
    the benchmarker one at a time, each after the answer to the one before is archived; the number sent.
    RetimeFailed when one gets no answer."""
    sent = 0
    for req in requests(memory.archive.events(campaign=cid), rounds):
        await _send(planner, memory, running, cid, req)
        sent += 1
    faulted: set[str] = set()
    for design_id, req in showdown_requests(memory.archive.events(campaign=cid), rounds, showdown or Rule()):
        if design_id in faulted:
            continue
        if not await _send(planner, memory, running, cid, req):
            faulted.add(design_id)
        sent += 1
    return sent


async def _send(planner: PlannerService, memory: MemoryService, running: Running, cid: str,
                req: pb.Verified) -> bool:
    """Send one re-timing request and wait for its answer; True when it was measured, False when rejected."""
    key = f"{req.candidate.id}:round{req.round}"
    event = ev.make_event(cid, planner.name, key, verified=req)
    await planner.bus.send_work(Stage.BENCHMARKER, event)
    measured = f"{cid}:measured:{key}"
    return await _answered(memory, running, cid, {measured, f"{cid}:rejected:{key}"}, event.id) == measured


async def _answered(memory: MemoryService, running: Running, cid: str, answers: set[str], request_id: str) -> str:
    """Wait until memory archives one of the event ids `answers` (the Measured or the benchmarker's Rejected of
    the request `request_id`), and return it; RetimeFailed when the services fail, the request is dead-lettered
    or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETIME_WAIT_S
    while loop.time() < deadline:
        if (failure := running.failed()) is not None:
            raise RetimeFailed(f"a service failed while re-timing: {failure}") from failure
        for e in memory.archive.events(campaign=cid):
            if e.id in answers:
                return e.id
            if e.HasField("dead_letter") and _payload_id(e.dead_letter) == request_id:
                raise RetimeFailed(f"the re-timing {request_id} was dead-lettered: {e.dead_letter.reason}")
        await asyncio.sleep(0.2)
    raise RetimeFailed(f"the re-timing {request_id} got no answer in {RETIME_WAIT_S:.0f} s")


def _payload_id(dl: pb.DeadLetter) -> str:
    """The id of the work a dead letter holds ("" when its payload was cut to fit)."""
    from google.protobuf.message import DecodeError
    try:
        return pb.Event.FromString(dl.payload).id
    except DecodeError:
        return ""

"""Dead letters: list what the services gave up on, and send it back to its stage once the cause is fixed.

A work message that can never succeed, or that runs out of deliveries, is kept on the DLQ stream with its reason
and its payload (bus.dead_letter). `replay` republishes the payload to the work subject it came from and then
removes it from the DLQ stream; the dead-letter event in the events stream (memory's archive) stays as the record.
The replay's `Nats-Msg-Id` is derived from the dead letter's place in the DLQ stream, so replaying the same
dead letter twice within the server's duplicate window queues it once. Handlers are idempotent: a replayed
message whose result was in fact published changes nothing.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from nats.js.api import ConsumerConfig, DeliverPolicy

from kfactory import events as ev
from kfactory.bus import DLQ_STREAM, Bus
from kfactory.v1 import events_pb2 as pb

#: how long to wait for one more stored dead letter before the listing is taken as complete
FETCH_WAIT_S = 0.5


class NotReplayable(ValueError):
    """This dead letter cannot be sent back as it is; the message says why."""


@dataclass(frozen=True)
class DeadLetterRecord:
    """One dead letter on the DLQ stream, and where it sits there (`seq`)."""
    seq: int
    campaign_id: str
    letter: pb.DeadLetter


def _filter(stage: str | None, campaign: str | None) -> str:
    return f"{ev.DLQ_PREFIX}.{stage or '*'}.{campaign or '*'}"


async def list_dead_letters(bus: Bus, stage: str | None = None, campaign: str | None = None,
                            batch: int = 256) -> list[DeadLetterRecord]:
    """Every dead letter still on the DLQ stream (of one stage and/or campaign), oldest first."""
    await bus.ensure()
    sub = await bus.js.pull_subscribe(_filter(stage, campaign), stream=DLQ_STREAM,
                                      config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    out: list[DeadLetterRecord] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=FETCH_WAIT_S)
            except asyncio.TimeoutError:  # nats-py's fetch timeout: nothing more is stored
                break
            for msg in msgs:
                event = pb.Event.FromString(msg.data)  # written by bus.dead_letter itself
                out.append(DeadLetterRecord(msg.metadata.sequence.stream, event.campaign_id, event.dead_letter))
                await msg.ack()
    finally:
        await sub.unsubscribe()
    return out


async def replay(bus: Bus, record: DeadLetterRecord) -> pb.Event:
    """Send a dead letter's work back to its stage and take it off the DLQ stream; returns the work event.
    Raises NotReplayable for one that was not work (only work subjects have a stage to go back to), whose
    payload was cut to fit the DLQ stream, that could never be decoded (it was dead-lettered for that), or
    whose campaign has finished (its counts and its best are final, so the work's result would belong to no
    campaign; the dead letter stays listed). While the campaign runs, the outcome of work sent back replaces
    its dead letter's in the planner's counts and is told to the search."""
    letter = record.letter
    if not letter.subject.startswith(f"{ev.WORK_PREFIX}."):
        raise NotReplayable(f"dead letter {record.seq} came from {letter.subject!r}, not from a work subject")
    if letter.payload_bytes > len(letter.payload):
        raise NotReplayable(f"dead letter {record.seq} kept only {len(letter.payload)} of its "
                            f"{letter.payload_bytes} bytes; the message itself is gone")
    try:
        event = ev.decode_event(letter.payload, letter.subject, bus.max_event_bytes)
    except ev.BadEvent as e:
        raise NotReplayable(f"dead letter {record.seq} cannot be sent back as it is: {e} "
                            f"(its reason: {letter.reason.splitlines()[0] if letter.reason else 'none'})") from e
    finished = await bus.campaign_finished(record.campaign_id)
    if finished is not None:
        raise NotReplayable(f"dead letter {record.seq}: campaign {record.campaign_id} has finished "
                            f"({finished.state}), so its results are final; a new campaign on the same problem "
                            "measures the point again (and starts from what memory learned)")
    await bus.requeue(letter.subject, letter.payload, f"replay:{record.seq}:{event.id}")
    await bus.js.delete_msg(DLQ_STREAM, record.seq)
    return event


async def command(settings, stage: str | None, campaign: str | None, send_back: bool, out) -> int:
    """`kfactory dead-letters`: print the dead letters (and with send_back, replay each); the exit status is 1
    when a dead letter could not be sent back, else 0. Needs a NATS user that may read and delete on the DLQ
    stream: none of the services' users may, so in the secure profile use the admin user."""
    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    bus = await Bus.connect(settings.nats_url, "kfactory-dead-letters", user=settings.nats_user, password=password)
    failed = 0
    try:
        records = await list_dead_letters(bus, stage, campaign)
        print(f"{len(records)} dead letter(s)" + (f" of stage {stage}" if stage else "")
              + (f" in campaign {campaign}" if campaign else ""), file=out)
        for r in records:
            reason = r.letter.reason.splitlines()[0][:160] if r.letter.reason else ""
            print(f"  #{r.seq} {r.letter.stage} {r.campaign_id} after {r.letter.deliveries} deliveries: {reason}",
                  file=out)
            if not send_back:
                continue
            try:
                event = await replay(bus, r)
                print(f"    sent back to {r.letter.subject} (event {event.id[:16]})", file=out)
            except NotReplayable as e:
                failed += 1
                print(f"    not sent back: {e}", file=out)
    finally:
        await bus.close()
    return 1 if failed else 0

"""Dead letters: list what the services gave up on, and send it back to its stage once the cause is fixed.

A work message that can never succeed, or that runs out of deliveries, is kept on the DLQ stream with its reason
and its payload (bus.dead_letter). Sending one back is the campaign's planner's decision, so that the campaign
cannot end while the work is out: `replay` (the CLI) publishes a ResendRequested event and waits for the planner's
ResendAnswered. The planner accepts while the campaign runs: the point is in flight again (the campaign waits for
its outcome, which replaces the dead letter's), and it `send_back`s the payload to the work subject it came from
and removes it from the DLQ stream. Once the campaign has finished it refuses, and the dead letter stays listed.
The dead-letter event in the events stream (memory's archive) stays as the record, with the request and answer.
The resend's `Nats-Msg-Id` is derived from the dead letter's place in the DLQ stream, so sending the same dead
letter back twice within the server's duplicate window queues it once.
"""
from __future__ import annotations

import asyncio
import contextlib
import getpass
import socket
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from kfactory.bus import events as ev
from kfactory.bus.base import DLQ_PAYLOAD_MAX, Bus, Stored
from kfactory.bus.causes import cause_name
from kfactory.bus.topology import DLQ_STREAM, EVENTS_STREAM
from kfactory.observability.log import get_logger
from kfactory.v1 import events_pb2 as pb

#: how long `replay` waits for the planner's answer by default
ANSWER_WAIT_S = 30.0

log = get_logger("deadletters")


class NotReplayable(ValueError):
    """This dead letter cannot be sent back; the message says why."""


class NoAnswer(RuntimeError):
    """The planner did not answer a request in time; the request stays on the events stream and is answered when
    the planner runs."""


@dataclass(frozen=True)
class DeadLetterRecord:
    """One dead letter on the DLQ stream, and where it sits there (`seq`). `undecodable` says why an entry is no
    dead letter bus.dead_letter wrote ("" for one that is): anyone who may publish to the DLQ subjects can put
    other bytes there, and such an entry is listed as what it is, never sent back."""
    seq: int
    campaign_id: str
    letter: pb.DeadLetter
    undecodable: str = ""

    @classmethod
    def of(cls, seq: int, data: bytes, subject: str = "") -> DeadLetterRecord:
        """The record of the entry at `seq` (`subject`: where it was stored, when known)."""
        try:
            event = pb.Event.FromString(data)
        except DecodeError as e:
            return cls._undecodable(seq, data, subject, f"not a serialized kfactory.v1.Event ({e})")
        if not event.HasField("dead_letter"):
            return cls._undecodable(seq, data, subject, "an Event without a dead_letter body "
                                                        f"({ev.kind_of(event) or 'no body at all'})")
        return cls(seq, event.campaign_id, event.dead_letter)

    @classmethod
    def _undecodable(cls, seq: int, data: bytes, subject: str, why: str) -> DeadLetterRecord:
        """An entry that is no dead letter: its stage and campaign as its subject names them, its bytes kept as
        the payload (as much as a dead letter keeps)."""
        tokens = subject.split(".")
        stage, campaign = (tokens[-2], tokens[-1]) if len(tokens) >= 2 else ("?", "?")
        letter = pb.DeadLetter(stage=stage, subject=subject, reason=f"undecodable entry: {why}",
                               payload=data[:DLQ_PAYLOAD_MAX], payload_bytes=len(data), cause=pb.UNDECODABLE)
        return cls(seq, campaign, letter, undecodable=why)


def _filter(stage: str | None, campaign: str | None) -> str:
    return f"{ev.DLQ_PREFIX}.{stage or '*'}.{campaign or '*'}"


async def list_dead_letters(bus: Bus, stage: str | None = None, campaign: str | None = None,
                            cause: pb.DeadLetterCause | None = None) -> list[DeadLetterRecord]:
    """Every dead letter still on the DLQ stream (of one stage, campaign and/or cause), oldest first."""
    await bus.ensure()
    stored = await bus.stored(DLQ_STREAM, _filter(stage, campaign))
    records = [DeadLetterRecord.of(m.seq, m.data, m.subject) for m in stored]
    return [r for r in records if cause is None or r.letter.cause == cause]



async def fetch(bus: Bus, seq: int) -> DeadLetterRecord | None:
    """The dead letter at `seq` on the DLQ stream, or None when it is not there (sent back, or never was)."""
    data = await bus.get_dead_letter(seq)
    return DeadLetterRecord.of(seq, data) if data is not None else None


def work_of(record: DeadLetterRecord, max_event_bytes: int) -> pb.Event:
    """The work event a dead letter holds. Raises NotReplayable for one that was not work (only work subjects
    have a stage to go back to), whose payload was cut to fit the DLQ stream, or that could never be decoded
    (it was dead-lettered for that)."""
    letter = record.letter
    if record.undecodable:
        raise NotReplayable(f"dead letter {record.seq} is no dead letter the services wrote: {record.undecodable}; "
                            "it holds no work to send back")
    if not letter.subject.startswith(f"{ev.WORK_PREFIX}."):
        raise NotReplayable(f"dead letter {record.seq} came from {letter.subject!r}, not from a work subject")
    if ev.payload_cut(letter):
        raise NotReplayable(f"dead letter {record.seq} kept only {len(letter.payload)} of its "
                            f"{letter.payload_bytes} bytes; the message itself is gone")
    try:
        return ev.decode_event(letter.payload, letter.subject, max_event_bytes)
    except ev.BadEvent as e:
        raise NotReplayable(f"dead letter {record.seq} cannot be sent back as it is: {e} "
                            f"(its reason: {letter.reason.splitlines()[0] if letter.reason else 'none'})") from e


async def send_back(bus: Bus, record: DeadLetterRecord) -> pb.Event:
    """Queue a dead letter's work on its work subject again and take it off the DLQ stream (the planner's part,
    once it has accepted); returns the work event. Safe to repeat: the requeue is deduplicated, and a dead letter
    already deleted stays deleted."""
    event = work_of(record, bus.max_event_bytes)
    await bus.requeue(record.letter.subject, record.letter.payload, f"replay:{record.seq}:{event.id}")
    await bus.delete_dead_letter(record.seq)
    return event


async def replay(bus: Bus, record: DeadLetterRecord, wait_s: float = ANSWER_WAIT_S) -> pb.Event:
    """Ask the campaign's planner to send a dead letter's work back; returns the work event once it has.
    Raises NotReplayable when the dead letter cannot be sent back (see work_of) or the planner refused (the
    campaign has finished: its counts and best are final), and NoAnswer when the planner did not answer within
    `wait_s` (the request stays; the planner answers it when it runs, and asking again shows the answer)."""
    event = work_of(record, bus.max_event_bytes)
    finished = await bus.campaign_finished(record.campaign_id)
    if finished is not None:  # known without asking: the planner would refuse
        raise NotReplayable(finished_reason(record.seq, record.campaign_id, finished))
    req = pb.ResendRequested(dlq_seq=record.seq, requested_by=f"{getpass.getuser()}@{socket.gethostname()}")
    await bus.publish(ev.make_event(record.campaign_id, "cli", str(record.seq), resend_requested=req))
    answer = await _answer(bus, record.campaign_id, record.seq, wait_s)
    if not answer.accepted:
        raise NotReplayable(answer.reason)
    return event


def finished_reason(seq: int, campaign_id: str, finished: pb.CampaignFinished) -> str:
    """Why a finished campaign's dead letter is not sent back (the CLI's and the planner's refusal)."""
    return (f"dead letter {seq}: campaign {campaign_id} has finished ({finished.state}), so its results are "
            "final; a new campaign on the same problem measures the point again (and starts from what memory "
            "learned)")


async def _answer(bus: Bus, campaign_id: str, seq: int, wait_s: float) -> pb.ResendAnswered:
    """The planner's answer to the request for dead letter `seq`, read from the events stream (an answer given
    before this call, to an earlier request, counts)."""
    stop = asyncio.Event()
    timer = asyncio.get_running_loop().call_later(wait_s, stop.set)
    answers = bus.follow(None, ev.event_subject("resend_answered", campaign_id), stop=stop)
    try:
        async with contextlib.aclosing(answers):  # closed at once: its consumer goes with it
            async for event, msg in answers:
                await msg.ack()
                if event.resend_answered.dlq_seq == seq:
                    return event.resend_answered
    finally:
        timer.cancel()
    raise NoAnswer(f"dead letter {seq}: the planner did not answer within {wait_s:.1f} s (is it running?); the "
                   "request stays on the events stream and the planner answers it when it runs: ask again to "
                   "see the answer")


async def _by_seq(bus: Bus, kind: str, campaign: str | None) -> dict[int, pb.Event]:
    """The last ResendRequested or ResendAnswered (`kind`) for each dead letter, by its DLQ sequence."""
    events = [_event(m) for m in await bus.stored(EVENTS_STREAM, ev.event_subject(kind, campaign or "*"))]
    return {getattr(e, kind).dlq_seq: e for e in events if e is not None}


def _event(msg: Stored) -> pb.Event | None:
    """The event a message of the events stream holds, or None (logged) when it holds none: something else
    published there must not hide every request and answer after it."""
    try:
        return pb.Event.FromString(msg.data)
    except DecodeError as e:
        log.warning("undecodable message on the events stream: ignored", subject=msg.subject[:200],
                    seq=msg.seq, error=str(e))
        return None


def _history(record: DeadLetterRecord, asked: dict[int, pb.Event], answered: dict[int, pb.Event]) -> str:
    """What became of earlier requests to send this dead letter back ("" if there were none)."""
    if record.seq in answered:
        answer = answered[record.seq].resend_answered
        return "" if answer.accepted else f"    refused before: {answer.reason}"
    if record.seq in asked:
        return "    asked for before; the planner has not answered yet"
    return ""


def _line(record: DeadLetterRecord) -> str:
    """A dead letter's line in the listing."""
    if record.undecodable:
        return (f"  #{record.seq} undecodable entry on {record.letter.subject[:200]} "
                f"({record.letter.payload_bytes} bytes): {record.undecodable[:160]}")
    letter = record.letter
    reason = letter.reason.splitlines()[0][:160] if letter.reason else ""
    return (f"  #{record.seq} {letter.stage} {record.campaign_id} {cause_name(letter.cause)} after "
            f"{letter.deliveries} deliveries: {reason}")


async def command(settings, stage: str | None, campaign: str | None, resend: bool, out,
                  wait_s: float = ANSWER_WAIT_S, cause: pb.DeadLetterCause | None = None) -> int:
    """`kfactory dead-letters`: print the dead letters (of `stage`, `campaign` and `cause` where given; and with
    resend, ask for each to be sent back, waiting up
    to `wait_s` in all for the planners' answers); the exit status is 1 when a dead letter was not sent back,
    else 0. Needs a NATS user that may read the DLQ stream and publish a request event: none of the services'
    users may, so in the secure profile use the admin user."""
    from kfactory.bus.jetstream import NatsBus

    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    bus = await NatsBus.connect(settings.nats_url, "kfactory-dead-letters", user=settings.nats_user,
                                password=password)
    failed = 0
    try:
        records = await list_dead_letters(bus, stage, campaign, cause)
        print(f"{len(records)} dead letter(s)" + (f" of stage {stage}" if stage else "")
              + (f" in campaign {campaign}" if campaign else "")
              + (f" caused {cause_name(cause)}" if cause is not None else ""), file=out)
        deadline = asyncio.get_running_loop().time() + wait_s
        asked, answered = ({}, {}) if resend else \
            (await _by_seq(bus, "resend_requested", campaign), await _by_seq(bus, "resend_answered", campaign))
        for r in records:
            print(_line(r), file=out)
            if not resend:
                if history := _history(r, asked, answered):
                    print(history, file=out)
                continue
            try:
                left = max(1.0, deadline - asyncio.get_running_loop().time())
                event = await replay(bus, r, left)
                print(f"    sent back to {r.letter.subject} (event {event.id[:16]})", file=out)
            except (NotReplayable, NoAnswer) as e:
                failed += 1
                print(f"    not sent back: {e}", file=out)
    finally:
        await bus.close()
    return 1 if failed else 0

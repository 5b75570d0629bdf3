"""Sending dead letters back: the planner's answer to `kfactory dead-letters --replay`.

A person asks (ResendRequested on the events stream); the planner that drives the campaign judges the request
(`judge`), records its answer (ResendAnswered) and, if yes, puts the dead letter's work back on its stage's
subject. Requests for campaigns no planner knows are answered too, so the CLI never waits for nothing.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from kfactory.bus import deadletters
from kfactory.bus import events as ev
from kfactory.bus.deadletters import DeadLetterRecord, NotReplayable, finished_reason, work_of
from kfactory.platform.service import Service
from kfactory.services.planner.campaign import CampaignState
from kfactory.v1 import events_pb2 as pb


def judge(st: CampaignState, seq: int, record: DeadLetterRecord | None, finishing: str,
          max_event_bytes: int) -> pb.ResendAnswered:
    """The answer to a request to send dead letter `seq` back: accepted while campaign `st` runs and the
    letter ended one of its points that nothing has ended since. `record` is the dead letter (None when it
    is no longer on the DLQ stream), `finishing` why the campaign is ending though not finished yet (""
    if it is not)."""
    dead = ev.dead_work(record.letter) if record is not None else None
    point_id = dead[0] if dead else ""  # named in refusals too, for the report's dead-letter table

    def no(reason: str, named: bool = True) -> pb.ResendAnswered:
        return pb.ResendAnswered(dlq_seq=seq, accepted=False, point_id=point_id,
                                 reason=f"dead letter {seq}: {reason}" if named else reason)
    if st.finished is not None:
        return no(finished_reason(seq, st.id, st.finished), named=False)
    if finishing:
        return no(f"campaign {st.id} is ending ({finishing}), so nothing more is measured in it")
    if record is None:
        return no("it is no longer on the DLQ stream (sent back already, or deleted)")
    if record.campaign_id != st.id:
        return no(f"it belongs to campaign {record.campaign_id}, not to {st.id}")
    try:
        work_of(record, max_event_bytes)
    except NotReplayable as e:
        return no(str(e), named=False)  # its reason names the dead letter itself
    if point_id not in st.points:
        return no(f"its work is about no point of campaign {st.id}")
    if point_id not in st.dead_lettered:
        return no(f"its point {point_id} is not ended by a dead letter now (its work is out, was sent back "
                  "already, or has ended since)")
    return pb.ResendAnswered(dlq_seq=seq, accepted=True, point_id=point_id, subject=record.letter.subject)


class ResendDesk:
    """Answers requests to send dead letters back, one at a time, each in its own task."""

    def __init__(self, svc: Service, campaigns: dict[str, CampaignState], fold: Callable[[pb.Event], None]):
        """`fold` applies an event to the planner's state (StreamReplay.apply): the answer is folded in before
        it is published, as every event the planner publishes."""
        self.svc, self.campaigns, self.fold = svc, campaigns, fold
        #: requests to send back dead letters of campaigns this planner does not know: (campaign, DLQ sequence)
        self.strays: set[tuple[str, int]] = set()
        self._lock = asyncio.Lock()
        self._answering: set[asyncio.Task] = set()

    def answer_later(self, cid: str, seq: int) -> None:
        """Answer the request for dead letter `seq` of campaign `cid` in a task of its own."""
        task = asyncio.create_task(self._answer(cid, seq))
        self._answering.add(task)
        task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task) -> None:
        self._answering.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # the request stays unanswered in the fold; the next life of the planner answers it
            self.svc.log.error("answering a request to send a dead letter back failed", error=repr(task.exception()))

    def _pending(self, cid: str, seq: int, st: CampaignState | None) -> bool:
        return seq in st.resend_requests if st is not None else (cid, seq) in self.strays

    async def _answer(self, cid: str, seq: int) -> None:
        """Decide whether dead letter `seq` goes back to its stage (`judge`), record the answer and, if yes,
        send it back. The decision and the point's return to flight happen with no await between them, so the
        campaign cannot finish in between and then miss the work's outcome."""
        bus = self.svc.bus
        async with self._lock:
            st = self.campaigns.get(cid)
            if not self._pending(cid, seq, st):
                return  # answered meanwhile
            record = await deadletters.fetch(bus, seq)
            if st is None:
                answer = pb.ResendAnswered(dlq_seq=seq, reason=f"dead letter {seq}: no campaign {cid} is known "
                                                               "to the planner")
            else:
                answer = judge(st, seq, record, st.finishing(), bus.max_event_bytes)
            event = ev.make_event(cid, self.svc.name, str(seq), resend_answered=answer)
            self.fold(event)
            await bus.publish(event)
            if answer.accepted and record is not None:  # judge accepts only a record it has
                await deadletters.send_back(bus, record)
                self.svc.log.info("dead letter sent back", campaign=cid, seq=seq, point=answer.point_id)

"""Consuming work, the same on every bus: decode, run the handler (heartbeats, outages, a time limit), settle.

A bus implementation (kfactory/bus/jetstream.py, kfactory/bus/memory.py) only fetches messages; each one goes
through `handle`, so both buses give a message the same fate: Ack acks it; Nak naks it with its delay, or on the
last allowed delivery dead-letters and terms it; Term dead-letters with the reason and terms it; Leave leaves it
to ack_wait. A handler that raises is retried with a doubling delay and dead-lettered on its last delivery;
one whose result may not be published (PublishNotPermitted, NotInTopology) or can never fit (PayloadTooLarge) is
dead-lettered at once, since every delivery would fail the same way.
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from kfactory.bus import events as ev
from kfactory.bus.errors import OUTAGE, TRANSIENT, HandlerStuck, PayloadTooLarge, PublishNotPermitted
from kfactory.bus.outcomes import Ack, Delivery, Handler, Leave, Message, Nak, Outcome, Term, log, term_quietly
from kfactory.observability import metrics
from kfactory.observability import tracing as telemetry
from kfactory.v1 import events_pb2 as pb

if TYPE_CHECKING:
    from kfactory.bus.base import Bus

#: how long a handler is retried in place through an outage (OUTAGE) before the message is nak'ed
OUTAGE_WAIT_S = 60.0


async def handle(bus: Bus, stage: str, msg: Message, handler: Handler) -> None:
    """Give one work message of `stage` its fate (see the module docstring)."""
    deliveries = msg.metadata.num_delivered
    campaign = msg.subject.rsplit(".", 1)[-1]
    try:
        event = ev.decode_event(msg.data, msg.subject, bus.max_event_bytes)
    except ev.BadEvent as e:  # can never succeed: no retry, the reason goes with it
        await bus.dead_letter(stage, msg.subject, msg.data, str(e), deliveries, campaign,
                              msg.metadata.sequence.stream, pb.UNDECODABLE)
        await msg.term()
        return
    t0 = asyncio.get_running_loop().time()
    metrics.taken(stage, event)
    with telemetry.consumer_span(stage, msg.subject, msg.headers, event, **{"kf.deliveries": deliveries}) as span:
        outcome, failed = await _handle_event(bus, stage, msg, event, deliveries, handler)
        name = "error" if failed else type(outcome).__name__.lower()
        telemetry.mark_outcome(span, name, getattr(outcome, "reason", ""))
    metrics.stage_done(stage, name, asyncio.get_running_loop().time() - t0, ev.candidate_of(event) is not None)


async def _handle_event(bus: Bus, stage: str, msg: Message, event: pb.Event, deliveries: int,
                        handler: Handler) -> tuple[Outcome, bool]:
    """Run the handler and settle the message; returns (outcome, whether the handler raised)."""
    from kfactory.bus.base import traceparent

    token = traceparent.set(telemetry.current_traceparent() or (msg.headers or {}).get("traceparent", ""))
    failed = True
    try:
        outcome = await _run_through_outages(bus, Delivery(event, msg.subject, deliveries, msg), handler)
        failed = False
    except asyncio.CancelledError:
        await _quiet_nak(msg, 0)
        raise
    except PublishNotPermitted as e:  # the same on every delivery, until the deployment's roles change
        log.error("handler may not publish its result", stage=stage, subject=msg.subject, error=str(e))
        outcome = Term(str(e), pb.PUBLISH_NOT_PERMITTED)
    except PayloadTooLarge as e:  # the same bytes on every delivery: retrying cannot make them fit
        log.error("handler's result is too large to publish", stage=stage, subject=msg.subject, error=str(e))
        outcome = Term(f"{stage}: {e}", pb.RESULT_TOO_LARGE)
    except HandlerStuck as e:  # logged where it was cancelled, with where it waited
        outcome = retry_later(bus, f"handler stuck: {e}", deliveries)
    except Exception as e:  # noqa: BLE001 (a bug or an outage in our own code: retried, then dead-lettered)
        log.exception("handler failed", stage=stage, subject=msg.subject, deliveries=deliveries)
        outcome = retry_later(bus, f"handler error: {e!r}", deliveries)
    finally:
        traceparent.reset(token)
    try:
        await settle(bus, stage, msg, event, outcome, deliveries)
    except TRANSIENT as e:  # the ack (or nak) was lost with the connection: the server redelivers after
        # ack_wait and the handler, idempotent, publishes nothing new the second time
        log.warning("settling a message failed; it will be redelivered", stage=stage, subject=msg.subject,
                    outcome=type(outcome).__name__, error=repr(e))
    return outcome, failed


def retry_later(bus: Bus, reason: str, deliveries: int) -> Outcome:
    """A failed delivery's fate: again after a doubling delay, or its dead letter on the last delivery."""
    if deliveries >= bus.max_deliver:
        return Term(f"{reason} (after {deliveries} deliveries)", pb.DELIVERIES_EXHAUSTED)
    return Nak(min(30.0, 0.5 * 2 ** deliveries), reason)


async def settle(bus: Bus, stage: str, msg: Message, event: pb.Event, outcome: Outcome, deliveries: int) -> None:
    """Ack, nak or term the message as its outcome says, dead-lettering first where it ends unfinished."""
    if isinstance(outcome, Leave):
        return  # if no newer delivery exists after all, ack_wait redelivers it and the work is redone
    if isinstance(outcome, Ack):
        await msg.ack()
        return
    if isinstance(outcome, Nak) and deliveries < bus.max_deliver:
        await msg.nak(delay=outcome.delay_s)
        return
    if isinstance(outcome, Nak):
        reason, cause = f"{outcome.reason} after {deliveries} deliveries (max_deliver)", pb.DELIVERIES_EXHAUSTED
    else:
        reason, cause = outcome.reason, outcome.cause
    await bus.dead_letter(stage, msg.subject, msg.data, reason, deliveries, event.campaign_id,
                          msg.metadata.sequence.stream, cause)
    await msg.term()


async def _run_through_outages(bus: Bus, delivery: Delivery, handler: Handler) -> Outcome:
    """Run the handler; while NATS or the claims store is briefly unreachable, run it again in place (it is
    idempotent) instead of spending the message's deliveries on an outage that is not its fault."""
    return await retrying(lambda: _run_with_heartbeat(bus, delivery, handler), OUTAGE, OUTAGE_WAIT_S, 0.2,
                          "a dependency is unreachable; retrying the message in place",
                          between=lambda: _quiet_in_progress(delivery), subject=delivery.subject)


async def _run_with_heartbeat(bus: Bus, delivery: Delivery, handler: Handler) -> Outcome:
    """Run the handler, telling the server it is in progress every ack_wait/3; past handler_timeout_s it is
    cancelled and HandlerStuck is raised."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(handler(delivery))
    deadline, beat = loop.time() + bus.handler_timeout_s, max(0.5, bus.ack_wait_s / 3)
    while True:
        try:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, min(beat, deadline - loop.time())))
        except asyncio.CancelledError:
            # the service is stopping: the handler must stop with it, not run on against a closed claims
            # store or bus (its message stays unacked and is delivered again)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        if done:
            return task.result()
        if loop.time() >= deadline:
            raise await _cancel_stuck(task, bus.handler_timeout_s, delivery.subject)
        await _quiet_in_progress(delivery)


async def decoded(bus: Bus, msg: Message, refused: Callable[[Message, ev.BadEvent], Awaitable[None]] | None
                  ) -> pb.Event | None:
    """The event a message of the events stream holds, or None after refusing it: a message that is no valid
    event (events.decode_event) is logged, handed to `refused` (msg, why) where given, and term'ed, so that no
    follower ever folds it and a replay meets it again only to refuse it again."""
    try:
        # the size limit of work (max_event_bytes) is not the events': a dead letter carries a work message and
        # its reason, so it can be larger than any work message
        return ev.decode_event(msg.data, msg.subject, max(bus.max_event_bytes, ev.MAX_EVENT_BYTES))
    except ev.BadEvent as e:
        log.error("refused an event on the events stream", subject=msg.subject[:200],
                  seq=msg.metadata.sequence.stream, why=str(e)[:500])
        if refused is not None:
            await refused(msg, e)
        await term_quietly(msg)
        return None


async def retrying(call, errors: tuple, budget_s: float, first_delay: float, what: str, between=None, **log_ctx):
    """await call(), again after a doubling delay (at most 2 s) while it raises one of `errors`, for up to
    budget_s; then the error is raised. `between` (a coroutine function) runs after each wait."""
    loop = asyncio.get_running_loop()
    deadline, delay = loop.time() + budget_s, first_delay
    while True:
        try:
            return await call()
        except errors as e:
            if loop.time() + delay > deadline:
                raise
            log.warning(what, error=repr(e), retry_in_s=delay, **log_ctx)
            await asyncio.sleep(delay)
            delay = min(2.0, delay * 2)
            if between is not None:
                await between()


async def _cancel_stuck(task: asyncio.Task, limit_s: float, subject: str) -> HandlerStuck:
    """Cancel a handler that ran past its limit; log, and return as the error, the awaits it was suspended in
    (innermost last): a handler that never returns is a missing timeout somewhere, and this names the place."""
    where = await_chain(task)
    task.cancel()
    # a handler that swallows its cancellation is abandoned here, not waited for: the worker must go on
    await asyncio.wait({task}, timeout=5.0)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it again as never retrieved
    log.error("handler stuck: cancelled", subject=subject, limit_s=limit_s, awaiting=where)
    return HandlerStuck(f"it ran past {limit_s:g} s (KFACTORY_HANDLER_TIMEOUT_S) and was cancelled while awaiting "
                        + (" > ".join(where[-3:]) if where else "nothing it could name"))


def await_chain(task: asyncio.Task) -> list[str]:
    """'function (file:line)' for each coroutine a suspended task is awaiting through, outermost first."""
    out: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        out.append(f"{frame.f_code.co_qualname} ({frame.f_code.co_filename}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


async def _quiet_in_progress(delivery: Delivery) -> None:
    try:
        await delivery.in_progress()
    except TRANSIENT as e:  # NATS away: if it stays away past ack_wait the message is redelivered (idempotent)
        log.warning("heartbeat failed", subject=delivery.subject, error=repr(e))


async def _quiet_nak(msg: Message, delay: float) -> None:
    import nats.errors

    try:
        await msg.nak(delay=delay)
    except nats.errors.Error as e:  # connection gone: the server redelivers after ack_wait anyway
        log.warning("nak failed", error=repr(e))

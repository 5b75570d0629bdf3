"""What can go wrong on the bus, by type: callers (and the consuming machinery) decide by the class, never by text.

TRANSIENT and OUTAGE are the NATS client's errors that mean "briefly unreachable"; the in-memory bus never raises
them, and the shared consuming code (kfactory/bus/consume.py) treats them the same on both.
"""
from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors

from kfactory.claims.base import ClaimsUnavailable

#: errors that mean "NATS is briefly unreachable" (a restart, a reconnect), not "this request is wrong":
#: publishes are retried on them (safe: every publish carries a Nats-Msg-Id) and pull loops wait them out
TRANSIENT = (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.StaleConnectionError,
             nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError,
             nats.js.errors.ServiceUnavailableError, asyncio.TimeoutError)
#: errors of a handler that mean a dependency (NATS, the claims store) is briefly unreachable
#: (nats' own TimeoutError only: a builtin TimeoutError from the handler's own work is not an outage)
OUTAGE = tuple(e for e in TRANSIENT if e is not asyncio.TimeoutError) + (ClaimsUnavailable,)


class BusUnavailable(RuntimeError):
    """NATS could not be reached or JetStream is not enabled there."""


class HandlerStuck(RuntimeError):
    """A handler ran past the bus's handler_timeout_s and was cancelled; its message is retried like any failed
    delivery (nak with backoff, dead-lettered after max_deliver) and the message says where it waited."""


class PublishNotPermitted(PermissionError):
    """This service's NATS user may not publish to the subject (security.PERMISSIONS says so). Checked before
    publishing: the server refuses such a message without a typed error (nats-py sees a publish timeout), so
    without the check a misconfigured role cost a minute of retries per message and left only a timeout."""


class NotInTopology(PublishNotPermitted):
    """Work sent to a stage that the sending services' roles do not queue (kfactory/bus/topology.py ROLES): a
    wiring bug, the same on every delivery, so the work is dead-lettered at once with the route named."""


class PayloadTooLarge(ValueError):
    """A message over the server's max_payload: it can never be published as it is, however often it is
    tried, so a handler that made it has its work dead-lettered at once with this reason (what was too large)."""


class ArtifactMissing(KeyError):
    """No artifact with that digest in the object store."""


class NoStream(LookupError):
    """A publish to a subject that no stream of the in-memory bus holds (NATS answers such a publish with no
    responders); kfactory only publishes to the work, events and dead-letter subjects."""

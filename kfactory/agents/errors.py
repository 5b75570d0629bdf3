"""Typed failures of an agent coder. Each maps to one RejectReason; `transient` ones are retried with backoff.

Failures are classified by what happened (an exception type of the HTTP client, an HTTP status, a stop reason
field), never by the text of an error message.
"""
from __future__ import annotations

from kfactory.v1 import events_pb2 as pb


class AgentFailure(Exception):
    """An agent produced no candidate. `reason` is the RejectReason the coder publishes."""
    reason: pb.RejectReason = pb.REJECT_REASON_UNSPECIFIED
    transient: bool = False


class AgentTimeout(AgentFailure):
    """The endpoint did not answer within the request timeout."""
    reason = pb.AGENT_TIMEOUT
    transient = True


class AgentRateLimited(AgentFailure):
    """HTTP 429; `retry_after` is the server's Retry-After in seconds (None when it sent none)."""
    reason = pb.AGENT_RATE_LIMITED
    transient = True

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class AgentUnavailable(AgentFailure):
    """Connection refused or reset, HTTP 5xx (transient), or credentials refused (401/403, not transient)."""
    reason = pb.AGENT_UNAVAILABLE

    def __init__(self, message: str, transient: bool = True):
        super().__init__(message)
        self.transient = transient


class AgentBadResponse(AgentFailure):
    """The endpoint answered, but not with a chat reply (HTTP 4xx other than 429, malformed JSON)."""
    reason = pb.AGENT_BAD_RESPONSE


class AgentRefused(AgentFailure):
    """The model refused: the API's refusal stop/finish reason or refusal field was set."""
    reason = pb.AGENT_REFUSED


class AgentNoCode(AgentFailure):
    """The reply held no kernel source for the entry point (garbage)."""
    reason = pb.AGENT_NO_CODE


class AgentNotConfigured(AgentFailure):
    """No endpoint or model is configured for agent coders."""
    reason = pb.AGENT_NOT_CONFIGURED


class StaticCheckFailed(AgentFailure):
    """The kernel source breaks a sandbox rule, names disallowed flags, or has an unreadable launch header."""
    reason = pb.STATIC_CHECK

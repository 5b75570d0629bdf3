"""The backend interface and the HTTP call every backend makes, with its failures typed by status and exception."""
from __future__ import annotations

import asyncio
import email.utils
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import httpx

from kfactory.agents.errors import AgentBadResponse, AgentRateLimited, AgentTimeout, AgentUnavailable


@dataclass
class Reply:
    """One chat reply: its text, the tokens the endpoint counted, and why it stopped."""
    text: str
    tokens_in: int
    tokens_out: int
    finish: str
    model: str
    refused: bool = False


class Backend(ABC):
    """One model API. `complete` sends a system prompt and the conversation so far and returns the reply."""
    name = ""

    def __init__(self, settings, client: httpx.AsyncClient):
        self.settings = settings
        self.client = client
        self.model = settings.llm_model or ""
        self.base_url = (settings.llm_base_url or "").rstrip("/")
        self.api_key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else ""

    @abstractmethod
    async def complete(self, system: str, messages: list[dict[str, str]]) -> Reply:
        """Ask the model; raises an AgentFailure subclass when no reply came back."""

    async def post(self, url: str, headers: dict[str, str], body: dict) -> dict:
        """POST JSON and return the JSON answer; every way this can fail becomes a typed AgentFailure."""
        timeout = self.settings.llm_timeout_s
        try:
            # httpx's timeout bounds each read; wait_for bounds the whole request (a server that trickles bytes)
            r = await asyncio.wait_for(self.client.post(url, json=body, headers=headers, timeout=timeout), timeout)
        except (httpx.TimeoutException, asyncio.TimeoutError) as e:
            raise AgentTimeout(f"{url}: no answer within {timeout:g} s") from e
        except httpx.TransportError as e:
            raise AgentUnavailable(f"{url}: {type(e).__name__}: {e}") from e
        if r.status_code == 429:
            raise AgentRateLimited(f"{url}: HTTP 429", parse_retry_after(r.headers.get("retry-after")))
        if r.status_code in (401, 403):
            raise AgentUnavailable(f"{url}: HTTP {r.status_code}: credentials refused (KFACTORY_LLM_API_KEY)",
                                   transient=False)
        if r.status_code == 408 or r.status_code >= 500:
            raise AgentUnavailable(f"{url}: HTTP {r.status_code}")
        if r.status_code >= 400:
            raise AgentBadResponse(f"{url}: HTTP {r.status_code}: {r.text[:300]}")
        try:
            data = r.json()
        except ValueError as e:
            raise AgentBadResponse(f"{url}: the answer is not JSON: {r.text[:200]!r}") from e
        if not isinstance(data, dict):
            raise AgentBadResponse(f"{url}: the answer is JSON but not an object")
        return data


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: either delta-seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def field(data: dict, *path, kind=None):
    """data[path...], raising AgentBadResponse naming the path when it is missing or of the wrong type."""
    cur = data
    for key in path:
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError) as e:
            raise AgentBadResponse(f"the reply has no {'.'.join(map(str, path))}") from e
    if kind is not None and not isinstance(cur, kind):
        raise AgentBadResponse(f"the reply's {'.'.join(map(str, path))} is {type(cur).__name__}, not {kind.__name__}")
    return cur


def usage(data: dict, tokens_in: str, tokens_out: str) -> tuple[int, int]:
    """(prompt, reply) tokens from the reply's optional `usage` object (0 where the endpoint counts none);
    AgentBadResponse when it is there but not an object of whole numbers."""
    counts = data.get("usage") or {}
    try:
        return int(counts.get(tokens_in) or 0), int(counts.get(tokens_out) or 0)
    except (AttributeError, TypeError, ValueError) as e:
        raise AgentBadResponse(f"the reply's usage is unreadable: {counts!r:.200}") from e

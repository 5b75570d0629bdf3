"""One agent task: prompt -> model (with retries and backoff) -> kernel that passed the static checks, or a typed
failure. Tokens are counted over every attempt, whatever the outcome."""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from kfactory.agents import extract as ex
from kfactory.agents.backends import Backend, Reply
from kfactory.agents.errors import AgentFailure, AgentNoCode, AgentRateLimited, AgentRefused, StaticCheckFailed
from kfactory.agents.prompt import Prompt, reask
from kfactory.v1 import events_pb2 as pb


@dataclass
class AgentWork:
    """The outcome of one task: a kernel or a failure, and what the work cost (info)."""
    info: pb.AgentInfo
    kernel: ex.Kernel | None = None
    failure: AgentFailure | None = None
    replies: list[str] = field(default_factory=list)
    #: set by the caller: how the kernel is compiled when the reply names no flags
    language: str = "c"
    entry: str = "kernel"
    parent_flags: str = ""


class Agent:
    """A persona speaking to one backend. `write` never raises an AgentFailure: it returns it in AgentWork."""

    def __init__(self, backend: Backend, settings, persona: str, rng: random.Random | None = None):
        self.backend, self.settings, self.persona = backend, settings, persona
        self.rng = rng or random.Random()

    async def write(self, prompt: Prompt, language: str, entry: str, target: str,
                    parent_launch: dict | None) -> AgentWork:
        """Ask for a kernel; re-ask (settings.llm_reask times) when the reply holds none or it fails a check."""
        info = pb.AgentInfo(backend=self.backend.name, model=self.backend.model, persona=self.persona,
                            prompt_digest=prompt.digest)
        work = AgentWork(info)
        t0 = time.monotonic()
        messages = [{"role": "user", "content": prompt.user}]
        try:
            for ask in range(self.settings.llm_reask + 1):
                reply = await self._call(prompt.system, messages, info)
                work.replies.append(reply.text)
                info.finish = reply.finish
                if reply.refused:
                    raise AgentRefused(f"the model refused (finish {reply.finish or 'refusal'})")
                try:
                    source, flags = ex.extract(reply.text, language, entry)
                    work.kernel = ex.check(source, flags, target, parent_launch)
                    return work
                except (AgentNoCode, StaticCheckFailed) as e:
                    if ask == self.settings.llm_reask:
                        raise
                    messages += [{"role": "assistant", "content": reply.text},
                                 {"role": "user", "content": reask(str(e), language, entry)}]
        except AgentFailure as e:
            work.failure = e
        finally:
            info.seconds = time.monotonic() - t0
        return work

    async def _call(self, system: str, messages: list[dict], info: pb.AgentInfo) -> Reply:
        """One reply, retrying transient failures (timeouts, 429 after its Retry-After, 5xx, refused connections)
        with exponential backoff and jitter; the last failure is raised as it is."""
        s = self.settings
        for attempt in range(s.llm_retries + 1):
            info.attempts += 1
            try:
                reply = await self.backend.complete(system, messages)
            except AgentFailure as e:
                if not e.transient or attempt == s.llm_retries:
                    raise
                delay = s.llm_backoff_s * 2 ** attempt * (0.5 + self.rng.random())
                if isinstance(e, AgentRateLimited) and e.retry_after is not None:
                    if e.retry_after > s.llm_max_wait_s:
                        raise
                    delay = e.retry_after
                await asyncio.sleep(delay)
                continue
            info.tokens_in += reply.tokens_in
            info.tokens_out += reply.tokens_out
            return reply
        raise AssertionError("unreachable: the loop returns or raises")

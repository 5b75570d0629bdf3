"""The coder's agent consumers: one per persona, each on its own work subject (agent_<persona>).

A task (a PointProposed with `agent` set) names the parents; the consumer reads their evidence and memory's
lessons, builds the persona's prompt, asks the model, and emits the kernel as a candidate like any other, or a
Rejected with the typed failure and what the call cost. A model never stalls a campaign: every attempt has a
timeout, retries are bounded, and every outcome is a published result.
"""
from __future__ import annotations

import json

import httpx

from kfactory.bus import events as ev
from kfactory.agents import PERSONAS, Agent, AgentWork
from kfactory.agents import evidence, prompt as prompts
from kfactory.agents.backends import get_backend
from kfactory.agents.errors import AgentNotConfigured
from kfactory.bus.outcomes import Ack, Delivery, Leave, Nak, Outcome
from kfactory.observability import metrics
from kfactory.v1 import events_pb2 as pb

#: first nak delay while memory catches up with a parent's result (doubled on each delivery)
EVIDENCE_WAIT_S = 0.5


class AgentConsumers:
    """Handlers for the persona work subjects, sharing one HTTP client and the coder's emit path."""

    def __init__(self, coder):
        self.coder = coder
        self.settings = coder.settings
        self.client: httpx.AsyncClient | None = None

    def http(self) -> httpx.AsyncClient:
        if self.client is None:
            self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=8 * self.settings.llm_concurrency))
        return self.client

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def handle(self, persona: str, d: Delivery) -> Outcome:
        """One agent task: ask the model once per task (a redelivery after the result was published is acked),
        nak while memory has not archived a parent's result, publish a candidate or a typed rejection (unless a
        newer holder of the task's fenced lock took over while the model was answering: then Leave)."""
        pp, cid = d.event.point_proposed, d.event.campaign_id
        done_key = f"{cid}:agent-done:{pp.point_id}"
        if await self.coder.claims.cache_get(done_key):
            return Ack()  # a redelivery after the result was published: the model is not asked twice
        async with self.coder.stage_lock(d, pp.point_id) as lock:
            if lock is None:
                return self.coder.busy()
            if not self.settings.llm_configured():
                work = AgentWork(pb.AgentInfo(persona=persona, backend=self.settings.llm_provider),
                                 failure=AgentNotConfigured("no model configured: set KFACTORY_LLM_BASE_URL and "
                                                            "KFACTORY_LLM_MODEL (or --llm-base-url/--llm-model)"))
            else:
                try:
                    work = await self._work(persona, pp, cid)
                except evidence.EvidenceNotReady as e:
                    # memory follows the events stream and may lag (or restart): wait longer on each delivery
                    delay = min(self.settings.ack_wait_s, EVIDENCE_WAIT_S * 2 ** max(0, d.deliveries - 1))
                    self.coder.log.info("parent evidence not archived yet", reason=str(e), retry_in_s=delay)
                    return Nak(delay, f"parent evidence not archived yet: {e}")
            info = work.info  # tokens spent, failed or not, stale or not: the metrics endpoint counts them all
            metrics.count_tokens(f"agent_{info.persona}", info.model, prompt=info.tokens_in,
                                 completion=info.tokens_out)
            if not await self.coder.still_ours(lock):
                self.coder.log.warning("agent task taken over while the model answered; its result is dropped",
                                       persona=persona, tokens=info.tokens_in + info.tokens_out)
                return Leave()  # a newer holder of this task's lock (its delivery redelivered) publishes and acks
            await self._publish(pp, cid, work)
            await self.coder.claims.cache_put(done_key, b"1", ttl_s=7 * 86400)
            return Ack()

    async def _work(self, persona: str, pp: pb.PointProposed, cid: str) -> AgentWork:
        ctx = self.coder.ctx
        problem = ctx.problem(pp.problem)
        addr = ctx.memory_addr or self.settings.memory_addr
        parents = await evidence.parents(addr, self.settings, self.coder.bus, cid, list(pp.parents), problem,
                                         pp.agent.device)
        lessons = await evidence.lessons(addr, self.settings, problem.name, pp.target.split(":")[0])
        family = problem.families.get(pp.family)
        p = prompts.build(PERSONAS[persona], problem, pp.target, pp.agent.device, parents, lessons, family)
        await self.coder.bus.put_artifact(p.text.encode())  # stored under its digest, which the candidate records
        backend = get_backend(self.settings.llm_provider, self.settings, self.http())
        language = family.spec.language if family is not None else ("cuda" if pp.target.startswith("cuda") else "c")
        entry = family.spec.entry if family is not None else "kernel"
        first = parents[0] if parents else {}
        launch = json.loads(first["launch"]) if first.get("launch") else None
        work = await Agent(backend, self.settings, persona).write(p, language, entry, pp.target, launch)
        if work.replies:
            work.info.reply_digest = await self.coder.bus.put_artifact(work.replies[-1].encode())
        work.language, work.entry = language, entry
        work.parent_flags = first.get("flags", "")
        return work

    async def _publish(self, pp: pb.PointProposed, cid: str, work: AgentWork) -> None:
        if work.failure is not None:
            self.coder.log.warning("agent produced no candidate", persona=work.info.persona,
                                   reason=pb.RejectReason.Name(work.failure.reason), error=str(work.failure))
            rej = pb.Rejected(stage="coder", reason=work.failure.reason, point_id=pp.point_id, params_json="{}",
                              message=f"{type(work.failure).__name__}: {work.failure}"[:2000], agent=work.info)
            await self.coder.bus.publish(ev.make_event(cid, self.coder.name, pp.point_id, rejected=rej))
            return
        k = work.kernel
        assert k is not None  # Agent.write returns a kernel or a failure
        flags = k.flags if k.flags is not None else work.parent_flags
        launch_json = ev.canonical_json(k.launch) if k.launch else ""
        await self.coder.emit(pp, cid, k.source, work.language, flags, work.entry, 1, launch_json,
                              agent=work.info, params_json="{}")

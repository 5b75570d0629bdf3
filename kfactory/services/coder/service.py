"""The coder: design point -> candidate (a family template rendered at the point, or a given source), and
agent coders (LLMs) writing kernels from parent candidates, one consumer per persona
(kfactory/services/coder/agents.py)."""
from __future__ import annotations

import asyncio
import json

from kfactory.bus import events as ev
from kfactory.engines.stages import coder as engine_coder
from kfactory.engines.stages import is_engine
from kfactory.observability import tracing as telemetry
from kfactory.agents import PERSONAS, persona_stage
from kfactory.bus.outcomes import Ack, Delivery, Outcome
from kfactory.bus.topology import Stage
from kfactory.platform.grpcserver import clip
from kfactory.problems import ProblemError
from kfactory.platform.service import Service
from kfactory.v1 import events_pb2 as pb
from kfactory.services.coder.agents import AgentConsumers


class CoderService(Service):
    name = "coder"
    stage = "coder"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.agents = AgentConsumers(self)

    async def run(self, stop: asyncio.Event) -> None:
        """The template consumer and one consumer per agent persona, side by side. Persona consumers run even
        without a configured model, so agent work that reaches them gets a typed answer, never a wait."""
        await self.setup()
        n = self.settings.llm_concurrency
        await asyncio.gather(self.bus.consume(self.stage, self._handle, self.settings.workers, stop),
                             *(self.bus.consume(persona_stage(p), self._handle, n, stop) for p in PERSONAS))

    async def close(self) -> None:
        await self.agents.close()

    async def handle(self, d: Delivery) -> Outcome:
        pp = d.event.point_proposed
        cid = d.event.campaign_id
        if pp.HasField("agent") and pp.agent.persona in PERSONAS:
            # agent work normally comes on its persona's subject; on the coder's (an older planner re-queued it
            # there) it is handled here too: the coder's NATS user may not send work to the persona subjects
            return await self.agents.handle(pp.agent.persona, d)
        try:
            problem = self.ctx.problem(pp.problem)
            if is_engine(problem) and not pp.HasField("manual"):
                # a whole engine's design (kfactory/engines/stages): it reads its searched kernels from memory,
                # off the event loop
                settings = self.settings   # memory as the CLI's queries reach it; this process's own when it serves
                if self.ctx.memory_addr:
                    settings = settings.model_copy(update={"memory_addr": self.ctx.memory_addr})
                rendered = await asyncio.to_thread(engine_coder.render, problem, pp.params_json, settings)
            else:
                rendered = self._render(pp)
            source, language, flags, entry, threads, launch_json = rendered
        except (ProblemError, KeyError, ValueError) as e:
            # clipped: the message quotes the point, whose whole params are in params_json beside it
            rej = pb.Rejected(stage="coder", reason=pb.INVALID_POINT, message=clip(str(e)), point_id=pp.point_id,
                              params_json=pp.params_json)
            await self.bus.publish(ev.make_event(cid, self.name, pp.point_id, rejected=rej))
            return Ack()
        await self.emit(pp, cid, source, language, flags, entry, threads, launch_json)
        return Ack()

    async def emit(self, pp: pb.PointProposed, cid: str, source: str, language: str, flags: str, entry: str,
                   threads: int, launch_json: str, agent: pb.AgentInfo | None = None,
                   params_json: str | None = None) -> None:
        """Publish the candidate written for a point and queue it for the compiler (or a DUPLICATE rejection
        when an earlier point of the campaign produced the same content)."""
        if why := self.settings.oversized(source):  # a runaway template or agent: refused before the artifact store
            rej = pb.Rejected(stage="coder", reason=pb.INVALID_POINT, point_id=pp.point_id, agent=agent,
                              params_json=pp.params_json if params_json is None else params_json,
                              message=f"the source is {why}: write a smaller kernel")
            await self.bus.publish(ev.make_event(cid, self.name, pp.point_id, rejected=rej))
            return
        cand_id = ev.candidate_id(source, language, flags, entry, threads, pp.target, launch_json)
        cand = pb.Candidate(id=cand_id, campaign_id=cid, problem=pp.problem, target=pp.target, family=pp.family,
                            point_id=pp.point_id, params_json=pp.params_json if params_json is None else params_json,
                            language=language, compile_flags=flags, entry=entry, threads=threads, origin=pp.origin,
                            parents=pp.parents, runner_threads=pp.runner_threads, launch_json=launch_json,
                            agent=agent)
        # the candidate's journey continues the trace the planner's proposal of this point started
        telemetry.annotate(candidate=cand_id)
        cand.source_digest = await self.bus.put_artifact(source.encode())
        if not await self.claims.claim_once(f"{cid}:candidate:{cand_id}"):
            # same content as an earlier point: a result for this point, not a second run of the device
            first = await self.claims.cache_get(f"{cid}:candidate-point:{cand_id}")
            if first != pp.point_id.encode():
                rej = pb.Rejected(candidate=cand, stage="coder", reason=pb.DUPLICATE, point_id=pp.point_id,
                                  params_json=cand.params_json, agent=agent,
                                  message=f"renders the same candidate as point {(first or b'?').decode()}")
                await self.bus.publish(ev.make_event(cid, self.name, pp.point_id, rejected=rej))
                return
        await self.claims.cache_put(f"{cid}:candidate-point:{cand_id}", pp.point_id.encode(), ttl_s=7 * 86400)
        created = ev.make_event(cid, self.name, cand_id, candidate_created=pb.CandidateCreated(candidate=cand))
        await self.bus.publish(created)
        await self.bus.send_work(Stage.COMPILER, created)

    def _render(self, pp: pb.PointProposed) -> tuple[str, str, str, str, int, str]:
        """(source, language, flags, entry, threads, launch rule as canonical JSON or "")."""
        problem = self.ctx.problem(pp.problem)
        if pp.HasField("manual"):
            m = pp.manual
            return m.source, m.language or "c", m.compile_flags, "kernel", m.threads or 1, m.launch_json
        fam = problem.families.get(pp.family)
        if fam is None:
            raise ProblemError(f"problem {pp.problem} has no family {pp.family!r}")
        params = json.loads(pp.params_json)
        if not fam.valid(params):
            raise ProblemError(f"point {params} is not a valid point of family {fam.name}")
        source, flags, threads = fam.render(params)
        rule = fam.launch_rule(params)
        return source, fam.spec.language, flags, fam.spec.entry, threads, ev.canonical_json(rule) if rule else ""

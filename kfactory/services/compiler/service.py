"""The compiler: candidate -> artifact + resource report, or a typed compile failure."""
from __future__ import annotations

from kfactory.bus import events as ev
from kfactory.bus.outcomes import Ack, Delivery, Leave, Nak, Outcome, Term
from kfactory.bus.errors import ArtifactMissing
from kfactory.bus.topology import Stage
from kfactory.engines.stages import is_engine
from kfactory.engines.stages.compiler import compile_engine
from kfactory.judge.screening import prune
from kfactory.judge.order import compile_workers, first_judge_stage
from kfactory.platform.service import Service
from kfactory.targets.base import CompilerInterrupted
from kfactory.v1 import events_pb2 as pb


#: seconds before a compile a signal stopped is delivered again (a shutdown is usually over by then)
INTERRUPTED_RETRY_S = 5.0


class CompilerService(Service):
    name = "compiler"
    stage = "compiler"

    async def run(self, stop) -> None:
        """Compile several candidates at once (compile_workers; each compile runs in its own thread and process),
        so compiles run ahead of the device instead of one after another."""
        await self.setup()
        await self.bus.consume(self.stage, self._handle, max(self.settings.workers, compile_workers(self.settings)),
                               stop)

    async def handle(self, d: Delivery) -> Outcome:
        cand = pb.Candidate()
        cand.CopyFrom(d.event.candidate_created.candidate)
        try:
            source = (await self.bus.get_artifact(cand.source_digest)).decode()
        except ArtifactMissing:
            return Term(f"source {cand.source_digest} of candidate {cand.id} is not in the artifact store",
                        pb.INPUT_MISSING)
        async with self.stage_lock(d, cand.id) as lock:
            if lock is None:
                return self.busy()
            target, problem = self.ctx.target(cand.target), self.ctx.problem(cand.problem)
            engine = is_engine(problem)  # a whole engine is built by kfactory/engines/stages/compiler.py
            try:
                if engine:
                    res = await self.work(compile_engine, source, cand.params_json, self.settings.data_dir,
                                          part="compile")
                else:
                    res = await self.work(target.compile, source, cand.language, cand.compile_flags, cand.entry)
            except CompilerInterrupted as e:   # a Ctrl-C or a shutdown, not the source: compiled again later
                self.log.warning("compile interrupted; redelivered", candidate=cand.id, error=str(e))
                return Nak(INTERRUPTED_RETRY_S, str(e))
            if not await self.still_ours(lock):
                return Leave()  # a newer holder of this candidate's lock writes the result (and acks)
            cand.fence = lock.fence
            if res.log:
                res.report.log_digest = await self.bus.put_artifact(res.log.encode())
            cid = d.event.campaign_id
            if res.ok:  # multi-fidelity: what cannot launch or will spill never reaches a GPU
                why = prune(res.report, ev.launch_of(cand), problem)
                if why:
                    res.ok, res.reason, res.message = False, pb.RESOURCE_LIMIT, f"pruned: {why}"
            if not res.ok:
                failed = pb.CompileFailed(candidate=cand, reason=res.reason, report=res.report, message=res.message)
                await self.bus.publish(ev.make_event(cid, self.name, cand.id, compile_failed=failed))
                return Ack()
            digest = await self.bus.put_artifact(res.artifact)
            done = ev.make_event(cid, self.name, cand.id,
                                 compiled=pb.Compiled(candidate=cand, artifact_digest=digest, report=res.report))
            await self.bus.publish(done)
            # the search's candidates are screened by a short timing before they are verified (kfactory/judge/order.py)
            # (an engine is verified first: no short kernel timing screens it)
            await self.bus.send_work(Stage.VERIFIER if engine else first_judge_stage(cand, self.settings, target),
                                     done)
            return Ack()

"""The verifier: artifact -> correctness verdict with every check's figures (runs kernels only in runners)."""
from __future__ import annotations

from kfactory.bus import events as ev
from kfactory.bus.errors import ArtifactMissing
from kfactory.bus.outcomes import Ack, Delivery, Leave, Outcome, Term
from kfactory.bus.topology import Stage
from kfactory.engines.stages import is_engine
from kfactory.engines.stages.verifier import verify_engine
from kfactory.judge.verify import drawn_ahead, verify
from kfactory.platform.service import RunnerService
from kfactory.v1 import events_pb2 as pb


class VerifierService(RunnerService):
    name = "verifier"
    stage = "verifier"

    async def handle(self, d: Delivery) -> Outcome:
        comp = d.event.compiled
        cand = pb.Candidate()
        cand.CopyFrom(comp.candidate)
        try:
            artifact = await self.bus.get_artifact(comp.artifact_digest)
        except ArtifactMissing:
            return Term(f"artifact {comp.artifact_digest} of candidate {cand.id} is not in the artifact store",
                        pb.INPUT_MISSING)
        async with self.stage_lock(d, cand.id) as lock:
            if lock is None:
                return self.busy()
            problem = self.ctx.problem(cand.problem)
            device = await self.ctx.device(cand.target)
            if is_engine(problem):  # a whole engine: kfactory/engines/stages/verifier.py, in the engine's child
                async with self.device(device.device_id) as held:
                    verdict = await self.work(verify_engine, problem, cand, artifact, self.settings.data_dir,
                                              part="verify")
            else:
                session = self.session(cand)
                session.load_artifact(cand.id, artifact, cand.entry, ev.launch_of(cand))
                pool = await self.verification_pool(cand.problem)
                if self.settings.draw_ahead:  # drawn and referenced before the device is held, not while
                    pool = await self.work(drawn_ahead, session, problem, pool, part="ahead")
                async with self.device(device.device_id) as held:
                    verdict = await self.work(verify, session, cand.id, problem, pool)
                    # a warm runner keeps no module of a candidate it is done with (issue 23)
                    await self.work(session.unload, cand.id, part="unload")
            if not await self.still_ours(lock):
                return Leave()  # a newer holder of this candidate's lock writes the result (and acks)
            cand.fence = lock.fence
            # its device time: the verification's, not the wait for the device (a campaign's budget counts it)
            return await self._publish(d, cand, comp.artifact_digest, verdict, held.seconds)

    async def _publish(self, d: Delivery, cand: pb.Candidate, digest: str, verdict, seconds: float) -> Outcome:
        cid = d.event.campaign_id
        if not verdict.passed:
            rej = pb.Rejected(candidate=cand, stage="verifier", reason=verdict.reason, message=verdict.message,
                              checks=verdict.checks, point_id=cand.point_id, params_json=cand.params_json)
            rej.figures["verify_seconds"] = seconds
            await self.bus.publish(ev.make_event(cid, self.name, cand.id, rejected=rej))
            return Ack()
        done = ev.make_event(cid, self.name, cand.id, verified=pb.Verified(
            candidate=cand, artifact_digest=digest, checks=verdict.checks, seconds=seconds))
        await self.bus.publish(done)
        await self.bus.send_work(Stage.BENCHMARKER, done)
        return Ack()

"""The benchmarker: verified artifact -> timing statistics; final interleaved comparisons with baselines."""
from __future__ import annotations

import time

# the median's interval (kfactory.judge.stats) needs scipy.stats, which that module imports where it is used so
# that the planner, compiler and coder start without it; the benchmarker imports it here, at its start: at its
# first summary it would be 0.8 s inside the first candidate's device lease, billed to that candidate
import scipy.stats  # noqa: F401

from kfactory.bus import events as ev
from kfactory.bus.origins import Origin
from kfactory.bus.errors import ArtifactMissing
from kfactory.bus.outcomes import Ack, Delivery, Leave, Outcome, Term
from kfactory.bus.topology import Stage
from kfactory.engines.stages import is_engine
from kfactory.engines.stages.benchmarker import measure_engine
from kfactory.judge.screening import screen, screen_ahead, screened_out
from kfactory.judge import objective, quiet
from kfactory.judge.checks import InputPool, timed_on_device
from kfactory.judge.measure import Timing, drawn_ahead, measure
from kfactory.judge.rotated import measure_rotated
from kfactory.judge.order import BEST_TTL_S, best_key, best_of, screen_key
from kfactory.platform.service import RunnerService
from kfactory.v1 import events_pb2 as pb


class BenchmarkerService(RunnerService):
    name = "benchmarker"
    stage = "benchmarker"

    async def handle(self, d: Delivery) -> Outcome:
        if d.event.HasField("compare_request"):
            return await self._compare(d)
        if d.event.HasField("compiled"):
            return await self._screen_first(d)
        v = d.event.verified
        cand = pb.Candidate()
        cand.CopyFrom(v.candidate)
        target = self.ctx.target(cand.target)
        device = await self.ctx.device(cand.target)
        cache_key = f"result:{cand.id}:{device.model}"
        # a later timing round (Verified.round >= 2: an engine campaign's --rounds) times the candidate again:
        # never answered from the result cache, never stored there, its own event beside the first measurement's
        retime = v.round >= 2
        async with self.stage_lock(d, cand.id) as lock:
            if lock is None:
                return self.busy()
            cached = None if retime else await self.claims.cache_get(cache_key)
            m = None if cached is None else self._rescored(pb.Measured.FromString(cached), cand)
            if m is not None:
                m.cached = True
            else:
                try:
                    artifact = await self.bus.get_artifact(v.artifact_digest)
                except ArtifactMissing:
                    return Term(f"artifact {v.artifact_digest} of candidate {cand.id} is missing", pb.INPUT_MISSING)
                m = await self._measure(cand, artifact, target, device)
                if isinstance(m, pb.Rejected):
                    if retime:   # which round faulted: a later round's fault is told apart from the first's
                        m.figures["round"] = v.round
                    return await self._reject(d, cand, m, lock, f"{cand.id}:round{v.round}" if retime else None)
                if not m.screened_out and not retime:  # a screening timing is this campaign's evidence only
                    await self.claims.cache_put(cache_key, m.SerializeToString(), ttl_s=30 * 86400)
            if not await self.still_ours(lock):
                return Leave()  # a newer holder of this candidate's lock writes the result (and acks)
            cand.fence = lock.fence
            m.candidate.CopyFrom(cand)
            m.round = v.round if retime else 0
            key = f"{cand.id}:round{v.round}" if retime else cand.id
            await self.bus.publish(ev.make_event(d.event.campaign_id, self.name, key, measured=m))
            return Ack()

    def _rescored(self, m: pb.Measured, cand: pb.Candidate) -> pb.Measured | None:
        """A measurement from the result cache scored under its problem's objective as it is now (a package's
        weights may have changed since it was cached); None where a shape the objective now scores was not timed
        then, so the candidate is measured again. An engine's score is its own (kfactory/engines/stages)."""
        problem = self.ctx.problem(cand.problem)
        return m if is_engine(problem) or objective.rescore(m, problem) else None

    async def _screen_first(self, d: Delivery) -> Outcome:
        """A compiled search candidate, before its verification (kfactory/judge/order.py): a short timing at the
        objective's screen shape (objective.screen_shape); one whose score can be no better than screen_factor x
        the campaign's best (objective.score_bound) is recorded as screened out (a measurement marked so, with
        that timing and the bound as its score) and is never verified; any other goes on to the verifier. Before
        anything was measured in full there is nothing to screen against, and it goes on at once."""
        comp = d.event.compiled
        cand = pb.Candidate()
        cand.CopyFrom(comp.candidate)
        async with self.stage_lock(d, cand.id) as lock:
            if lock is None:
                return self.busy()
            best = best_of(await self.claims.cache_get(best_key(cand.campaign_id)))
            m = None
            if best is not None:
                try:
                    artifact = await self.bus.get_artifact(comp.artifact_digest)
                except ArtifactMissing:
                    return Term(f"artifact {comp.artifact_digest} of candidate {cand.id} is not in the artifact store",
                                pb.INPUT_MISSING)
                m = await self._screen_timing(cand, artifact, best)
                if isinstance(m, pb.Rejected):  # it crashed or hung: a result like any other
                    return await self._reject(d, cand, m, lock)
            if not await self.still_ours(lock):
                return Leave()
            cand.fence = lock.fence
            if m is not None and m.screened_out:
                m.candidate.CopyFrom(cand)
                await self.bus.publish(ev.make_event(d.event.campaign_id, self.name, cand.id, measured=m))
                return Ack()
            if m is not None:  # passed: its full measurement after the verification need not screen it again, and
                # counts the screen's device time with its own
                await self.claims.cache_put(screen_key(cand.campaign_id, cand.id), repr(m.seconds).encode(),
                                            ttl_s=7 * 86400)
            await self.bus.send_work(Stage.VERIFIER, d.event)
            return Ack()

    async def _screen_timing(self, cand, artifact: bytes, best_s: float) -> pb.Measured | pb.Rejected:
        """The screen of a candidate not yet verified, under the device lease: a Measured (screened_out set when
        it cannot rank), or a typed rejection when the kernel faulted."""
        problem = self.ctx.problem(cand.problem)
        target = self.ctx.target(cand.target)
        device = await self.ctx.device(cand.target)
        session = self.session(cand)
        session.load_artifact(cand.id, artifact, cand.entry, ev.launch_of(cand))
        shape = objective.screen_shape(problem, device)
        await self._screen_sets_ahead(cand, session, problem, target, shape)
        async with self.device(device.device_id) as held:
            bar = objective.screen_bar(problem, shape, device, self.settings.screen_factor * best_s)
            res = await self.work(screen, session, cand.id, problem, shape, self.pool(cand.problem),
                                  target.cache_bytes(), self.settings, bar, part="screen")
            await self.work(session.unload, cand.id, part="unload")   # loaded again when it is measured
        if res.reason:
            rej = pb.Rejected(stage="benchmarker", reason=res.reason, message=res.message, point_id=cand.point_id,
                              params_json=cand.params_json)
            rej.figures["device_seconds"] = held.seconds
            return rej
        t = res.timings[cand.id]
        bound = objective.score_bound(problem, shape, t.median_s, device)
        return pb.Measured(device=device, timings=[t], score_s=bound, seconds=held.seconds,
                           objective=objective.by_name(problem),
                           screened_out=screened_out(bound, best_s, self.settings.screen_factor))

    async def _reject(self, d: Delivery, cand: pb.Candidate, rej: pb.Rejected, lock,
                      key: str | None = None) -> Outcome:
        if not await self.still_ours(lock):
            return Leave()
        cand.fence = lock.fence
        rej.candidate.CopyFrom(cand)
        await self.bus.publish(ev.make_event(d.event.campaign_id, self.name, key or cand.id, rejected=rej))
        return Ack()

    async def _measure(self, cand, artifact: bytes, target, device) -> pb.Measured | pb.Rejected:
        problem = self.ctx.problem(cand.problem)
        if is_engine(problem):  # a whole engine: kfactory/engines/stages/benchmarker.py, in the engine's child
            async with self.device(device.device_id) as held:
                # timed in the engine's child: on a cpu, the process's compiles keep off the cores meanwhile
                out = await self.work(quiet.timed, target.name == "cpu", measure_engine, problem, cand, artifact,
                                      self.settings.data_dir, device, part="measure")
            if isinstance(out, pb.Rejected):
                out.figures["device_seconds"] = held.seconds
            else:
                out.seconds = held.seconds
            return out
        session = self.session(cand)
        session.load_artifact(cand.id, artifact, cand.entry, ev.launch_of(cand))
        m = pb.Measured(device=device)
        # the device time of its screen before its verification, when it had one (kfactory/judge/order.py)
        raw = await self.claims.cache_get(screen_key(cand.campaign_id, cand.id))
        screened_before = float(raw) if raw is not None and self.settings.judge_order == "screen_first" else None
        pool = await self._ahead(cand, session, problem, target)
        if screened_before is None and self.settings.judge_order == "screen_first" and \
                best_of(await self.claims.cache_get(best_key(cand.campaign_id))) is not None:  # it may be screened now
            await self._screen_sets_ahead(cand, session, problem, target, objective.screen_shape(problem, device))
        async with self.device(device.device_id) as held:
            out = await self._time_in_full(cand, session, problem, target, device, m, screened_before is not None,
                                           pool)
            await self.work(session.unload, cand.id, part="unload")
        seconds = held.seconds + (screened_before or 0.0)
        if isinstance(out, pb.Rejected):
            out.figures["device_seconds"] = seconds
            return out
        m.seconds = seconds
        if m.screened_out:
            return m
        # what can rank is measured against the campaign's results, which the reference kernel is not (it is what
        # they are compared with); the order before issue 23 counted it too
        if cand.origin != Origin.REFERENCE.of() or self.settings.judge_order == "verify_first":
            await self._record_best(cand.campaign_id, m.score_s)
        return m

    async def _ahead(self, cand, session, problem, target, part: str = "ahead",
                     shapes: list[dict[str, int]] | None = None, kernels: int = 1) -> InputPool:
        """The problem's input pool, with the sets a measurement of `kernels` kernels at `shapes` (default: every
        optimisation shape) draws on the host drawn now, and its buffers made, before the device is held
        (Settings.draw_ahead; else the pool itself); `part` names the work in the stage-time ledger."""
        pool = self.pool(cand.problem)
        if not self.settings.draw_ahead:
            return pool
        return await self.work(drawn_ahead, session, problem, shapes or problem.shapes("optimize"), pool,
                               target.cache_bytes(), kernels, part=part)

    async def _screen_sets_ahead(self, cand, session, problem, target, shape: dict[str, int]) -> None:
        """The problem's screening sets at `shape` drawn (InputPool.ahead_screen: once in the pool's life) and the
        session's buffers for a screen made (judge.screening.screen_ahead) before the device is held, unless drawing
        ahead or screening is off, or the session's device draws the sets itself."""
        if self.settings.draw_ahead and self.settings.screen_max_s and \
                not timed_on_device(session, problem, shape):
            await self.work(screen_ahead, session, self.pool(cand.problem), problem, shape, target.cache_bytes(),
                            part="ahead")

    async def _time_in_full(self, cand, session, problem, target, device, m: pb.Measured,
                            screened_before: bool, pool: InputPool) -> pb.Measured | pb.Rejected:
        """Under the lease: the screen (unless the candidate had one before its verification), then the timing
        at every optimisation shape; m, screened out or with every shape's timing and the objective's score, or a
        typed rejection."""
        m.objective.update(objective.by_name(problem))
        if not screened_before and await self._screen(cand, session, problem, target, device, m):
            return m
        for shape in problem.shapes("optimize"):
            res = await self.work(measure, session, [cand.id], problem, shape, pool, target.cache_bytes(),
                                  self.settings, None, device)
            if res.reason:
                rej = pb.Rejected(stage="benchmarker", reason=res.reason, message=res.message,
                                  point_id=cand.point_id, params_json=cand.params_json)
                if res.failed_input:  # the timing set that exposed it: memory keeps it as a regression input
                    f = res.failed_input
                    rej.checks.append(pb.Check(shape=f.shape, distribution=f.distribution, seed=f.seed,
                                               note=res.message))
                return rej
            m.timings.append(res.timings[cand.id])
        m.score_s = objective.score(m.timings, m.objective)
        return m

    async def _screen(self, cand, session, problem, target, device, m: pb.Measured) -> bool:
        """Multi-fidelity: a short timing at the objective's screen shape; True (m holds it, screened out, its
        score the bound) when the score can be no better than screen_factor x the campaign's best so far
        (objective.score_bound), so the full measurement would be wasted."""
        best = best_of(await self.claims.cache_get(best_key(cand.campaign_id)))
        if not self.settings.screen_max_s or best is None:
            return False
        shape = objective.screen_shape(problem, device)
        if self.settings.judge_order == "verify_first":  # the screen as it was before issue 23: a whole measure
            res = await self.work(measure, session, [cand.id], problem, shape, self.pool(cand.problem),
                                  target.cache_bytes(), self.settings, self.settings.screen_max_s, device,
                                  part="screen")
        else:
            bar = objective.screen_bar(problem, shape, device, self.settings.screen_factor * best)
            res = await self.work(screen, session, cand.id, problem, shape, self.pool(cand.problem),
                                  target.cache_bytes(), self.settings, bar, part="screen")
        if res.reason:
            return False  # a failure here is found again, and typed, by the full measurement
        bound = objective.score_bound(problem, shape, res.timings[cand.id].median_s, device)
        if not screened_out(bound, best, self.settings.screen_factor):
            return False
        m.timings.append(res.timings[cand.id])
        m.score_s, m.screened_out = bound, True
        return True

    async def _showdown(self, d: Delivery) -> Outcome:
        """The search's best and its contenders (CompareRequest.contenders) timed interleaved at every shape the
        objective scores (kfactory/judge/objective.py; compare_max_s shared among them), each probed after each
        timing as any measurement of a candidate is; one Comparison (showdown set) with an entry per kernel, its
        timing the objective's (objective.combine), or the first error."""
        req = d.event.compare_request
        cand = req.candidate
        if len(req.contender_artifacts) != len(req.contenders):
            return Term(f"showdown of {cand.id}: {len(req.contenders)} contenders but {len(req.contender_artifacts)} "
                        "artifacts", pb.INPUT_MISSING)
        problem = self.ctx.problem(cand.problem)
        target = self.ctx.target(cand.target)
        device = await self.ctx.device(cand.target)
        session = self.session(cand)
        names = {cand.id: "candidate", **{c.id: "contender" for c in req.contenders}}
        try:
            for c, digest in [(cand, req.candidate_artifact), *zip(req.contenders, req.contender_artifacts)]:
                session.load_artifact(c.id, await self.bus.get_artifact(digest), c.entry, ev.launch_of(c))
        except ArtifactMissing as e:
            return Term(f"showdown needs an artifact that is missing: {e}", pb.INPUT_MISSING)
        shapes = [s for s, _ in objective.scored(problem)]
        keys = list(names)
        pool = await self._ahead(cand, session, problem, target, part="compare", shapes=shapes, kernels=len(keys))
        timed: dict[str, dict[str, pb.ShapeTiming]] = {k: {} for k in keys}
        async with self.device(device.device_id) as held:
            for shape in shapes:
                # rotated: the search's best, first in keys, would otherwise always have the first (slower) buffers
                res = await self.work(measure_rotated, session, keys, problem, shape, pool, target.cache_bytes(),
                                      self.settings, self.settings.compare_max_s / len(shapes), device, keys,
                                      part="compare")
                if res.reason:
                    break
                for k in keys:
                    timed[k][problem.shape_str(shape)] = res.timings[k]
            for k in keys:
                await self.work(session.unload, k, part="unload")
        comp = pb.Comparison(shape=objective.label(problem), candidate_id=cand.id, device=device, showdown=True,
                             seconds=held.seconds)
        if res.reason:
            failed_in(comp, res)  # the planner never makes failed_candidate the result
        else:
            scores = {k: objective.combine(problem, timed[k]) for k in keys}
            for k in keys:
                comp.entries.append(pb.ComparisonEntry(name=names[k], candidate_id=k, timing=scores[k]))
                comp.speedups[k] = scores[k].median_s / scores[cand.id].median_s
        await self.bus.publish(ev.make_event(d.event.campaign_id, self.name, ev.showdown_key(req), comparison=comp))
        return Ack()

    async def _record_best(self, campaign: str, score_s: float) -> None:
        """The campaign's best score so far, for screening (a race between two benchmarkers only makes the
        threshold a little looser for a moment, never wrong)."""
        best = best_of(await self.claims.cache_get(best_key(campaign)))
        if best is None or score_s < best:
            await self.claims.cache_put(best_key(campaign), repr(score_s).encode(), ttl_s=BEST_TTL_S)

    async def _compare(self, d: Delivery) -> Outcome:
        """The final word: candidate, reference kernel and baselines timed interleaved at every shape."""
        req = d.event.compare_request
        if req.contenders:
            return await self._showdown(d)
        cand, ref = req.candidate, req.reference
        problem = self.ctx.problem(cand.problem)
        target = self.ctx.target(cand.target)
        device = await self.ctx.device(cand.target)
        session = self.session(cand)
        keys = {"candidate": cand.id}
        try:
            for c, digest in ((cand, req.candidate_artifact), (ref, req.reference_artifact)):
                session.load_artifact(c.id, await self.bus.get_artifact(digest), c.entry, ev.launch_of(c))
        except ArtifactMissing as e:
            return Term(f"comparison needs an artifact that is missing: {e}", pb.INPUT_MISSING)
        keys["reference"] = ref.id
        for b in req.baselines:
            session.load_baseline(f"baseline:{b}", b)
            keys[b] = f"baseline:{b}"
        pool = await self._ahead(cand, session, problem, target, part="compare", kernels=len(keys))
        async with self.device(device.device_id):
            # the lease is held throughout: each shape's device time runs from the end of the one before (its
            # publishing included), so that the shapes add up to the lease held, up to the last one's publishing
            mark = time.perf_counter()
            for shape in problem.shapes("optimize"):
                # the comparison's timings are a measurement of the candidate too, so it is probed after them
                # like any measurement (judge.probe_after_timing); the reference and the baselines are not
                # probed (the problem's own code), but their outputs are checked. Rotated (judge/rotated.py):
                # each kernel on every kernel's buffers, so no speedup carries the bias of the buffers laid out
                # first
                res = await self.work(measure_rotated, session, list(keys.values()), problem, shape, pool,
                                      target.cache_bytes(), self.settings,
                                      self.settings.compare_max_s, device, [cand.id], part="compare")
                sname = problem.shape_str(shape)
                now = time.perf_counter()
                comp = pb.Comparison(shape=sname, candidate_id=cand.id, device=device, seconds=now - mark)
                mark = now
                if res.reason:
                    failed_in(comp, res)
                for name, key in keys.items():
                    if key in res.timings:
                        comp.entries.append(pb.ComparisonEntry(name=name, candidate_id=key, timing=res.timings[key]))
                        comp.speedups[name] = res.timings[key].median_s / res.timings[cand.id].median_s
                await self.bus.publish(ev.make_event(d.event.campaign_id, self.name, f"{cand.id}:{sname}",
                                                     comparison=comp))
        return Ack()


def failed_in(comp: pb.Comparison, res: Timing) -> None:
    """A comparison's failure (a measure Timing with a reason): `error` in words, the kernel that failed, its typed
    reason, and the check of the set that exposed it where an input did (memory keeps it as a regression input,
    as a rejected measurement's)."""
    comp.error = f"{pb.RejectReason.Name(res.reason)}: {res.message}"
    comp.failed_candidate, comp.failed_reason = res.failed_key, pb.RejectReason.Name(res.reason)
    if res.failed_input:
        f = res.failed_input
        comp.checks.append(pb.Check(shape=f.shape, distribution=f.distribution, seed=f.seed, note=res.message))

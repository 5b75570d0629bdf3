"""`kfactory engine run MODEL --services`: the engine campaign through the six services in this process (an
embedded nats-server unless KFACTORY_BUS=memory or a NATS URL is configured), as `kfactory run` runs a kernel
campaign; then the same record and best.json as the local campaign (kfactory/engines/pipeline.py)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

from kfactory.bus.base import Bus
from kfactory.bus.errors import ArtifactMissing
from kfactory.engines.build import build
from kfactory.cli.run import _wait_archived, interrupts, local_services, write_report
from kfactory.engines import pipeline
from kfactory.engines.campaign import DesignResult
from kfactory.engines.ops import OpKernel
from kfactory.engines.finale import finale_of
from kfactory.engines.showdown import Rule
from kfactory.engines.stages.bundle import unpack
from kfactory.engines.verify import TOLERANCE
from kfactory.platform.config import Settings
from kfactory.platform.service import Context
from kfactory.services.planner.specs import StartNotPublished, validate
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb

if TYPE_CHECKING:
    from kfactory.services.memory.service import MemoryService
    from kfactory.services.planner.service import PlannerService


class ServicesFailed(RuntimeError):
    """The services could not run the campaign (a service failed, or did not take its start); the message says
    why."""


async def run_campaign(settings: Settings, model: str, spec: pb.CampaignSpec,
                       progress: Callable[[DesignResult], None] | None = None,
                       embedded_nats: bool = True) -> dict[str, Any]:
    """Submit the engine campaign `spec` to the planner of services started here (over a nats-server of their
    own when `embedded_nats` and the bus is NATS, else over settings.nats_url), wait for its end (the planner
    times the verified designs again after the search: the spec's timing rounds, the noise timing and the
    showdown, kfactory/engines/finale.py) and for memory to archive it, and write the record from the archived
    events; return the record (its "campaign_state" is the planner's final state: completed, cancelled,
    expired, failed; "interrupted" whether a Ctrl-C cancelled it)."""
    from kfactory.models import load_model

    # refused before any server starts, naming the field (as `kfactory run` does); SpecError to the caller
    spec, _ = validate(spec, settings, Context.problem, lambda t: get_target(t, settings))
    async with local_services(settings, embedded_nats) as running:
        planner = cast("PlannerService", running.services["planner"])
        memory = cast("MemoryService", running.services["memory"])
        try:
            cid = await planner.submit(spec)
        except StartNotPublished as e:
            raise ServicesFailed(str(e)) from e
        st = planner.campaigns[cid]
        shown: set[str] = set()
        with interrupts() as interrupted:   # Ctrl-C or SIGTERM: the campaign ends cancelled, recorded
            interrupted["cancel"] = lambda why: planner.cancel(cid, why)
            while st.finished is None and not running.stop.is_set():
                await asyncio.sleep(0.5)
                if (failure := running.failed()) is not None:
                    raise ServicesFailed(f"a service failed: {failure}") from failure
                _show(memory, cid, Path(settings.data_dir), shown, progress)
        await _wait_archived(memory, cid)
        _show(memory, cid, Path(settings.data_dir), shown, progress)
        events = memory.archive.events(campaign=cid)
        fin = finale_of(st.spec)
        name, data_dir = load_model(model).name, Path(settings.data_dir)
        libraries, kernels = await _libraries(running.ctx.bus, events, data_dir)
        record = pipeline.write(events, name, data_dir / "engines" / name, data_dir, st.spec, TOLERANCE,
                                libraries=libraries, rounds=fin.rounds, kernels=kernels, showdown=fin.rule)
        record["report"] = str(write_report(settings, memory, cid))
        record["campaign_state"] = st.finished.state if st.finished is not None else "unfinished"
        record["campaign_reason"] = st.finished.reason if st.finished is not None else ""
        record["interrupted"] = interrupted["signal"] is not None
        record["interrupted_by"] = interrupted["signal"]   # (SIGINT or SIGTERM; None when not interrupted)
        return record


async def _libraries(bus: Bus, events: list[pb.Event], data_dir: Path) -> tuple[dict[str, str], dict[str, OpKernel]]:
    """(design id -> each verified design's object in this data dir's build cache, its source beside it; the
    searched kernels they link, by op problem): the candidate's source bundle built again, a cache lookup where
    the compiler service built it here."""
    out: dict[str, str] = {}
    kernels: dict[str, OpKernel] = {}
    for design_id, digest in pipeline.verified_sources(events).items():
        try:
            src = unpack((await bus.get_artifact(digest)).decode())
        except ArtifactMissing:   # the record keeps the object the verifier ran (no source beside it)
            continue
        kernels.update(src.kernels)
        # units in op-problem order, as ops.units_for gives them to the compiler: the same build-cache key
        lib = await asyncio.to_thread(build, src.engine, data_dir / "engines",
                                      units=tuple(k.unit() for _, k in sorted(src.kernels.items())))
        if lib.ok and lib.path is not None:
            out[design_id] = str(lib.path)
    return out, kernels


def _show(memory: MemoryService, cid: str, data_dir: Path, shown: set[str],
          progress: Callable[[DesignResult], None] | None) -> None:
    """Report each design once, when its outcome is archived."""
    if progress is None:
        return
    for res in pipeline.results_of(memory.archive.events(campaign=cid), data_dir):
        if res.verdict != pipeline.UNFINISHED and res.design_id not in shown:
            shown.add(res.design_id)
            progress(res)


def run(model: str, budget: int, max_threads: int, parallel: int = 0,
        progress: Callable[[DesignResult], None] | None = None, nats_url: str | None = None, rounds: int = 1,
        kernel_ids: dict[str, str] | None = None, showdown: Rule | None = None) -> dict[str, Any]:
    """The campaign through the services with this process's settings (see run_campaign): over the NATS server
    at `nats_url`, else one started for the campaign; `kernel_ids` ({op problem: candidate id}) the searched
    kernels its designs may link; `rounds` timing rounds and the showdown by its rule `showdown` (default:
    none) after the search."""
    spec = pipeline.campaign_spec(model, budget, max_threads, parallel, kernel_ids=kernel_ids, rounds=rounds,
                                  showdown=showdown)
    settings = Settings(nats_url=nats_url) if nats_url else Settings()
    return asyncio.run(run_campaign(settings, model, spec, progress, embedded_nats=not nats_url))

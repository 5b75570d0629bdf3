"""The planner's calls to memory at a new campaign's start: a warm start's priors, the kernels other campaigns
found wrong, and (under a device budget) what earlier campaigns' comparisons held the device for. All are asked at
once on one channel, so a memory that does not answer costs a submission one deadline (Settings.memory_timeout_s),
not three; each answer the campaign does without is logged with why."""
from __future__ import annotations

import asyncio
from typing import NamedTuple

import grpc

from kfactory.platform.config import Settings
from kfactory.platform.evidence_client import EvidenceClient
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

#: at most this many known-wrong kernels go into a CampaignStarted (the most recently found ones): an event stays
#: far under the bus's size limit however long a problem's history; memory's best and export still pass over
#: every kernel found wrong
KNOWN_WRONG_MAX = 4096


class FromMemory(NamedTuple):
    """What memory tells a new campaign (from_memory)."""
    priors: list[pb.Prior]
    known_wrong: list[pb.KnownWrong]
    #: what earlier campaigns' comparisons held the device for, the most recent first (judge.order.compare_reserve)
    comparison_costs: list[spb.ComparisonCost]


async def from_memory(addr: str, settings: Settings, log, spec: pb.CampaignSpec, space: Space | None, cid: str,
                      device: pb.DeviceInfo, device_budget_s: float = 0.0) -> FromMemory:
    """The warm start's priors, the kernels other campaigns found wrong and, under a device budget
    (`device_budget_s` > 0), what the comparisons of recent campaigns of the problem on `device` held it for, from
    the Evidence service at `addr`. No priors when the spec asks for a cold start; any list empty when memory
    cannot be reached or refuses the question (logged): the campaign starts cold, learns only what the campaigns
    this planner folds find while it runs (kfactory/services/planner/replay.py), or reserves the configured share
    of its budget for its comparisons."""
    async with EvidenceClient(addr, settings) as memory:
        priors, wrong, costs = await asyncio.gather(_priors(memory, settings, log, spec, space, cid),
                                                     _known_wrong(memory, log, spec),
                                                     _comparison_costs(memory, log, spec, device, device_budget_s))
    return FromMemory(priors, capped(wrong, log), costs)


def capped(wrong: list[pb.KnownWrong], log, most: int = KNOWN_WRONG_MAX) -> list[pb.KnownWrong]:
    """The `most` most recently found of `wrong` (in the order found), the rest left out with a warning."""
    if len(wrong) <= most:
        return wrong
    log.warning("more kernels were found wrong than a start carries: the oldest are left out of it (memory's best "
                "and export still pass over them)", found=len(wrong), kept=most)
    return wrong[len(wrong) - most:]


async def _priors(memory: EvidenceClient, settings: Settings, log, spec: pb.CampaignSpec, space: Space | None,
                  cid: str) -> list[pb.Prior]:
    """Memory's priors for the campaign's problem and families (a warm start)."""
    if spec.warm_start <= 0 or space is None:
        return []
    # every source's measurements: the strategy learns each earlier campaign's landscape (transfer.py); the
    # campaign proposes the best spec.warm_start of them first
    req = spb.PriorsRequest(problem=spec.problem, families=list(space.families), exclude_campaign=cid,
                            limit=max(spec.warm_start, settings.warm_evidence), every_source=True)
    try:
        return list((await memory.Priors(req)).priors)
    except grpc.aio.AioRpcError as e:
        log.warning("memory gave no priors: the campaign starts cold", addr=memory.addr, code=e.code().name,
                    reason=e.details())
        return []


async def _known_wrong(memory: EvidenceClient, log, spec: pb.CampaignSpec) -> list[pb.KnownWrong]:
    """The kernels a comparison of another campaign of the problem found wrong, in the order they were found:
    none is the new campaign's result."""
    try:
        return list((await memory.KnownWrong(spb.KnownWrongRequest(problem=spec.problem))).kernels)
    except grpc.aio.AioRpcError as e:
        log.warning("memory did not say which kernels other campaigns found wrong: the campaign starts without "
                    "them", addr=memory.addr, code=e.code().name, reason=e.details())
        return []


async def _comparison_costs(memory: EvidenceClient, log, spec: pb.CampaignSpec, device: pb.DeviceInfo,
                            budget_s: float) -> list[spb.ComparisonCost]:
    """The device seconds recent campaigns' showdowns and final comparisons held, when a device budget is to
    keep some for the campaign's own (none asked without one)."""
    if not budget_s:
        return []
    req = spb.ComparisonCostRequest(problem=spec.problem, target=spec.target, device=device.model)
    try:
        return list((await memory.ComparisonCost(req)).campaigns)
    except grpc.aio.AioRpcError as e:
        log.warning("memory did not say what earlier campaigns' comparisons cost: the device budget keeps its "
                    "configured share for them", addr=memory.addr, code=e.code().name, reason=e.details())
        return []

"""The planner's calls to memory at a new campaign's start: a warm start's priors, and the kernels other
campaigns found wrong."""
from __future__ import annotations

import grpc

from kfactory.platform.config import Settings
from kfactory.platform.evidence_client import EvidenceClient
from kfactory.strategies import Space
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb


async def warm_priors(addr: str, settings: Settings, log, spec: pb.CampaignSpec, space: Space | None,
                      cid: str) -> list[pb.Prior]:
    """Memory's priors for the campaign's problem and families (a warm start) from the Evidence service at
    `addr`; none when the spec asks for a cold start or memory cannot be reached (the campaign then starts cold,
    and says so in the log)."""
    if spec.warm_start <= 0 or space is None:
        return []
    # every source's measurements: the strategy learns each earlier campaign's landscape (transfer.py); the
    # campaign proposes the best spec.warm_start of them first
    req = spb.PriorsRequest(problem=spec.problem, families=list(space.families), exclude_campaign=cid,
                            limit=max(spec.warm_start, settings.warm_evidence), every_source=True)
    try:
        async with EvidenceClient(addr, settings) as memory:
            resp = await memory.Priors(req)
    except grpc.aio.AioRpcError as e:
        log.warning("memory unreachable: the campaign starts cold", addr=addr, code=e.code().name)
        return []
    return list(resp.priors)


async def known_wrong(addr: str, settings: Settings, log, spec: pb.CampaignSpec) -> list[pb.KnownWrong]:
    """The kernels a comparison of another campaign of the problem found wrong (memory's KnownWrong at `addr`):
    none is the new campaign's result. None when memory cannot be reached (logged): the campaign then learns only
    what the campaigns this planner folds find while it runs (kfactory/services/planner/replay.py). Memory's
    refusal (a problem name it cannot file) is logged the same way, with its code and reason."""
    try:
        async with EvidenceClient(addr, settings) as memory:
            resp = await memory.KnownWrong(spb.KnownWrongRequest(problem=spec.problem))
    except grpc.aio.AioRpcError as e:
        log.warning("memory did not say which kernels other campaigns found wrong: the campaign starts without "
                    "them", addr=addr, code=e.code().name, reason=e.details())
        return []
    return list(resp.kernels)

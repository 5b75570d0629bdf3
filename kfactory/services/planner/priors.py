"""The planner's call to memory: a warm start's priors for a new campaign."""
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

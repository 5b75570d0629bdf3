"""The Campaigns gRPC service: submit, get, list, cancel and watch campaigns."""
from __future__ import annotations

import asyncio
from typing import Protocol

import grpc

from kfactory.bus import events as ev
from kfactory.bus.base import Bus
from kfactory.services import paging
from kfactory.services.planner.campaign import CampaignState
from kfactory.problems.refcheck import CheckBroken, CheckUnavailable
from kfactory.services.planner.specs import SpecError, StartNotPublished
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc


class CampaignHost(Protocol):
    """What the API asks of the planner (PlannerService)."""
    bus: Bus
    campaigns: dict[str, CampaignState]

    async def submit(self, spec: pb.CampaignSpec) -> str: ...

    async def cancel(self, cid: str, reason: str) -> CampaignState: ...

    def status(self, st: CampaignState) -> spb.CampaignStatus: ...


class CampaignsApi(sgrpc.CampaignsServicer):
    """The Campaigns gRPC service."""

    def __init__(self, planner: CampaignHost):
        self.p = planner

    async def Submit(self, request, context):
        try:
            cid = await self.p.submit(request.spec)
        except SpecError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (StartNotPublished, CheckUnavailable) as e:   # nothing started: the same spec may go through later
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except CheckBroken as e:   # the reference check's own code or environment failed: not the spec's mistake
            await context.abort(grpc.StatusCode.INTERNAL, str(e))
        return self.p.status(self.p.campaigns[cid])

    async def _get(self, cid: str, context) -> CampaignState:
        st = self.p.campaigns.get(cid)
        if st is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no campaign {cid!r}")
        assert st is not None  # abort() raises: the call ends there
        return st

    async def Get(self, request, context):
        return self.p.status(await self._get(request.id, context))

    async def List(self, request, context):
        """The planner's campaigns in the order they started, a page at a time (kfactory/services/paging.py)."""
        try:
            states, token = paging.page_of([(s.started_ns, s.id, s) for s in self.p.campaigns.values()], request)
        except paging.PageTokenError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return spb.ListCampaignsResponse(campaigns=[self.p.status(s) for s in states], next_page_token=token)

    async def Cancel(self, request, context):
        st = await self._get(request.id, context)
        await self.p.cancel(st.id, request.reason)
        return self.p.status(st)

    async def Watch(self, request, context):
        await self._get(request.id, context)
        stop = asyncio.Event()
        async for event, msg in self.p.bus.follow(None, ev.event_subject("*", request.id), stop=stop):
            await msg.ack()
            yield event
            if event.HasField("campaign_finished"):
                stop.set()

"""A planner on a node without a GPU (a cluster's planner pod) still starts cuda campaigns: the campaign names the
target and architecture it asked for, and the GPU services name the GPU (Measured.device)."""
from __future__ import annotations

import pytest

from kfactory.platform.app import start_services
from kfactory.targets.cuda.nvml import NvmlUnavailable
from kfactory.v1 import events_pb2 as pb


async def test_a_cuda_campaign_starts_on_a_planner_that_sees_no_gpu(memory_bus_settings, monkeypatch):
    from kfactory.targets.cuda import target as cuda

    monkeypatch.setenv("KFACTORY_GPU", "")
    try:
        cuda.make("sm_90a", memory_bus_settings).gpu()
        pytest.skip("this host has a GPU: the planner would describe it")
    except NvmlUnavailable:
        pass
    running = await start_services(memory_bus_settings, names=("planner",), grpc=False)
    try:
        planner = running.services["planner"]
        cid = await planner.submit(pb.CampaignSpec(problem="softmax", target="cuda:sm_90a", budget_candidates=1,
                                                   warm_start=0))
        st = planner.campaigns[cid]
        assert (st.device.target, st.device.arch) == ("cuda", "sm_90a")
        assert "not visible to the planner" in st.device.model
        await planner.cancel(cid, "test over")
        assert running.failed() is None
    finally:
        await running.shutdown()

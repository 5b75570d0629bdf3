"""One Evidence client (kfactory/platform/evidence_client.py): one deadline from Settings for every caller, and
each caller's own behaviour when memory does not answer in time."""
from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from kfactory.cli import client as cli_client
from kfactory.judge.regressions import RegressionSource
from kfactory.observability.log import get_logger
from kfactory.platform.config import Settings
from kfactory.platform.evidence_client import EvidenceClient
from kfactory.services.planner.priors import warm_priors
from kfactory.strategies import Space
from kfactory.problems import load_problem
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

TIMEOUT = 0.3


class SlowMemory(sgrpc.EvidenceServicer):
    """A memory that never answers in time."""

    async def _hang(self, request, context):
        await asyncio.sleep(5)

    Priors = Lessons = RegressionInputs = Best = _hang


@pytest.fixture
async def slow_memory():
    server = grpc.aio.server()
    sgrpc.add_EvidenceServicer_to_server(SlowMemory(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(grace=0)


async def test_every_query_gets_the_deadline_of_the_settings(slow_memory):
    t0 = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as e:
        async with EvidenceClient(slow_memory, Settings(memory_timeout_s=TIMEOUT)) as memory:
            await memory.Lessons(spb.LessonsRequest(problem="softmax"))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 5
    assert EvidenceClient("x", None).timeout_s == Settings.model_fields["memory_timeout_s"].default


async def test_a_verifier_goes_on_with_the_regression_inputs_it_knows(slow_memory):
    source = RegressionSource(lambda: slow_memory, settings=Settings(memory_timeout_s=TIMEOUT))
    assert await source.get("softmax") == []


async def test_a_campaign_starts_cold_when_memory_does_not_answer(slow_memory):
    spec = pb.CampaignSpec(problem="softmax", target="cpu", warm_start=3)
    space = Space(list(load_problem("softmax").families.values()))
    got = await warm_priors(slow_memory, Settings(memory_timeout_s=TIMEOUT), get_logger("test"), spec, space, "c1")
    assert got == []


async def test_the_cli_tells_a_query_without_an_answer_as_an_error(slow_memory):
    settings = Settings(memory_addr=slow_memory, memory_timeout_s=TIMEOUT)
    with pytest.raises(cli_client.ClientError, match="DEADLINE_EXCEEDED") as e:
        await cli_client._evidence(settings, "Best", spb.BestRequest(problem="softmax"))
    assert e.value.code == 1

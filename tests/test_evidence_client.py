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
from kfactory.services.planner.priors import from_memory
from kfactory.strategies import Space
from kfactory.problems import load_problem
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

TIMEOUT = 0.3


class SlowMemory(sgrpc.EvidenceServicer):
    """A memory that never answers in time; `asked` holds when each request arrived (its type's name)."""

    def __init__(self):
        self.asked: dict[str, float] = {}

    async def _hang(self, request, context):
        self.asked[type(request).__name__] = time.monotonic()
        await asyncio.sleep(5)

    Priors = Lessons = RegressionInputs = Best = KnownWrong = ComparisonCost = _hang


@pytest.fixture
async def slow_servicer():
    servicer = SlowMemory()
    server = grpc.aio.server()
    sgrpc.add_EvidenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    servicer.addr = f"127.0.0.1:{port}"
    yield servicer
    await server.stop(grace=0)


@pytest.fixture
def slow_memory(slow_servicer) -> str:
    return slow_servicer.addr


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


async def test_a_campaign_starts_cold_when_memory_does_not_answer(slow_servicer):
    """Without priors, without the kernels other campaigns found wrong and, under a device budget, without what
    earlier comparisons cost (the budget keeps its configured share for them); all asked at once, so a memory
    that hangs costs the submission one deadline, not three."""
    spec = pb.CampaignSpec(problem="softmax", target="cpu", warm_start=3)
    space = Space(list(load_problem("softmax").families.values()))
    # long enough that a busy host's stalls (a connect, a paused worker) are small beside it: each request must
    # still reach memory before its deadline to be seen asked
    deadline = 2.0
    t0 = time.monotonic()
    got = await from_memory(slow_servicer.addr, Settings(memory_timeout_s=deadline), get_logger("test"), spec,
                            space, "c1", pb.DeviceInfo(model="EPYC"), device_budget_s=30.0)
    took = time.monotonic() - t0
    asked = slow_servicer.asked
    assert got == ([], [], []) and set(asked) == {"PriorsRequest", "KnownWrongRequest", "ComparisonCostRequest"}
    # asked at once, as memory saw it: one after the other, the third is sent after two deadlines and the first
    # arrived within one, so they would arrive a deadline apart at least
    first = min(asked.values())
    assert max(asked.values()) - first < deadline / 2, {name: round(t - first, 3) for name, t in asked.items()}
    # and the submission waited about one deadline: one after the other, three at least
    assert took < 2.5 * deadline, took


async def test_the_cli_tells_a_query_without_an_answer_as_an_error(slow_memory):
    settings = Settings(memory_addr=slow_memory, memory_timeout_s=TIMEOUT)
    with pytest.raises(cli_client.ClientError, match="DEADLINE_EXCEEDED") as e:
        await cli_client._evidence(settings, "Best", spb.BestRequest(problem="softmax"))
    assert e.value.code == 1

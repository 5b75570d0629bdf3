"""Campaign lists a page at a time (kfactory/services/paging.py): memory's Campaigns query over a real archive,
the planner's List over its gRPC service, and the client that follows the pages."""
from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

import grpc
import pytest

from kfactory.bus import events as ev
from kfactory.cli.client import ClientError, _every_page, _local_campaigns
from kfactory.evidence.workspace import Workspace
from kfactory.services import paging
from kfactory.services.memory.archive import Archive
from kfactory.services.memory.queries import InvalidRequest, Queries
from kfactory.platform.app import start_services
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

sys.path.insert(0, str(Path(__file__).parent))
from bus_helpers import planner_serving  # noqa: E402
from tuning_synth import write_spaces  # noqa: E402

SPEC = pb.CampaignSpec(problem="softmax", target="cpu", budget_candidates=3, strategy="random", seed=1)


def _start(cid: str, ns: int) -> pb.Event:
    e = ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=SPEC))
    e.time_unix_ns = ns
    return e


def _read_all(ask, size: int) -> list[str]:
    """Every id the list gives, page by page at `size`, checking each page's length (and that it ends)."""
    ids, token = [], ""
    for _ in range(100):
        page = ask(spb.ListCampaignsRequest(page_size=size, page_token=token))
        assert len(page.campaigns) <= size
        ids += [s.id for s in page.campaigns]
        token = page.next_page_token
        if not token:
            return ids
        assert len(page.campaigns) == size   # only the last page is short
    raise AssertionError("the list did not end within 100 pages")


def test_page_of_orders_by_start_then_id_and_takes_sizes_and_tokens():
    keyed = [(30, "c", "C"), (10, "b", "B"), (10, "a", "A"), (20, "e", "E"), (40, "d", "D")]
    page, token = paging.page_of(keyed, spb.ListCampaignsRequest(page_size=2))
    assert page == ["A", "B"] and paging.decode(token) == (10, "b")
    page, token = paging.page_of(keyed, spb.ListCampaignsRequest(page_size=2, page_token=token))
    assert page == ["E", "C"]
    page, token = paging.page_of(keyed, spb.ListCampaignsRequest(page_size=2, page_token=token))
    assert page == ["D"] and token == ""
    # a page exactly as long as what is left ends the list
    assert paging.page_of(keyed, spb.ListCampaignsRequest(page_size=5)) == (["A", "B", "E", "C", "D"], "")
    assert paging.page_size(0) == paging.PAGE_SIZE and paging.page_size(10**6) == paging.MAX_PAGE_SIZE
    with pytest.raises(paging.PageTokenError, match="page_size must be 0"):
        paging.page_size(-1)
    odd = [{"a": 1}, [1], [2**63, "c1"], [-2**63 - 1, "c1"], [True, "c1"], [1, "\udfff"], [1, "c" * 300],
           [1.5, "c1"]]
    for bad in ["garbage!", *(base64.urlsafe_b64encode(json.dumps(o).encode()).decode() for o in odd)]:
        with pytest.raises(paging.PageTokenError, match="is not one this list gave: ask for the first page"):
            paging.decode(bad)
    assert paging.decode(paging.encode(2**63 - 1, "c1")) == (2**63 - 1, "c1")


def test_every_page_reads_the_whole_list_and_refuses_a_list_that_does_not_move_on():
    keyed = [(i, f"c{i:02d}", f"c{i:02d}") for i in range(7)]

    def answer(req: spb.ListCampaignsRequest) -> spb.ListCampaignsResponse:
        ids, token = paging.page_of(keyed, spb.ListCampaignsRequest(page_size=3, page_token=req.page_token))
        return spb.ListCampaignsResponse(campaigns=[spb.CampaignStatus(id=i) for i in ids], next_page_token=token)

    assert [s.id for s in paging.every_page_now(answer).campaigns] == [k[1] for k in keyed]

    async def fetch(req):
        return answer(req)
    assert [s.id for s in asyncio.run(paging.every_page(fetch)).campaigns] == [k[1] for k in keyed]
    stuck = spb.ListCampaignsResponse(campaigns=[spb.CampaignStatus(id="x")], next_page_token="same")
    with pytest.raises(paging.PageTokenError, match="twice: it does not move on"):
        paging.every_page_now(lambda req: stuck)

    async def stuck_service(req):
        return stuck
    # the CLI says which list misbehaved, as a ClientError (its exit status), not an internal error
    with pytest.raises(ClientError, match="the planner at here: the list gave page token 'same' twice"):
        asyncio.run(_every_page(stuck_service, "the planner at here"))


def test_the_cli_reads_every_page_of_the_local_archive(settings, monkeypatch):
    archive = Archive(Workspace.of(settings).archive_path)
    try:
        for i in range(5):
            assert archive.record(_start(f"c{i}", 100 - i))
    finally:
        archive.close()
    asked = []
    real = Queries.campaigns

    def counted(self, request=None):
        asked.append(request.page_size)
        return real(self, request)
    monkeypatch.setattr(paging, "CLIENT_PAGE_SIZE", 2)
    monkeypatch.setattr(Queries, "campaigns", counted)
    assert [s.id for s in _local_campaigns(settings).campaigns] == ["c4", "c3", "c2", "c1", "c0"]
    assert asked == [2, 2, 2]


def test_memorys_campaigns_come_a_page_at_a_time_in_start_order(tmp_path):
    archive = Archive(tmp_path / "archive.sqlite")
    try:
        # two pairs started in the same nanosecond: the id breaks the tie
        starts = {"c5": 50, "c1": 10, "c3": 30, "c2": 10, "c4": 30, "c6": 60, "c0": 5}
        for cid, ns in starts.items():
            assert archive.record(_start(cid, ns))
        q = Queries(archive)
        order = ["c0", "c1", "c2", "c3", "c4", "c5", "c6"]
        for size in (1, 2, 3, 7):
            assert _read_all(q.campaigns, size) == order
        whole = q.campaigns()   # the default page holds them all
        assert [s.id for s in whole.campaigns] == order and whole.next_page_token == ""
        first = q.campaigns(spb.ListCampaignsRequest(page_size=3))
        assert [s.id for s in first.campaigns] == ["c0", "c1", "c2"] and first.campaigns[1].state == "running"
        # campaigns archived between two pages come on the later pages in their places, and none is listed twice
        assert archive.record(_start("c7", 20))
        assert archive.record(_start("c8", 70))
        second = q.campaigns(spb.ListCampaignsRequest(page_size=3, page_token=first.next_page_token))
        third = q.campaigns(spb.ListCampaignsRequest(page_size=3, page_token=second.next_page_token))
        assert [s.id for s in second.campaigns] == ["c7", "c3", "c4"]
        assert [s.id for s in third.campaigns] == ["c5", "c6", "c8"] and third.next_page_token == ""
        with pytest.raises(InvalidRequest, match="page_token 'nope' is not one this list gave"):
            q.campaigns(spb.ListCampaignsRequest(page_token="nope"))
        # a token past what the archive's integers hold is refused as one, not an archive error
        with pytest.raises(InvalidRequest, match="is not one this list gave"):
            q.campaigns(spb.ListCampaignsRequest(page_token=base64.urlsafe_b64encode(b'[9223372036854775808, "c1"]')
                                                 .decode()))
        with pytest.raises(InvalidRequest, match="page_size must be 0"):
            q.campaigns(spb.ListCampaignsRequest(page_size=-3))
    finally:
        archive.close()


async def test_the_planners_list_comes_a_page_at_a_time(memory_bus_settings, tmp_path):
    space = write_spaces(tmp_path / "spaces", devices=("GPU0",))[0]
    spec = pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}", strategy="random",
                           budget_candidates=1, parallel=1, seed=3, warm_start=0)
    running = await start_services(memory_bus_settings, names=("planner",))
    planner = running.services["planner"]
    try:
        await planner_serving(planner)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{planner.grpc_port}") as ch:
            stub = sgrpc.CampaignsStub(ch)
            submitted = [(await stub.Submit(spb.SubmitRequest(spec=spec), timeout=30)).id for _ in range(5)]
            by_start = [st.id for st in sorted(planner.campaigns.values(), key=lambda s: (s.started_ns, s.id))]
            assert all(st.started_ns > 0 for st in planner.campaigns.values())
            assert sorted(by_start) == sorted(submitted)
            pages = []
            token = ""
            while True:
                page = await stub.List(spb.ListCampaignsRequest(page_size=2, page_token=token), timeout=10)
                pages.append([s.id for s in page.campaigns])
                token = page.next_page_token
                if not token:
                    break
            assert [len(p) for p in pages] == [2, 2, 1] and sum(pages, []) == by_start
            whole = await paging.every_page(lambda req: stub.List(req, timeout=10))
            assert [s.id for s in whole.campaigns] == by_start
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.List(spb.ListCampaignsRequest(page_token="nope"), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "is not one this list gave" in err.value.details()
    finally:
        await running.shutdown()

"""Agent coders, piece by piece: both backends over real HTTP against ScriptedModelServer (a test double of the
LLM endpoint), typed failures and retries, kernel extraction and static checks, prompts, the coder portfolio."""
from __future__ import annotations

import random
import time

import httpx
import pytest

from conftest import KERNELS
from evidence_chain import chain
from scripted_model import GARBAGE, Hang, Raw, Refuse, Reply, ScriptedModelServer, Status, fenced
from kfactory.agents import Agent, PERSONAS
from kfactory.agents import errors, extract, prompt
from kfactory.agents.backends import get_backend
from kfactory.agents.backends.base import parse_retry_after
from kfactory.platform.config import Settings
from kfactory.problems import load_problem
from kfactory.services.planner.coders import CoderLedger
from kfactory.v1 import events_pb2 as pb
from ports import free_port

FAST = (KERNELS / "softmax_two_pass.c").read_text()
PROVIDERS = ["openai", "anthropic"]
REASONS = {errors.AgentRefused: pb.AGENT_REFUSED, errors.AgentUnavailable: pb.AGENT_UNAVAILABLE,
           errors.AgentBadResponse: pb.AGENT_BAD_RESPONSE, errors.AgentTimeout: pb.AGENT_TIMEOUT,
           errors.AgentNoCode: pb.AGENT_NO_CODE, errors.StaticCheckFailed: pb.STATIC_CHECK}


def _settings(url: str, provider: str, **over) -> Settings:
    base = url + "/v1" if provider == "openai" else url
    # 5 s: a scripted reply can take over a second to come on a loaded host, and a timeout there is a retry that
    # changes the counts asserted; the tests of a model that never answers set 1 s
    knobs = {"llm_timeout_s": 5.0, "llm_retries": 1, "llm_backoff_s": 0.05, **over}
    return Settings(llm_provider=provider, llm_base_url=base, llm_model="scripted-double", **knobs)


def _prompt(persona: str = "memory_bound") -> prompt.Prompt:
    return prompt.Prompt(system=f"You are the double's client (persona {persona}).", user="write softmax")


async def _write(settings: Settings, persona: str = "memory_bound"):
    async with httpx.AsyncClient() as client:
        agent = Agent(get_backend(settings.llm_provider, settings, client), settings, persona, random.Random(1))
        return await agent.write(_prompt(persona), "c", "kernel", "cpu", None)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_reply_becomes_a_checked_kernel_and_its_tokens_are_counted(provider):
    with ScriptedModelServer({"memory_bound": [Reply(fenced(FAST, flags="-O3 -march=native -fopenmp"))]}) as m:
        work = await _write(_settings(m.url, provider))
        assert work.failure is None
        assert work.kernel.source == FAST and work.kernel.flags == "-O3 -march=native -fopenmp"
        tin, tout = m.tokens()
    assert (work.info.tokens_in, work.info.tokens_out) == (tin, tout) and tin > 0 and tout > 100
    assert work.info.attempts == 1 and work.info.backend == provider and work.info.model == "scripted-double"
    assert m.requests[0]["api"] == provider


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_429_is_retried_after_its_retry_after(provider):
    script = {"memory_bound": [Status(429, {"Retry-After": "1"}), Reply(fenced(FAST))]}
    with ScriptedModelServer(script) as m:
        t0 = time.monotonic()
        work = await _write(_settings(m.url, provider))
        waited = time.monotonic() - t0
    assert work.failure is None and work.info.attempts == 2
    assert waited >= 1.0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_rate_limits_that_persist_become_a_typed_failure(provider):
    with ScriptedModelServer({"memory_bound": [Status(429, {"Retry-After": "0"})]}) as m:
        work = await _write(_settings(m.url, provider, llm_retries=2))
    assert isinstance(work.failure, errors.AgentRateLimited) and work.failure.reason == pb.AGENT_RATE_LIMITED
    assert work.info.attempts == 3 and work.info.tokens_in == 0


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_retry_after_longer_than_the_limit_is_not_waited_for(provider):
    with ScriptedModelServer({"memory_bound": [Status(429, {"Retry-After": "3600"})]}) as m:
        t0 = time.monotonic()
        work = await _write(_settings(m.url, provider, llm_retries=3, llm_max_wait_s=5))
    assert isinstance(work.failure, errors.AgentRateLimited) and work.info.attempts == 1
    assert time.monotonic() - t0 < 4   # a wait up to the limit would take 5 s


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("action, failure, attempts", [
    (Refuse(), errors.AgentRefused, 1),
    (Status(401), errors.AgentUnavailable, 1),        # credentials refused: not retried
    (Status(503), errors.AgentUnavailable, 2),        # retried once, then typed
    (Status(400), errors.AgentBadResponse, 1),
    (Status(200), errors.AgentBadResponse, 1),        # JSON, but not a chat reply
    (Hang(), errors.AgentTimeout, 2),
    (Reply(GARBAGE), errors.AgentNoCode, 2),          # asked again once, garbage again
    (Reply(fenced('#include <stdio.h>\nvoid kernel(void) { system("x"); }\n')), errors.StaticCheckFailed, 2),
])
async def test_failures_are_typed(provider, action, failure, attempts):
    with ScriptedModelServer({"memory_bound": [action]}) as m:
        work = await _write(_settings(m.url, provider, **({"llm_timeout_s": 1.0} if isinstance(action, Hang) else {})))
    assert type(work.failure) is failure and work.kernel is None
    assert work.info.attempts == attempts
    assert work.failure.reason == REASONS[failure]  # the RejectReason the coder publishes for it


@pytest.mark.parametrize("provider, body", [
    ("openai", {"choices": [{"message": {"content": fenced(FAST)}}], "usage": "lots"}),
    ("anthropic", {"content": [{"type": "text", "text": fenced(FAST)}], "usage": {"input_tokens": "many"}}),
])
async def test_an_unreadable_token_count_is_a_bad_response(provider, body):
    """Tokens are what a campaign's budget is spent in: a reply whose usage cannot be read is not taken."""
    with ScriptedModelServer({"memory_bound": [Raw(body)]}) as m:
        work = await _write(_settings(m.url, provider))
    assert type(work.failure) is errors.AgentBadResponse and "usage" in str(work.failure)
    assert work.kernel is None and work.info.attempts == 1


async def test_garbage_then_a_kernel_after_asking_again_counts_both_replies():
    with ScriptedModelServer({"compute_bound": [Reply(GARBAGE), Reply(fenced(FAST))]}) as m:
        work = await _write(_settings(m.url, "openai"), "compute_bound")
        tin, tout = m.tokens()
        second = m.requests[1]["body"]["messages"]
    assert work.failure is None and work.info.attempts == 2
    assert (work.info.tokens_in, work.info.tokens_out) == (tin, tout)
    # the second request holds the garbage reply and why it was not usable
    assert second[-2] == {"role": "assistant", "content": GARBAGE}
    assert "no fenced ```c block" in second[-1]["content"]


async def test_a_refused_connection_is_retried_then_unavailable():
    port = free_port()
    work = await _write(_settings(f"http://127.0.0.1:{port}", "openai", llm_retries=2))
    assert isinstance(work.failure, errors.AgentUnavailable) and work.info.attempts == 3


def test_retry_after_parses_seconds_and_http_dates():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert 0 <= parse_retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))) <= 31


def test_extraction_takes_the_block_that_defines_the_entry_and_checks_flags():
    text = ("Helper first:\n```c\nstatic float f(float a) { return a; }\n```\nThe kernel:\n```c\n" + FAST +
            "```\n```flags\n-O3   -ffast-math -fopenmp\n```\n")
    source, flags = extract.extract(text, "c", "kernel")
    assert source == FAST and flags == "-O3 -ffast-math -fopenmp"
    with pytest.raises(errors.StaticCheckFailed, match="flags not allowed: -fplugin=evil.so"):
        extract.check(source, "-O3 -fplugin=evil.so", "cpu", None)
    with pytest.raises(errors.AgentNoCode):
        extract.extract("```python\nprint(1)\n```", "c", "kernel")


def test_cuda_kernels_need_a_launch_rule_from_their_header_or_their_parent():
    body = 'extern "C" __global__ void kernel(const float *x, float *y, long long rows, long long cols) {}\n'
    k = extract.check("// kfactory: grid=rows block=128\n" + body, None, "cuda", None)
    assert k.launch == {"grid": "rows", "block": "128", "smem": "0", "params": {}}
    parent = {"grid": "cdiv(rows, 4)", "block": "128", "smem": "0", "params": {}}
    assert extract.check(body, None, "cuda", parent).launch == parent
    with pytest.raises(errors.StaticCheckFailed, match="no launch rule"):
        extract.check(body, None, "cuda", None)


def test_the_prompt_carries_the_evidence_the_target_and_the_lessons():
    problem = load_problem("softmax")
    dev = pb.DeviceInfo(model="Test CPU (2 threads)", threads=2, mem_bandwidth_gbps=20.0, peak_gflops=100.0)
    parents = [{"id": "a" * 64, "short": "a" * 12, "origin": "manual:broken", "params": "{}", "flags": "-O2",
                "language": "c", "launch": "", "source": "void kernel() { oops }", "status": "rejected",
                "compile": None, "timings": [],
                "rejection": {"stage": "verifier", "reason": "WRONG_RESULT", "message": "row sums off"},
                "failures": [{"shape": "7x33", "distribution": "masked", "seed": 5, "max_abs_err": 0.25,
                              "max_rel_err": 0.5, "norm_rel_err": 0.125, "worst_index": 12, "note": "NaN"}],
                "checks_passed": 9, "checks_failed": 2},
               {"id": "b" * 64, "short": "b" * 12, "origin": "reference", "params": "{}", "flags": "-O2 -fopenmp",
                "language": "c", "launch": "", "source": FAST, "status": "measured", "compile": None,
                "rejection": None, "failures": [], "checks_passed": 12, "checks_failed": 0,
                "timings": [{"shape": "4096x4096", "median_ms": 12.5, "noise": 0.01, "samples": 20, "gbps": 10.7,
                             "bandwidth_fraction": 0.537, "flops_fraction": 0.0067}]}]
    p = prompt.build(PERSONAS["repairer"], problem, "cpu", dev, parents, "- failed: 3 kernels WRONG_RESULT",
                     problem.families["cpu_c"])
    assert "(persona repairer)" in p.system and "OpenMP pragmas only" in p.system
    assert "void kernel(const float *x, float *y, int64_t rows, int64_t cols)" in p.user
    assert "memory bandwidth 20.0 GB/s" in p.user and "4096x4096: 6.711 ms (memory-bound" in p.user
    assert "WRONG_RESULT: row sums off" in p.user and "shape 7x33, distribution masked (seed 5)" in p.user
    assert "max rel err 0.5, norm-relative err 0.125 at flat index 12" in p.user
    assert "12.5000 ms" in p.user and "54% of measured bandwidth" in p.user and "0.7% of fp32 peak" in p.user
    assert "- failed: 3 kernels WRONG_RESULT" in p.user and "corrected version of parent 1" in p.user
    # with a read-only figure the prompt names it, and a floor is priced as the judge's is: softmax writes as
    # many bytes as it reads, so its floor stays on the copy figure (6.711 ms at 4096x4096 either way)
    read = pb.DeviceInfo(model="Test CPU (2 threads)", threads=2, mem_bandwidth_gbps=20.0, read_bandwidth_gbps=40.0,
                         peak_gflops=100.0)
    q = prompt.build(PERSONAS["repairer"], problem, "cpu", read, parents, "", problem.families["cpu_c"])
    assert "read-only stream 40.0 GB/s" in q.user and "4096x4096: 6.711 ms (memory-bound" in q.user
    assert len(p.digest) == 64 and p.digest == prompt.build(PERSONAS["repairer"], problem, "cpu", dev, parents,
                                                            "- failed: 3 kernels WRONG_RESULT",
                                                            problem.families["cpu_c"]).digest


def _measured(origin: str, score: float, seconds: float = 1.0) -> pb.Measured:
    return pb.Measured(candidate=pb.Candidate(id=f"{origin}{score}", origin=origin), score_s=score, seconds=seconds)


def test_the_portfolio_gives_more_work_to_the_coder_that_yields_more():
    led = CoderLedger()
    led.on_measured(_measured("reference", 1.0))
    for score in (0.9, 0.8, 0.7, 0.6):  # the agent improves four times, the template coder never
        led.on_point(pb.PointProposed(origin="agent:memory_bound"))
        led.on_measured(_measured("agent:memory_bound", score))
        led.on_point(pb.PointProposed(origin="template:cpu_c"))
        led.on_measured(_measured("template:cpu_c", 2.0))
    assert led.arms["memory_bound"].improvements == 4 and led.arms["template"].improvements == 0
    rng = random.Random(3)
    picks = [led.choose(["template", "memory_bound"], rng, 1e-4) for _ in range(400)]
    assert picks.count("memory_bound") > 300
    assert led.choose(["template", "memory_bound", "repairer"], rng, 1e-4) == "repairer"  # untried first


def test_tokens_and_endpoint_failures_are_accounted_from_events():
    led = CoderLedger()
    led.on_candidate(pb.Candidate(origin="agent:repairer", agent=pb.AgentInfo(persona="repairer", tokens_in=100,
                                                                               tokens_out=40)))
    for reason in (pb.AGENT_TIMEOUT, pb.AGENT_UNAVAILABLE):
        led.on_rejected(pb.Rejected(stage="coder", reason=reason, agent=pb.AgentInfo(persona="memory_bound")))
    assert not led.endpoint_paused()
    led.on_rejected(pb.Rejected(stage="coder", reason=pb.AGENT_NO_CODE,
                                agent=pb.AgentInfo(persona="compute_bound", tokens_in=7, tokens_out=3)))
    assert led.endpoint_streak == 0 and led.tokens() == 150
    for _ in range(3):
        led.on_rejected(pb.Rejected(stage="coder", reason=pb.AGENT_UNAVAILABLE, agent=pb.AgentInfo(persona="repairer")))
    assert led.endpoint_paused()
    s = led.summary(1e-4)
    assert s["compute_bound"]["failures"] == {"AGENT_NO_CODE": 1} and s["repairer"]["tokens_in"] == 100


def test_agents_wait_for_parents_and_do_not_repeat_the_same_task_forever(settings):
    from kfactory.bus import events as ev
    from kfactory.services.planner import coders
    from kfactory.services.planner.campaign import CampaignState
    from kfactory.services.planner.summary import coder_summary

    spec = pb.CampaignSpec(problem="softmax", target="cpu", coders=["agent"], token_budget=1000)
    st = CampaignState("c1", spec, pb.DeviceInfo(), None)
    assert coders.eligible(st, settings) == []  # nothing measured, nothing failed: nothing to work from
    ref = pb.Candidate(id="r" * 64, origin="reference")
    for e in chain("c1", ref, 1.0):
        assert st.apply(e) == ""
    assert coders.eligible(st, settings) == ["memory_bound", "compute_bound"]
    st.apply(ev.make_event("c1", "compiler", "f", compile_failed=pb.CompileFailed(
        candidate=pb.Candidate(id="b" * 64, origin="manual:broken"), reason=pb.COMPILE_ERROR)))
    assert coders.parents_for(st, "repairer", 2) == ["b" * 64, "r" * 64]
    for i in range(2):
        st.apply(ev.make_event("c1", "planner", f"p{i}", point_proposed=coders.agent_point(
            st, "memory_bound", coders.parents_for(st, "memory_bound", 2), "cpu_c", i)))
    assert coders.eligible(st, settings) == ["compute_bound", "repairer"]  # memory_bound had these parents twice
    st.apply(ev.make_event("c1", "coder", "x", rejected=pb.Rejected(stage="coder", reason=pb.AGENT_NO_CODE,
                                                                 agent=pb.AgentInfo(persona="compute_bound",
                                                                                    tokens_in=990, tokens_out=10))))
    assert coders.eligible(st, settings) == []  # the token budget is spent
    assert coder_summary(st)["agent_tokens"] == {"in": 990, "out": 10, "budget": 1000}


def test_without_a_model_agents_are_off_and_the_summary_says_so():
    from kfactory.services.planner import coders
    from kfactory.services.planner.campaign import CampaignState
    from kfactory.services.planner.summary import coder_summary

    spec = pb.CampaignSpec(problem="softmax", target="cpu", coders=["template", "agent"])
    assert coders.validate(spec, Settings()) == "" and spec.token_budget == Settings().llm_token_budget
    st = CampaignState("c1", spec, pb.DeviceInfo(), None)
    st.agent_note = coders.agent_note(spec, Settings(llm_base_url=None, llm_model=None))
    assert "no model configured" in st.agent_note and not coders.agents_on(st)
    assert "KFACTORY_LLM_MODEL" in coder_summary(st)["agent_note"]
    assert coders.agent_note(spec, Settings(llm_base_url="http://x/v1", llm_model="m")) == ""
    assert "unknown ['gpt']" in coders.validate(pb.CampaignSpec(coders=["gpt"]), Settings())


def test_lessons_name_the_campaign_best_furthest_ahead_of_its_reference(tmp_path):
    """Every campaign's best is 1.0x its campaign's best; the lesson names the one with the largest speedup over
    its campaign's reference kernel, whichever campaign the archive lists first."""
    from kfactory.bus import events as ev
    from kfactory.services.memory.archive import Archive
    from kfactory.services.memory.lessons import lessons

    archive = Archive(tmp_path / "archive.sqlite")
    try:
        for cid, ref_s, best_s in (("c1", 1.0, 0.8), ("c2", 1.0, 0.25), ("c3", 1.0, 0.5)):
            spec = pb.CampaignSpec(problem="softmax", target="cpu")
            archive.record(ev.make_event(cid, "planner", "start", campaign_started=pb.CampaignStarted(spec=spec)))
            for origin, score in (("reference", ref_s), ("template:cpu_c", best_s)):
                cand = pb.Candidate(id=f"{cid}-{origin}", problem="softmax", target="cpu", origin=origin,
                                    params_json='{"unroll": 4}' if origin != "reference" else "{}")
                for e in chain(cid, cand, score, device=pb.DeviceInfo(model="cpu")):
                    assert archive.record(e)
        (best,) = [x for x in lessons(archive, "softmax", "cpu") if x.kind == "best"]
    finally:
        archive.close()
    assert best.value == 0.25 and "4.00x the reference kernel" in best.text


async def _agent_task(bus_settings, take_over: bool):
    """One agent task through the coder's persona consumer, over a real nats-server, while the model (the double)
    does not answer; with `take_over`, the task's fenced lock expires meanwhile and another worker takes it (as
    when this coder is paused past the lock's TTL). Returns the outcome and the events published for it."""
    import asyncio

    import nats.js.errors

    from kfactory.bus import events as ev
    from kfactory.bus.jetstream import NatsBus
    from kfactory.bus.outcomes import Delivery
    from kfactory.bus.topology import EVENTS_STREAM
    from kfactory.claims.memory import MemoryClaims
    from kfactory.platform.service import Context
    from kfactory.services.coder.service import CoderService

    now = [0.0]
    claims = MemoryClaims(clock=lambda: now[0])
    bus = await NatsBus.connect(bus_settings.nats_url, "t")
    with ScriptedModelServer({"memory_bound": [Hang()]}) as m:
        settings = _settings(m.url, "openai", llm_retries=0, llm_timeout_s=1.0).model_copy(update={
            "nats_url": bus_settings.nats_url, "data_dir": bus_settings.data_dir, "ack_wait_s": 30.0,
            "memory_addr": f"127.0.0.1:{free_port()}"})
        coder = CoderService(Context(settings, bus, claims))
        pp = pb.PointProposed(point_id="p" * 24, family="cpu_c", params_json="{}", problem="softmax", target="cpu",
                              origin="agent:memory_bound", agent=pb.AgentTask(persona="memory_bound"))
        event = ev.make_event("cstale", "planner", pp.point_id, point_proposed=pp)
        delivery = Delivery(event, "s", 1, None)  # type: ignore[arg-type]  # hand-made: no message behind it
        task = asyncio.create_task(coder.agents.handle("memory_bound", delivery))
        while not m.requests:  # the model has the prompt and is "thinking"
            await asyncio.sleep(0.05)
        if take_over:
            now[0] += 31.0  # past the lock's TTL on the claims store's clock
            newer = await claims.acquire(f"cstale:coder:{pp.point_id}", ttl_s=30.0)
            assert newer is not None
        outcome = await task
    try:
        msg = await bus.js.get_last_msg(EVENTS_STREAM, ev.event_subject("rejected", "cstale"))
        published = [pb.Event.FromString(msg.data)]
    except nats.js.errors.NotFoundError:  # nothing was published
        published = []
    done = await claims.cache_get(f"cstale:agent-done:{pp.point_id}")
    await coder.agents.close()
    await bus.close()
    return outcome, published, done


async def test_an_agent_task_taken_over_while_the_model_answers_is_left_not_published(bus_settings):
    from kfactory.bus.outcomes import Ack, Leave

    outcome, published, done = await _agent_task(bus_settings, take_over=True)
    assert outcome == Leave() and published == [] and done is None
    # the same task, still held: its typed failure is published and the delivery acked
    outcome, published, done = await _agent_task(bus_settings, take_over=False)
    assert outcome == Ack() and done == b"1"
    assert [e.rejected.reason for e in published] == [pb.AGENT_TIMEOUT]


def test_a_read_only_kernels_floor_in_the_prompt_is_priced_on_the_read_figure():
    """matvec_q4_1 writes ~0.1% of its bytes: its speed-of-light time is (close to) its bytes over the read
    figure, as the judge's floor prices it, not over the copy figure."""
    problem = load_problem("matvec_q4_1")
    copy_only = pb.DeviceInfo(threads=1, mem_bandwidth_gbps=10.0, peak_gflops=1e4)
    with_read = pb.DeviceInfo(threads=1, mem_bandwidth_gbps=10.0, read_bandwidth_gbps=20.0, peak_gflops=1e4)
    a, b = prompt._floors(problem, copy_only)[0], prompt._floors(problem, with_read)[0]
    assert b["bound"] == "memory" and 0.5 < b["floor_ms"] / a["floor_ms"] < 0.52   # 1.1% of its bytes written

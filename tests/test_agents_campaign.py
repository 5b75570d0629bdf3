"""Agent coders end to end: a campaign whose agents talk to ScriptedModelServer (a test double of the LLM
endpoint, over real HTTP); everything else is real (nats-server, the six services, gcc, the runners)."""
from __future__ import annotations

import json
import re
import shutil
import time

import pytest
import yaml

from conftest import KERNELS
from scripted_model import GARBAGE, Hang, Reply, ScriptedModelServer, fenced
from test_campaign import _campaign
from kfactory.v1 import events_pb2 as pb


@pytest.fixture(scope="module")
def slow_ref_softmax(small_softmax, tmp_path_factory) -> str:
    """The small softmax with its reference kernel compiled at -O0: a parent whose speed an agent's kernel beats
    by a margin that survives the noise of a busy machine."""
    dst = tmp_path_factory.mktemp("problems") / "softmax_slowref"
    shutil.copytree(small_softmax, dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["reference_kernel"]["cpu"]["flags"] = "-O0 -fopenmp"
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(dst)


def _script() -> dict:
    fast = (KERNELS / "softmax_two_pass.c").read_text()
    repaired = (KERNELS / "softmax_repaired.c").read_text()
    return {"repairer": [Reply(fenced(repaired, "Fixed: the row sum is s.", "-O3 -fopenmp"))],
            "memory_bound": [Reply(fenced(fast, "One expf per element.", "-O3 -march=native -fopenmp")), Hang()],
            # garbage, and garbage again when asked to fix it; later tasks never get an answer
            "compute_bound": [Reply(GARBAGE), Reply(GARBAGE), Hang()]}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_agents_repair_improve_and_fail_typed_without_stalling(bus_settings, slow_ref_softmax, provider):
    with ScriptedModelServer(_script()) as model:
        settings = bus_settings.model_copy(update={
            "llm_provider": provider, "llm_base_url": model.url + ("/v1" if provider == "openai" else ""),
            "llm_model": "scripted-double", "llm_timeout_s": 4.0, "llm_retries": 1, "llm_backoff_s": 0.1})
        spec = pb.CampaignSpec(problem=slow_ref_softmax, target="cpu", budget_candidates=4, coders=["agent"],
                               parallel=2, threads=1, seed=11, token_budget=10**6)
        spec.manual_sources.append(pb.ManualSource(name="broken", source=(KERNELS / "softmax_broken.c").read_text(),
                                                   compile_flags="-O2 -fopenmp"))
        t0 = time.monotonic()
        st, running = await _campaign(settings, spec, timeout=150)
        elapsed = time.monotonic() - t0
        served_in, served_out = model.tokens()
        requests = list(model.requests)
    assert st.finished.state == "completed"
    summary = json.loads(st.finished.summary_json)
    agents = summary["agents"]
    archive = running.services["memory"].archive
    events = archive.events(campaign=st.id)
    created = {e.candidate_created.candidate.origin: e.candidate_created.candidate for e in events
               if e.HasField("candidate_created")}
    broken, ref = created["manual:broken"], created["reference"]

    # the repairer was shown the compile error and the broken source, and its fix went through every stage
    fix = created["agent:repairer"]
    assert list(fix.parents)[0] == broken.id
    assert fix.agent.model == "scripted-double" and fix.agent.persona == "repairer" and fix.agent.backend == provider
    assert len(fix.agent.prompt_digest) == 64 and fix.agent.tokens_in > 0 and fix.agent.tokens_out > 0
    assert fix.compile_flags == "-O3 -fopenmp"
    rep_prompt = json.dumps(next(r["body"] for r in requests if r["persona"] == "repairer"))
    assert "(float)sum" in rep_prompt and "COMPILE_ERROR" in rep_prompt and "undeclared" in rep_prompt
    assert fix.id in st.measured and agents["repairer"]["measured"] == 1

    # the memory-bound specialist saw the reference's timings and returned a faster kernel
    fast = created["agent:memory_bound"]
    mem_prompt = json.dumps(next(r["body"] for r in requests if r["persona"] == "memory_bound"))
    assert "of measured bandwidth" in mem_prompt and ref.id[:12] in mem_prompt
    assert list(fast.parents)[0] == ref.id
    assert st.measured[fast.id].score_s < st.measured[ref.id].score_s
    assert agents["memory_bound"]["improvements"] >= 1

    # garbage (asked twice) and silence became typed failures; nothing waited for them
    failures = summary["agent_failures"]
    assert failures.get("AGENT_NO_CODE") == 1
    assert failures.get("AGENT_TIMEOUT") == 1
    assert agents["compute_bound"]["candidates"] == 0
    assert elapsed < 120
    rejected = [e.rejected for e in events if e.HasField("rejected") and e.rejected.HasField("agent")]
    timeout = next(r for r in rejected if r.reason == pb.AGENT_TIMEOUT)
    assert timeout.agent.attempts == 2 and timeout.agent.tokens_in == 0  # one retry, nothing billed
    garbage = next(r for r in rejected if r.reason == pb.AGENT_NO_CODE)
    assert garbage.agent.attempts == 2 and garbage.agent.persona == "compute_bound"

    # every token the double billed is in the campaign's accounts, per persona and in total
    assert summary["agent_tokens"] == {"in": served_in, "out": served_out, "budget": 10**6}
    assert sum(a["tokens_in"] for a in agents.values()) == served_in
    assert summary["counts"]["proposed"] == 6  # the reference, the broken kernel, four agent tasks

    # memory distilled lessons from it, with figures: the agents' outcomes and the compile error
    from kfactory.services.memory.lessons import as_text, lessons
    text = as_text(lessons(archive, "softmax", "cpu"))
    assert "persona repairer: 1 tasks, 1 measured" in text
    # its figure, not its rank: the repaired kernel is only about 2x slower, and this file's timings share the
    # cores with other tests (not `serial`)
    assert re.search(r"persona memory_bound: \d tasks, 1 measured, best \d+\.\d\dx its campaign's best", text)
    assert "AGENT_NO_CODE 1" in text and "AGENT_TIMEOUT 1" in text
    assert "1 kernels COMPILE_ERROR" in text and "fastest so far" in text

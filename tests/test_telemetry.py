"""kfactory.observability.tracing and kfactory.observability in one process: span links through headers, the JSON-lines
exporter, log lines with trace ids, the windowed gauges, the health server's readiness, the lag readers."""
from __future__ import annotations

import asyncio
import io
import json
import time

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from kfactory.bus import events as ev
from kfactory.observability import tracing as telemetry
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.outcomes import Ack
from kfactory.bus.topology import WORK_STREAM
from kfactory.observability.log import add_trace_ids
from kfactory.observability import metrics
from kfactory.observability.health import HealthServer
from kfactory.v1 import events_pb2 as pb


@pytest.fixture
def spans(tmp_path, monkeypatch):
    """A tracer provider writing to a JSON-lines file, for this test only; yields a reader of the file."""
    path = tmp_path / "spans.jsonl"
    provider = TracerProvider(resource=Resource.create({"service.name": "kfactory-test"}))
    provider.add_span_processor(SimpleSpanProcessor(telemetry.JsonLinesExporter(path)))
    monkeypatch.setattr(telemetry, "tracer", lambda: provider.get_tracer("kfactory"))
    yield lambda: [json.loads(line) for line in path.read_text().splitlines()]
    provider.shutdown()


def _event(kind: str = "compiled", cand: str = "c" * 64) -> pb.Event:
    body = {"compiled": pb.Compiled(candidate=pb.Candidate(id=cand))} if kind == "compiled" else \
        {"point_proposed": pb.PointProposed(point_id="p1")}
    return ev.make_event("camp1", "test", cand[:8], **body)


def test_a_consumer_span_is_the_child_of_the_span_that_published(spans):
    with telemetry.root_span("planner propose", **{"kf.point": "p1"}):
        header = telemetry.current_traceparent()
        root_ids = telemetry.trace_ids()
    assert header.startswith(f"00-{root_ids[0]}-{root_ids[1]}-")
    with telemetry.consumer_span("compiler", "kf.v1.work.compiler.camp1", {"traceparent": header}, _event()):
        with telemetry.child_span("compiler compile"):
            pass
    done = {s["name"]: s for s in spans()}
    root, consumer, child = done["planner propose"], done["compiler compiled"], done["compiler compile"]
    assert root["parent_id"] == "" and root["kind"] == "PRODUCER"
    assert consumer["trace_id"] == child["trace_id"] == root["trace_id"]
    assert consumer["parent_id"] == root["span_id"] and consumer["parent_remote"] is True
    assert child["parent_id"] == consumer["span_id"] and child["parent_remote"] is False
    assert consumer["attributes"]["kf.candidate"] == "c" * 64 and consumer["attributes"]["kf.campaign"] == "camp1"


def test_a_root_span_ignores_the_current_span(spans):
    with telemetry.root_span("a"):
        with telemetry.root_span("b"):
            pass
    a, b = sorted(spans(), key=lambda s: s["name"])
    assert a["trace_id"] != b["trace_id"] and b["parent_id"] == ""


def test_an_error_outcome_marks_the_span(spans):
    with telemetry.consumer_span("verifier", "s", {}, _event()) as span:
        telemetry.mark_outcome(span, "term", "artifact missing")
    (s,) = spans()
    assert s["status"] == "ERROR" and s["attributes"]["kf.outcome"] == "term"


def test_log_lines_carry_the_trace_and_the_bound_ids(spans):
    out = io.StringIO()
    structlog.reset_defaults()  # an earlier test's configuration (its level filter) must not carry over
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, add_trace_ids,
                                    structlog.processors.JSONRenderer()],
                        logger_factory=structlog.PrintLoggerFactory(file=out))
    try:
        with telemetry.consumer_span("compiler", "s", {}, _event()):
            ids = telemetry.trace_ids()
            structlog.get_logger().info("compiling")
        structlog.get_logger().info("outside")
    finally:
        structlog.reset_defaults()
    inside, outside = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (inside["trace_id"], inside["span_id"]) == ids
    assert inside["campaign"] == "camp1" and inside["candidate"] == "c" * 12 and inside["service"] == "compiler"
    assert "trace_id" not in outside and "campaign" not in outside


def test_without_a_provider_the_incoming_traceparent_is_kept(monkeypatch):
    from opentelemetry import trace

    # the API's no-op tracer (what a process without setup() gets; another test may have installed a provider
    # in this process, so it is named here) makes no span of its own: the propagated context stays the parent's
    monkeypatch.setattr(telemetry, "tracer", lambda: trace.NoOpTracer())
    header = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with telemetry.consumer_span("coder", "s", {"traceparent": header}, _event("point_proposed")):
        assert telemetry.current_traceparent() == header


def test_window_rate_and_busy_fraction_with_a_clock():
    now = [100.0]
    rate = metrics.WindowRate(window_s=10, clock=lambda: now[0])
    busy = metrics.BusyWindow(window_s=10, clock=lambda: now[0])
    now[0] = 110.0
    for _ in range(5):
        rate.tick()
    key = busy.begin()
    now[0] = 112.0
    assert busy.end(key) == pytest.approx(2.0)
    key = busy.begin()
    now[0] = 115.0
    assert rate.rate() == pytest.approx(0.5)  # 5 in the last 10 s
    assert busy.fraction() == pytest.approx((2 + 3) / 10)  # [110, 112] and [112, now], still held
    busy.end(key)
    now[0] = 121.0  # window [111, 121]: 1 s of [110, 112] and all 3 s of [112, 115]
    assert busy.fraction() == pytest.approx((1 + 3) / 10)
    assert rate.rate() == 0.0


def test_rejections_and_tokens_are_counted():
    before = metrics.REJECTIONS.labels("verifier", "WRONG_RESULT")._value.get()
    rej = pb.Rejected(stage="verifier", reason=pb.WRONG_RESULT)
    metrics.published(ev.make_event("c", "verifier", "x", rejected=rej))
    metrics.published(_event())  # not a rejection
    assert metrics.REJECTIONS.labels("verifier", "WRONG_RESULT")._value.get() == before + 1
    tokens = {kind: metrics.TOKENS.labels("agent_repairer", "m", kind)._value.get()
              for kind in ("prompt", "completion")}
    metrics.count_tokens("agent_repairer", "m", prompt=120, completion=30)
    assert metrics.TOKENS.labels("agent_repairer", "m", "prompt")._value.get() == tokens["prompt"] + 120
    assert metrics.TOKENS.labels("agent_repairer", "m", "completion")._value.get() == tokens["completion"] + 30


async def test_health_server_follows_readiness():
    ready = [False]
    server = HealthServer("127.0.0.1:0", lambda: ready[0], interval_s=0.05)
    port = await server.start()
    stop = asyncio.Event()
    watch = asyncio.create_task(server.watch(stop))

    async def status(service: str):
        # each check dials anew: the deadline bounds a hang, not how fast a busy host connects
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=20)
            return r.status
    try:
        assert await status("") == health_pb2.HealthCheckResponse.SERVING
        assert await status("ready") == health_pb2.HealthCheckResponse.NOT_SERVING
        ready[0] = True
        # the watch looks again every interval_s (0.05 s); a busy host may delay that by far more
        deadline = time.monotonic() + 20
        while (now := await status("ready")) != health_pb2.HealthCheckResponse.SERVING \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert now == health_pb2.HealthCheckResponse.SERVING
        stop.set()
        await watch
        assert await status("") == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        await server.stop()


async def test_stage_backlog_counts_work_with_and_without_a_consumer(nats_url):
    bus = await NatsBus.connect(nats_url, "t", timeout_s=30)   # a bound on a hang: a busy host connects slowly
    try:
        for i in range(3):
            await bus.send_work("compiler", _event(cand=f"{i}" * 64))
        assert await metrics.stage_backlog(bus.js, WORK_STREAM, "compiler") == (3, 0)
        release, held = asyncio.Event(), []

        async def slow(d):
            held.append(d)
            await release.wait()
            return Ack()
        stop = asyncio.Event()
        task = asyncio.create_task(bus.consume("compiler", slow, 1, stop))
        # making the consumer and the first delivery take round trips a busy host may stall: waited for, by a
        # deadline far past them
        deadline = time.monotonic() + 30
        while not held and not task.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert held, f"the consumer got no message within 30 s (its task: {task})"
        assert await metrics.stage_backlog(bus.js, WORK_STREAM, "compiler") == (2, 1)
        release.set()
        deadline = time.monotonic() + 30
        while (backlog := await metrics.stage_backlog(bus.js, WORK_STREAM, "compiler")) != (0, 0) \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert backlog == (0, 0)
        stop.set()
        await task
    finally:
        await bus.close()


def test_exporters_come_from_the_settings(tmp_path):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    from kfactory.platform.config import Settings

    assert telemetry.exporters(Settings()) == []
    made = telemetry.exporters(Settings(otlp_endpoint="http://collector:4317", trace_console=True,
                                        trace_file=tmp_path / "s.jsonl"))
    assert [type(e) for e in made] == [telemetry.JsonLinesExporter, OTLPSpanExporter, ConsoleSpanExporter]
    for e in made:
        e.shutdown()


def test_an_unwritable_trace_file_stops_serve_at_start_up(tmp_path):
    import os
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "KFACTORY_TRACE_FILE": str(blocker / "spans.jsonl")}
    res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "serve", "compiler"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "KFACTORY_TRACE_FILE" in res.stderr, res.stderr


def test_spans_reach_an_otlp_collector_at_the_configured_endpoint():
    """A real OTLP/gRPC receiver (the collector's TraceService) on a free port gets the spans, resource and
    attributes included, when OTEL_EXPORTER_OTLP_ENDPOINT (here: the setting it fills) points at it."""
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from kfactory.platform.config import Settings

    got = []

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            got.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        (exporter,) = telemetry.exporters(Settings(otlp_endpoint=f"http://127.0.0.1:{port}"))
        provider = TracerProvider(resource=Resource.create({"service.name": "kfactory-compiler"}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        with provider.get_tracer("kfactory").start_as_current_span("compiler compiled",
                                                                   attributes={"kf.campaign": "camp1"}):
            pass
        # waits out the export (it dials the collector first, within the exporter's own 10 s deadline)
        assert provider.force_flush(30_000)
        provider.shutdown()
    finally:
        server.stop(0)
    spans = [(rs.resource, s) for req in got for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    ((resource, span),) = spans
    assert span.name == "compiler compiled"
    assert {a.key: a.value.string_value for a in span.attributes} == {"kf.campaign": "camp1"}
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "kfactory-compiler"

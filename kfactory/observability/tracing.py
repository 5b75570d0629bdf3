"""Tracing: OpenTelemetry spans for every stage, their context carried in NATS message headers.

One candidate's journey is one trace: the planner's proposal of a design point is the trace's root, and each
stage's span (coder, compiler, verifier, benchmarker, and the planner's and memory's handling of the results)
is a child of the span that published the message it consumes, found through the W3C `traceparent` header.

Where spans go is configured once per process by `setup()` from Settings: an OTLP endpoint
(KFACTORY_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT), a JSON-lines file (KFACTORY_TRACE_FILE), the console
(KFACTORY_TRACE_CONSOLE), or nowhere. Without setup() (a library use, a unit test) every helper here still
works: the API's no-op tracer makes no spans and the incoming `traceparent` travels on unchanged.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor,
                                            SpanExporter, SpanExportResult)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kfactory.bus import events as ev
from kfactory.platform.config import Settings
from kfactory.v1 import events_pb2 as pb

TRACER_NAME = "kfactory"
_propagator = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()
_provider = None


class TelemetryConfigError(ValueError):
    """The tracing settings cannot work (an unwritable trace file, a bad endpoint); the message says which."""


def tracer() -> trace.Tracer:
    """kfactory's tracer (the no-op tracer until setup() installs a provider)."""
    return trace.get_tracer(TRACER_NAME)


def setup(settings: Settings, service: str) -> bool:
    """Install the process's tracer provider and its exporters; idempotent, the first call wins.

    Returns True when this call installed it. Raises TelemetryConfigError at start-up, not at the first span.
    """
    global _provider
    with _setup_lock:
        if _provider is not None:
            return False
        resource = Resource.create({"service.name": f"kfactory-{service}", "service.namespace": "kfactory",
                                    "service.instance.id": f"{socket.gethostname()}:{os.getpid()}"})
        sampler = ParentBased(TraceIdRatioBased(settings.trace_sample_ratio))
        provider = TracerProvider(resource=resource, sampler=sampler)
        for processor in _processors(settings):
            provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _provider = provider
        return True


def exporters(settings: Settings) -> list[SpanExporter]:
    """Where the settings send spans: a JSON-lines file, an OTLP/gRPC collector, the console (any of them)."""
    out: list[SpanExporter] = []
    if settings.trace_file is not None:
        out.append(JsonLinesExporter(settings.trace_file))
    if settings.otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        out.append(OTLPSpanExporter(endpoint=settings.otlp_endpoint, insecure=settings.otlp_insecure))
    if settings.trace_console:
        out.append(ConsoleSpanExporter())
    return out


def _processors(settings: Settings) -> list:
    # the file is written span by span, so a process killed mid-campaign keeps every span it had finished;
    # the network and the console get batches
    return [SimpleSpanProcessor(e) if isinstance(e, JsonLinesExporter) else BatchSpanProcessor(e)
            for e in exporters(settings)]


def shutdown() -> None:
    """Flush and close the exporters (call once at process exit)."""
    with _setup_lock:
        if _provider is not None:
            _provider.shutdown()


class JsonLinesExporter(SpanExporter):
    """A span exporter that appends one compact JSON object per finished span to a file."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        except OSError as e:
            raise TelemetryConfigError(f"trace file {self.path}: {e.strerror}; set KFACTORY_TRACE_FILE to a "
                                       "writable path") from e
        self._lock = threading.Lock()

    def export(self, spans: Sequence) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), separators=(",", ":")) + "\n" for s in spans)
        with self._lock:
            self._file.write(lines)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(span) -> dict:
    """A finished span as a flat dict: ids in hex, times in ns, attributes as given."""
    ctx, parent = span.get_span_context(), span.parent
    return {"name": span.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
            "parent_id": f"{parent.span_id:016x}" if parent else "", "parent_remote": bool(parent and parent.is_remote),
            "service": span.resource.attributes.get("service.name", ""), "kind": span.kind.name,
            "start_ns": span.start_time, "end_ns": span.end_time, "status": span.status.status_code.name,
            "attributes": dict(span.attributes or {})}


# -- propagation -------------------------------------------------------------------------------------
def current_traceparent() -> str:
    """The W3C traceparent of the current span, or "" when there is no recording span."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")


def trace_ids() -> tuple[str, str]:
    """(trace id, span id) in hex of the current span, or ("", "")."""
    ctx = trace.get_current_span().get_span_context()
    return (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}") if ctx.is_valid else ("", "")


def _event_attrs(event: pb.Event) -> dict[str, str]:
    cand = ev.candidate_of(event)
    attrs = {"kf.campaign": event.campaign_id, "kf.event": ev.kind_of(event), "kf.event_id": event.id}
    if cand is not None and cand.id:
        attrs["kf.candidate"] = cand.id
    point = getattr(getattr(event, ev.kind_of(event), None), "point_id", "") if ev.kind_of(event) else ""
    if point:
        attrs["kf.point"] = point
    return attrs


@contextlib.contextmanager
def consumer_span(service: str, subject: str, headers: Mapping[str, str] | None, event: pb.Event,
                  **attrs) -> Iterator[trace.Span]:
    """A span around one consumed message, a child of the span that published it (from its headers).

    The campaign, candidate and service are bound to structlog's context for the span's length.
    """
    parent = _propagator.extract(dict(headers or {}))
    attributes = {"messaging.system": "nats", "messaging.destination.name": subject, "kf.service": service,
                  **_event_attrs(event), **attrs}
    name = f"{service} {ev.kind_of(event) or 'message'}"
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.CONSUMER, attributes=attributes,
                                        record_exception=True, set_status_on_exception=True) as span:
        cand = attributes.get("kf.candidate", "")
        # trace and span ids come from kfactory.observability.log.add_trace_ids, so a child span's lines carry the
        # child's
        with structlog.contextvars.bound_contextvars(campaign=event.campaign_id, service=service,
                                                     candidate=cand[:12]):
            yield span


@contextlib.contextmanager
def root_span(name: str, **attrs) -> Iterator[trace.Span]:
    """A new trace (no parent, whatever span is current): the start of one design point's journey."""
    with tracer().start_as_current_span(name, context=otel_context.Context(), kind=SpanKind.PRODUCER,
                                        attributes={k: v for k, v in attrs.items() if v is not None}) as span:
        yield span


@contextlib.contextmanager
def child_span(name: str, **attrs) -> Iterator[trace.Span]:
    """A span inside the current one (a stage's own work, a wait for a device)."""
    with tracer().start_as_current_span(name, attributes={k: v for k, v in attrs.items() if v is not None}) as span:
        yield span


def annotate(**attrs) -> None:
    """Add attributes (kf.<key>) to the current span and bind them to the log context, e.g. a candidate id
    that only the coder knows once it has rendered the source."""
    span = trace.get_current_span()
    for k, v in attrs.items():
        span.set_attribute(f"kf.{k}", v)
    structlog.contextvars.bind_contextvars(**{k: (v[:12] if k == "candidate" else v) for k, v in attrs.items()})


def mark_outcome(span: trace.Span, outcome: str, reason: str = "") -> None:
    """Record a message's fate on its span: an error status only for what will be dead-lettered."""
    span.set_attribute("kf.outcome", outcome)
    if reason:
        span.set_attribute("kf.reason", reason)
    if outcome in ("term", "error"):
        span.set_status(Status(StatusCode.ERROR, reason or outcome))

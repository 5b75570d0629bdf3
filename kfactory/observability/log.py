"""structlog set-up: JSON lines for services, readable lines for the CLI; context ids bound per message."""
from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog
from opentelemetry import trace


def configure(level: str = "info", json: bool = False) -> None:
    """Configure logging once per process; logs go to stderr so stdout stays for results."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, add_trace_ids, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso"), structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # a stand-in for a TextIO: PrintLogger only writes and flushes
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr())),
        cache_logger_on_first_use=False,
    )


class _Stderr:
    """Whatever sys.stderr is when a line is written: a logger configured once must not keep a stream that was
    swapped and closed since (a test's captured stream, a redirected one)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def add_trace_ids(logger, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Bind the current OpenTelemetry span's trace and span ids, so a log line leads to its trace."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict.setdefault("trace_id", f"{ctx.trace_id:032x}")
        event_dict.setdefault("span_id", f"{ctx.span_id:016x}")
    return event_dict


def get_logger(name: str):
    """A logger bound to a component name."""
    return structlog.get_logger(component=name)

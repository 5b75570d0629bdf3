"""gRPC server set-up shared by the planner and memory: health checking, server reflection, and error texts
clipped to what a status can carry."""
from __future__ import annotations

import inspect
import traceback

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kfactory.observability.log import get_logger

#: the most bytes an error's text takes in a status: the text travels in the grpc-message trailer, percent-encoded
#: where it is not printable ASCII, and gRPC refuses trailers over 8 KiB in all (RESOURCE_EXHAUSTED instead of the
#: error), so a text quoting megabytes of a request must be cut to this
MAX_DETAILS_BYTES = 4096

log = get_logger("grpc")


class GrpcBindError(RuntimeError):
    """The gRPC port could not be bound."""


async def start_server(addr: str, add_servicer, service_full_name: str, servicer,
                       settings=None) -> tuple[grpc.aio.Server, int]:
    """Start an aio server with one service, health (SERVING) and reflection; returns (server, port).

    With settings of the secure profile (kfactory.platform.security) it listens with TLS and demands the bearer
    token."""
    from kfactory.platform import security

    creds = security.server_credentials(settings) if settings is not None else None
    # the clipping interceptor last: innermost, it sees the servicer's own aborts and exceptions
    interceptors = (security.server_interceptors(settings) if settings is not None else []) + [ClipDetails()]
    # no SO_REUSEPORT: a second planner (or memory) on the same address must fail to start, not share its port
    # with the first and split the clients between two services that each believe they are the one
    server = grpc.aio.server(interceptors=interceptors, options=[("grpc.so_reuseport", 0)])
    add_servicer(servicer, server)
    hs = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection((service_full_name, reflection.SERVICE_NAME, "grpc.health.v1.Health"),
                                        server)
    try:
        port = server.add_secure_port(addr, creds) if creds is not None else server.add_insecure_port(addr)
    except RuntimeError as e:
        raise GrpcBindError(f"cannot listen on {addr}: {e}") from e
    if port == 0:
        raise GrpcBindError(f"cannot listen on {addr} (in use?)")
    await server.start()
    await _set_serving(hs, service_full_name)
    return server, port


async def _set_serving(hs, name: str) -> None:
    for svc in ("", name):
        res = hs.set(svc, health_pb2.HealthCheckResponse.SERVING)
        if hasattr(res, "__await__"):
            await res


def clip(text: str, limit: int = MAX_DETAILS_BYTES) -> str:
    """`text` as it is when it takes at most `limit` bytes in a status (see MAX_DETAILS_BYTES), else its head and
    its tail with how many characters were cut between them: an error's text may quote what a caller sent (a
    problem name, a strategy, an id of megabytes), and its end often says what to do instead."""
    if len(text) <= limit and sum(map(_cost, text)) <= limit:
        return text
    head = _take(text[:limit], limit * 2 // 3)
    tail = _take(text[-limit:][::-1], limit // 3 - 64)[::-1]
    return f"{head} [... {len(text) - len(head) - len(tail)} characters cut ...] {tail}"


def _cost(ch: str) -> int:
    """Bytes a character takes in the grpc-message trailer: printable ASCII as itself, the rest percent-encoded."""
    return 1 if " " <= ch <= "~" and ch != "%" else 3 * len(ch.encode("utf-8", "surrogatepass"))


def _take(chars: str, budget: int) -> str:
    """The longest prefix of `chars` that costs at most `budget` bytes."""
    used = 0
    for i, ch in enumerate(chars):
        used += _cost(ch)
        if used > budget:
            return chars[:i]
    return chars


class _ClippedContext:
    """A servicer context whose error texts are clipped (abort, set_details); everything else is the call's own."""

    def __init__(self, context):
        self._context = context

    def __getattr__(self, name):
        return getattr(self._context, name)

    async def abort(self, code, details: str = "", trailing_metadata=()):
        await self._context.abort(code, clip(details), trailing_metadata)

    def set_details(self, details: str) -> None:
        self._context.set_details(clip(details))


class ClipDetails(grpc.aio.ServerInterceptor):
    """Clips the text of every status a unary-request method ends with (clip): the servicer's aborts, and an
    exception it did not expect, which is logged and answered UNKNOWN with its clipped text (gRPC's own answer
    would quote all of it). Streaming-request methods (reflection) pass through."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_clipped_unary(handler.unary_unary, method))
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            return handler._replace(unary_stream=_clipped_stream(handler.unary_stream, method))
        return handler


def _clipped_unary(behavior, method: str):
    async def call(request, context):
        clipped = _ClippedContext(context)
        try:
            return await behavior(request, clipped)
        except grpc.aio.BaseError:  # an abort (its text clipped already) or gRPC's own
            raise
        except Exception as e:  # noqa: BLE001 - answered as gRPC would, with the text cut to fit
            await _unexpected(clipped, method, e)
    return call


def _clipped_stream(behavior, method: str):
    async def call(request, context):
        clipped = _ClippedContext(context)
        try:
            async for item in behavior(request, clipped):
                yield item
        except grpc.aio.BaseError:
            raise
        except Exception as e:  # noqa: BLE001 - answered as gRPC would, with the text cut to fit
            await _unexpected(clipped, method, e)
    return call


async def _unexpected(context: _ClippedContext, method: str, e: Exception) -> None:
    # where it was raised, without the traceback's own copy of the (possibly huge) message
    where = [f"{f.name} ({f.filename}:{f.lineno})" for f in traceback.extract_tb(e.__traceback__)[-4:]]
    log.error("gRPC method raised", method=method, error=clip(repr(e), 1000), where=" > ".join(where))
    await context.abort(grpc.StatusCode.UNKNOWN, f"Unexpected {type(e)}: {e}")

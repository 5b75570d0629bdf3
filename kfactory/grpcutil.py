"""gRPC server set-up shared by the planner and memory: health checking and server reflection."""
from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection


class GrpcBindError(RuntimeError):
    """The gRPC port could not be bound."""


async def start_server(addr: str, add_servicer, service_full_name: str, servicer,
                       settings=None) -> tuple[grpc.aio.Server, int]:
    """Start an aio server with one service, health (SERVING) and reflection; returns (server, port).

    With settings of the secure profile (kfactory.security) it listens with TLS and demands the bearer token."""
    from kfactory import security  # here: security imports the bus, which servers of every kind need not

    creds = security.server_credentials(settings) if settings is not None else None
    server = grpc.aio.server(interceptors=security.server_interceptors(settings) if settings is not None else None)
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

"""The secure profile: who may do what on the bus, and how services and clients prove who they are.

* NATS: one user per service. `PERMISSIONS` (the topology's roles, kfactory/bus/topology.py ROLES) is the one
  table of what each service publishes, queues and consumes; `nats_authorization()` turns it into the
  nats-server `authorization` block (used by the embedded server, the tests and the Kubernetes config), so a
  compiler's credentials cannot publish a verdict.
* Redis: AUTH with `settings.redis_password` (`redis_url()` adds it to the URL).
* gRPC: TLS (`settings.grpc_tls_cert/key`) and a bearer token (`settings.grpc_token`) checked by
  `TokenInterceptor`; health checks stay open so probes need no secret. `channel()` is the client side.

Secrets are `SecretStr` settings (environment or files in KFACTORY_SECRETS_DIR) and are never logged.
"""
from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

import grpc

from kfactory.bus import events as ev
from kfactory.bus.topology import (ARTIFACT_BUCKET, DLQ_STREAM, EVENTS_STREAM, OBJ_STREAM, ROLES, WORK_STREAM,
                                   Role, subject_matches)
from kfactory.platform.config import Settings

class SecurityConfigError(ValueError):
    """The secure profile is half configured; the message names the missing setting."""


#: THE permissions table is the topology's roles table (kfactory/bus/topology.py ROLES): what a service queues,
#: consumes and publishes there is what its NATS user may do, and nothing else.
PERMISSIONS: dict[str, Role] = ROLES


def _common() -> list[str]:
    """Every service finds (or, first up, creates) the streams and reads artifacts."""
    streams = (WORK_STREAM, EVENTS_STREAM, DLQ_STREAM, OBJ_STREAM)
    # STREAM.NAMES: nats-py's object-store get finds the bucket's stream by subject (read-only, names only)
    return (["$JS.API.INFO", "$JS.API.STREAM.NAMES"] + [f"$JS.API.STREAM.INFO.{s}" for s in streams]
            + [f"$JS.API.STREAM.CREATE.{s}" for s in streams]
            # reading one event by subject: is there a CampaignStarted for the campaign of a work message?
            + [f"$JS.API.STREAM.MSG.GET.{EVENTS_STREAM}", f"$JS.API.DIRECT.GET.{EVENTS_STREAM}.>"]
            + [f"$JS.API.STREAM.MSG.GET.{OBJ_STREAM}", f"$JS.API.DIRECT.GET.{OBJ_STREAM}.>",
               f"$JS.API.CONSUMER.CREATE.{OBJ_STREAM}", f"$JS.API.CONSUMER.CREATE.{OBJ_STREAM}.>",
               f"$JS.API.CONSUMER.DELETE.{OBJ_STREAM}.>", f"$JS.FC.{OBJ_STREAM}.>"])


def _consumer(stage: str) -> list[str]:
    s = WORK_STREAM
    return [f"$JS.API.CONSUMER.CREATE.{s}.{stage}", f"$JS.API.CONSUMER.CREATE.{s}.{stage}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.{stage}", f"$JS.API.CONSUMER.INFO.{s}.{stage}",
            f"$JS.API.CONSUMER.MSG.NEXT.{s}.{stage}", f"$JS.ACK.{s}.{stage}.>", f"{ev.DLQ_PREFIX}.{stage}.>"]


def _follower() -> list[str]:
    s = EVENTS_STREAM
    return [f"$JS.API.CONSUMER.CREATE.{s}", f"$JS.API.CONSUMER.CREATE.{s}.>", f"$JS.API.CONSUMER.DURABLE.CREATE.{s}.>",
            f"$JS.API.CONSUMER.INFO.{s}.>", f"$JS.API.CONSUMER.MSG.NEXT.{s}.>", f"$JS.API.CONSUMER.DELETE.{s}.>",
            f"$JS.ACK.{s}.>"]


def publish_subjects(service: str) -> list[str]:
    """Every subject `service` may publish to (JetStream API calls included), from PERMISSIONS."""
    role = PERMISSIONS[service]
    subjects = _common()
    if role.writes_artifacts:
        subjects += [f"$O.{ARTIFACT_BUCKET}.C.>", f"$O.{ARTIFACT_BUCKET}.M.>", f"$JS.API.STREAM.PURGE.{OBJ_STREAM}"]
    if role.follows_events:
        subjects += _follower()
    for stage in role.consumes:
        subjects += _consumer(stage)
    if role.consumes:  # a consumer dead-letters what can never succeed, as an event too
        subjects.append(ev.event_subject("dead_letter", "*"))
    subjects += [ev.event_subject(kind, "*") for kind in role.publishes]
    subjects += [ev.work_subject(stage, "*") for stage in role.queues]
    return list(dict.fromkeys(subjects + list(role.extra)))


def not_permitted(user: str, services) -> list[str]:
    """The subjects the named services publish to (JetStream API calls included) that NATS user `user` may not:
    empty when the user is each service's own (or, running several in one process, covers them all)."""
    allowed = publish_subjects(user)
    return list(dict.fromkeys(s for n in services for s in publish_subjects(n)
                              if not any(subject_matches(p, s) for p in allowed)))


def nats_authorization(passwords: Mapping[str, str], *, admin_password: str | None = None,
                       as_variables: bool = False) -> str:
    """The nats-server `authorization { users: [...] }` block: one user per service, with its permissions.

    `passwords` maps each service to its password, or, with `as_variables`, to the name of an environment
    variable of the NATS server holding it (Kubernetes fills those from a Secret). Replies come on _INBOX."""
    missing = [s for s in PERMISSIONS if s not in passwords]
    if missing:
        raise SecurityConfigError(f"no NATS password for {', '.join(missing)}")
    users = []
    for service in PERMISSIONS:
        secret = f"${passwords[service]}" if as_variables else json.dumps(passwords[service])
        users.append(f"    {{user: {service}, password: {secret}, permissions: {{\n"
                     f"      publish: {json.dumps(publish_subjects(service))}\n"
                     f"      subscribe: [\"_INBOX.>\"]\n    }}}}")
    if admin_password is not None:
        secret = f"${admin_password}" if as_variables else json.dumps(admin_password)
        users.append(f"    {{user: admin, password: {secret}}}")
    return "authorization {\n  users: [\n" + ",\n".join(users) + "\n  ]\n}\n"


# -- Redis ----------------------------------------------------------------------------------------------
def redis_url(settings: Settings) -> str | None:
    """settings.redis_url with settings.redis_password as its AUTH password (a password in the URL wins)."""
    url = settings.redis_url
    if not url or settings.redis_password is None:
        return url
    parts = urlsplit(url)
    if parts.password:
        return url
    host = f"{parts.hostname}:{parts.port}" if parts.port else (parts.hostname or "")
    secret = quote(settings.redis_password.get_secret_value(), safe="")
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{secret}@{host}"))


# -- gRPC -----------------------------------------------------------------------------------------------
#: methods anyone may call: Kubernetes probes carry no token
OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call but health checks unless it carries `authorization: Bearer <settings.grpc_token>`."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method in OPEN_METHODS:
            return await continuation(handler_call_details)
        given = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(given.encode(), self._expected):  # constant time: no timing oracle on the token
            return await continuation(handler_call_details)
        return _refusal(given)


def _refusal(given: str) -> grpc.RpcMethodHandler:
    why = "no bearer token: set KFACTORY_GRPC_TOKEN" if not given else "wrong bearer token"

    async def refuse(request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    return grpc.unary_unary_rpc_method_handler(refuse)


def secure(settings: Settings) -> bool:
    """True when the gRPC services run with TLS (the secure profile)."""
    return settings.grpc_tls_cert is not None


def server_interceptors(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    """The token check when a token is configured."""
    return [TokenInterceptor(settings.grpc_token.get_secret_value())] if settings.grpc_token else []


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from grpc_tls_cert/grpc_tls_key; None without a certificate (plaintext)."""
    if settings.grpc_tls_cert is None:
        return None
    if settings.grpc_tls_key is None:
        raise SecurityConfigError("grpc_tls_cert is set but grpc_tls_key is not: set KFACTORY_GRPC_TLS_KEY")
    return grpc.ssl_server_credentials([(settings.grpc_tls_key.read_bytes(), settings.grpc_tls_cert.read_bytes())])


def channel(addr: str, settings: Settings | None) -> grpc.aio.Channel:
    """A client channel to a kfactory gRPC service: TLS (trusting grpc_tls_ca, else the server's certificate)
    and the bearer token when the settings have them; plaintext otherwise."""
    if settings is None or not secure(settings):
        if settings is not None and settings.grpc_token:
            raise SecurityConfigError("a gRPC token is only sent over TLS: set KFACTORY_GRPC_TLS_CERT (and _KEY)")
        return grpc.aio.insecure_channel(addr)
    trusted = settings.grpc_tls_ca or settings.grpc_tls_cert
    if trusted is None:  # secure() says there is a certificate: unreachable unless the settings change under us
        raise SecurityConfigError("no certificate to trust: set KFACTORY_GRPC_TLS_CA or KFACTORY_GRPC_TLS_CERT")
    ca = trusted.read_bytes()
    creds = grpc.ssl_channel_credentials(root_certificates=ca)
    if settings.grpc_token:
        creds = grpc.composite_channel_credentials(
            creds, grpc.access_token_call_credentials(settings.grpc_token.get_secret_value()))
    return grpc.aio.secure_channel(addr, creds)

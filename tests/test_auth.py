"""The secure profile against real servers: NATS users per service with subject permissions generated from
kfactory.platform.security.PERMISSIONS, Redis AUTH, gRPC with TLS (a self-signed certificate made here) and a bearer
token. A whole campaign runs with it; strangers and wrongly-permissioned clients are refused; no secret is logged."""
from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import grpc
import nats
import nats.errors
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kfactory.bus import events as ev
from kfactory.bus.errors import BusUnavailable
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.topology import EVENTS_STREAM
from kfactory.claims import ClaimsError, open_claims
from kfactory.platform.config import Settings
from kfactory.platform.security import PERMISSIONS, channel, nats_authorization, publish_subjects, redis_url
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc

sys.path.insert(0, str(Path(__file__).parent))
from fault_plant import SERVICES, Nats, Plant, Redis, check_exactly_once  # noqa: E402
from tuning_synth import write_spaces  # noqa: E402


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost / 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kfactory-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """Secure NATS and Redis, credentials per service, a certificate and a token."""
    tmp = tmp_path_factory.mktemp("secure")
    passwords = {s: secrets.token_urlsafe(18) for s in PERMISSIONS}
    nats_srv = Nats(tmp / "nats", config=nats_authorization(passwords))
    redis_pw = secrets.token_urlsafe(18)
    redis_srv = Redis(tmp / "redis", password=redis_pw)
    cert, key = self_signed(tmp)
    token = secrets.token_urlsafe(24)
    try:
        yield {"tmp": tmp, "nats": nats_srv, "redis": redis_srv, "passwords": passwords, "redis_pw": redis_pw,
               "cert": cert, "key": key, "token": token}
    finally:
        nats_srv.close()
        redis_srv.stop()


def test_the_permissions_table_gives_verdicts_only_to_the_verifier():
    may_publish = {s: publish_subjects(s) for s in PERMISSIONS}
    assert [s for s, subjects in may_publish.items() if ev.event_subject("verified", "*") in subjects] == ["verifier"]
    measured = ev.event_subject("measured", "*")
    assert [s for s, subjects in may_publish.items() if measured in subjects] == ["benchmarker"]
    assert not any(x.startswith("kf.v1.evt.") for x in may_publish["memory"])
    assert not any(">" == x or x.startswith("kf.v1.evt.>") for subjects in may_publish.values() for x in subjects)


def test_strangers_and_wrong_passwords_are_refused(secure):
    url = secure["nats"].url
    with pytest.raises(BusUnavailable):
        asyncio.run(NatsBus.connect(url, "stranger", timeout_s=2))
    with pytest.raises(BusUnavailable):
        asyncio.run(NatsBus.connect(url, "thief", user="compiler", password="not-the-password", timeout_s=2))
    with pytest.raises(nats.errors.Error):
        asyncio.run(_bare_connect(url, None, None))


def test_a_compilers_credentials_cannot_publish_a_verdict(secure):
    url, pw = secure["nats"].url, secure["passwords"]
    violations, stored = asyncio.run(_compiler_publishes(url, pw))
    assert any("permissions violation" in v.lower() and "kf.v1.evt.verified" in v for v in violations), violations
    assert stored == {"compiled": 1, "verified": 0}


def test_subjects_match_as_the_server_matches_them():
    from kfactory.bus.topology import subject_matches
    cases = [("kf.v1.evt.measured.*", "kf.v1.evt.measured.c1", True),
             ("kf.v1.evt.measured.*", "kf.v1.evt.measured.c1.x", False),
             ("kf.v1.evt.measured.*", "kf.v1.evt.verified.c1", False),
             ("kf.v1.dlq.compiler.>", "kf.v1.dlq.compiler.c1", True),
             ("kf.v1.dlq.compiler.>", "kf.v1.dlq.compiler", False),
             ("$O.artifacts.C.>", "$O.artifacts.C.a.b.c", True),
             ("kf.v1.work.*.*", "kf.v1.work.coder", False)]
    assert [subject_matches(p, s) for p, s, _ in cases] == [want for _, _, want in cases]


def test_a_service_is_refused_before_the_server_what_its_role_may_not_publish(secure):
    """The bus's own check agrees with the server: what the compiler's user may publish goes through, a
    verdict is refused at once with a typed error (the server alone would give a publish timeout)."""
    from kfactory.bus.errors import PublishNotPermitted

    async def go():
        bus = await NatsBus.connect(secure["nats"].url, "compiler", user="compiler",
                                password=secure["passwords"]["compiler"])
        bus.may_publish = publish_subjects("compiler")
        try:
            await bus.publish(ev.make_event("c-perm", "compiler", "ok", compiled=pb.Compiled(artifact_digest="a")))
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(PublishNotPermitted, match="compiler may not publish to kf.v1.evt.verified"):
                await bus.publish(ev.make_event("c-perm", "compiler", "v", verified=pb.Verified(seconds=1.0)))
            return asyncio.get_running_loop().time() - t0
        finally:
            await bus.close()

    assert asyncio.run(go()) < 0.5


def test_redis_refuses_a_client_without_the_password(secure):
    r = secure["redis"]
    with pytest.raises(ClaimsError):
        asyncio.run(_ping(r.url))
    asyncio.run(_ping(redis_url(Settings(redis_url=r.url, redis_password=secure["redis_pw"]))))


def test_serve_without_credentials_exits_with_what_to_set(secure):
    env = {**os.environ, "KFACTORY_NATS_URL": secure["nats"].url, "KFACTORY_LOG_LEVEL": "warning"}
    res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "serve", "compiler"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "KFACTORY_NATS_USER" in res.stderr, res.stderr
    env.update(KFACTORY_NATS_USER="compiler", KFACTORY_NATS_PASSWORD=secure["passwords"]["compiler"],
               KFACTORY_REDIS_URL=secure["redis"].url)
    res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "serve", "compiler"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "claims store" in res.stderr and "KFACTORY_REDIS" in res.stderr, res.stderr


def test_a_campaign_runs_in_the_secure_profile_and_strangers_get_nothing(secure):
    """Six processes, each with its own NATS user; Redis AUTH; gRPC over TLS with a token."""
    tmp = secure["tmp"]
    space = write_spaces(tmp / "spaces", devices=("GPU0",))[0]
    secret_env = {"KFACTORY_REDIS_PASSWORD": secure["redis_pw"], "KFACTORY_GRPC_TOKEN": secure["token"],
                  "KFACTORY_GRPC_TLS_CERT": str(secure["cert"]), "KFACTORY_GRPC_TLS_KEY": str(secure["key"])}
    plant = Plant(tmp, secure["nats"].url, secure["redis"].url, secret_env)
    plant.tls = (secure["cert"].read_bytes(), secure["token"])
    for s in SERVICES:
        plant.extra[s] = {"KFACTORY_NATS_USER": s, "KFACTORY_NATS_PASSWORD": secure["passwords"][s]}
    try:
        plant.start_all()
        cid = plant.submit(pb.CampaignSpec(problem=f"replay:{space}", target=f"replay:{space}", strategy="random",
                                           budget_candidates=10, parallel=4, seed=7, warm_start=0))
        status = plant.wait_finished(cid)
        assert status.state == "completed" and status.counts.measured >= 5, status
        check_exactly_once(plant, cid, status)
        _strangers_are_refused(plant, cid, secure["cert"].read_bytes())
        _evidence_over_tls(plant, cid, secure)
    finally:
        plant.stop()
    logs = "".join((tmp / f"{s}.log").read_text(errors="replace") for s in SERVICES)
    for secret in [*secure["passwords"].values(), secure["redis_pw"], secure["token"]]:
        assert secret not in logs  # secrets are never logged


def _strangers_are_refused(plant: Plant, cid: str, ca: bytes) -> None:
    req = spb.GetCampaignRequest(id=cid)
    for token in ("", "wrong-token"):
        with plant.channel(plant.planner_addr, token=token) as ch:
            with pytest.raises(grpc.RpcError) as err:
                sgrpc.CampaignsStub(ch).Get(req, timeout=5)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value
    with grpc.insecure_channel(plant.planner_addr) as ch:  # plaintext to a TLS port: no answer at all
        with pytest.raises(grpc.RpcError) as err:
            sgrpc.CampaignsStub(ch).Get(req, timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    with plant.channel(plant.planner_addr) as ch:  # and the right token gets the status
        assert sgrpc.CampaignsStub(ch).Get(req, timeout=5).state == "completed"


def _evidence_over_tls(plant: Plant, cid: str, secure: dict) -> None:
    """The CLI's client path (security.channel, as `kfactory best` uses it) reads memory over TLS."""
    settings = Settings(grpc_tls_cert=secure["cert"], grpc_token=secure["token"])

    async def board():
        async with channel(plant.memory_addr, settings) as ch:
            return await sgrpc.EvidenceStub(ch).Leaderboard(spb.LeaderboardRequest(campaign_id=cid), timeout=10)

    assert len(asyncio.run(board()).entries) >= 5
    env = {**plant.env, "KFACTORY_GRPC_TLS_CERT": str(secure["cert"]), "KFACTORY_GRPC_TOKEN": secure["token"]}
    res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "status", cid, "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout)["state"] == "completed", res.stderr


# -- helpers -----------------------------------------------------------------------------------------------
async def _bare_connect(url: str, user: str | None, password: str | None):
    nc = await nats.connect(url, user=user, password=password, allow_reconnect=False, connect_timeout=2,
                            max_reconnect_attempts=0)
    await nc.close()


async def _ping(url: str) -> None:
    claims = open_claims(url)
    try:
        await claims.ping()
    finally:
        await claims.close()


async def _compiler_publishes(url: str, pw: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    """As the compiler: publish a compiled result (allowed) and a verdict (refused). Counts what the events
    stream holds afterwards, read as memory."""
    violations: list[str] = []

    async def on_error(e: Exception) -> None:
        violations.append(str(e))

    # the planner's connection creates the streams
    planner = await NatsBus.connect(url, "p", user="planner", password=pw["planner"], timeout_s=3)
    await planner.close()
    nc = await nats.connect(url, user="compiler", password=pw["compiler"], error_cb=on_error)
    js = nc.jetstream()
    cand = pb.Candidate(id="a" * 64, campaign_id="cauth")
    ok = ev.make_event("cauth", "compiler", cand.id, compiled=pb.Compiled(candidate=cand))
    await js.publish(ev.event_subject("compiled", "cauth"), ok.SerializeToString(), timeout=3)
    verdict = ev.make_event("cauth", "compiler", cand.id, verified=pb.Verified(candidate=cand))
    with pytest.raises(nats.errors.Error):  # no stream ever acknowledges it: the server dropped it
        await js.publish(ev.event_subject("verified", "cauth"), verdict.SerializeToString(), timeout=2)
    await nc.publish(ev.event_subject("verified", "cauth"), verdict.SerializeToString())  # core NATS too
    await nc.flush()
    await asyncio.sleep(0.3)
    await nc.close()
    mem = await nats.connect(url, user="memory", password=pw["memory"])
    try:
        js = mem.jetstream()
        counts = {}
        for kind in ("compiled", "verified"):
            info = await js.stream_info(EVENTS_STREAM, subjects_filter=ev.event_subject(kind, ">"))
            counts[kind] = sum((info.state.subjects or {}).values())
        return violations, counts
    finally:
        await mem.close()


def test_secrets_come_from_files_and_never_print(tmp_path):
    """KFACTORY_SECRETS_DIR holds one file per secret (a Kubernetes Secret mounted as a volume); the values
    reach the settings and show in neither repr nor a dump."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "KFACTORY_GRPC_TOKEN").write_text("tok-from-a-file")
    (secrets_dir / "KFACTORY_NATS_PASSWORD").write_text("nats-from-a-file")
    probe = ("from kfactory.platform.config import Settings; s = Settings(); "
             "print(s.grpc_token.get_secret_value(), s.nats_password.get_secret_value()); "
             "print(repr(s)); print(s.model_dump())")
    env = {**os.environ, "KFACTORY_SECRETS_DIR": str(secrets_dir)}
    res = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    first, *rest = res.stdout.splitlines()
    assert first == "tok-from-a-file nats-from-a-file", res.stderr
    assert rest and not any("from-a-file" in line for line in rest)

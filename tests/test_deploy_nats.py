"""The deploy's NATS and Redis configuration on real servers: the users' permissions hold and refuse, KEDA's
triggers name consumers that exist where the scaler looks, messages fit max_payload, Redis wants its password."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
import yaml

from kfactory.bus import events as ev
from kfactory.agents import PERSONAS, persona_stage
import nats.errors

from kfactory.bus.errors import PublishNotPermitted
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.outcomes import Ack
from kfactory.bus.topology import DLQ_STREAM, WORK_STREAM
from kfactory.bus.deadletters import fetch, list_dead_letters, send_back
from kfactory.platform.security import publish_subjects
from kfactory.v1 import events_pb2 as pb
from ports import free_port
from secured_nats import NATS_DIR, SecuredNats

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
sys.path.insert(0, str(K8S))
import nats_auth  # noqa: E402


@pytest.fixture
def secured(tmp_path):
    server = SecuredNats(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_auth_conf_is_what_nats_auth_py_writes():
    assert (NATS_DIR / "auth.conf").read_text() == nats_auth.render(), \
        "deploy/k8s/base/nats/auth.conf is stale: run python deploy/k8s/nats_auth.py"


async def _connect(server: SecuredNats, user: str) -> NatsBus:
    # the deadline bounds a hang; a busy host may take seconds to connect
    return await NatsBus.connect(server.url, f"test-{user}", user=user, password=server.passwords[user],
                                 timeout_s=30)


async def _refused(bus: NatsBus, subject: str) -> bool:
    import nats.errors

    try:
        await bus.js.publish(subject, b"x", timeout=1.0)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
        return True
    return False


async def test_each_service_publishes_its_results_and_no_one_elses(secured):
    compiler, planner, memory = [await _connect(secured, u) for u in ("compiler", "planner", "memory")]
    try:
        # permitted: each is acknowledged (the deadline bounds a hang, not a busy host's round trip)
        await compiler.js.publish(ev.event_subject("compiled", "c1"), b"x", timeout=10.0)
        await compiler.js.publish(ev.work_subject("verifier", "c1"), b"x", timeout=10.0)
        # a search candidate goes to the benchmarker's screen before its verification (kfactory/judge/order.py)
        await compiler.js.publish(ev.work_subject("benchmarker", "c1"), b"x", timeout=10.0)
        assert await _refused(compiler, ev.event_subject("verified", "c1"))
        assert await _refused(compiler, ev.event_subject("measured", "c1"))
        assert await _refused(compiler, ev.work_subject("coder", "c1"))
        assert await _refused(planner, ev.event_subject("measured", "c1"))
        assert await _refused(memory, ev.event_subject("campaign_started", "c1"))
    finally:
        for b in (compiler, planner, memory):
            await b.close()
    refused = secured.violations()
    assert len(refused) == 5 and all("Publish" in line for line in refused), refused
    assert any('"kf.v1.evt.verified.c1"' in line and "compiler" in line for line in refused)


async def test_the_planner_alone_may_send_a_dead_letter_back(secured):
    """The dead letter a compiler wrote is read, queued again and deleted by the planner's user (deadletters.py);
    the compiler's user may not read it back."""
    compiler, planner, admin = [await _connect(secured, u) for u in ("compiler", "planner", "admin")]
    try:
        await compiler.ensure()
        work = ev.make_event("c1", "planner", "p1", point_proposed=pb.PointProposed(point_id="p1", family="f"))
        await compiler.dead_letter("compiler", ev.work_subject("compiler", "c1"), work.SerializeToString(),
                                   "handler error", 5, "c1", work_seq=1)
        (record,) = await list_dead_letters(admin)  # what `kfactory dead-letters` lists, as the admin user
        assert (await fetch(planner, record.seq)).letter.reason == "handler error"
        assert (await send_back(planner, record)).id == work.id
        assert await fetch(planner, record.seq) is None  # deleted by the planner
        answer = ev.make_event("c1", "planner", "1", resend_answered=pb.ResendAnswered(dlq_seq=1, accepted=True))
        await planner.publish(answer)
        assert secured.violations() == []
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await compiler.js.get_msg(DLQ_STREAM, record.seq)  # no permission: the server drops the request
        compiler.may_publish = publish_subjects("compiler")  # as app.py sets it: refused at once, with the reason
        with pytest.raises(PublishNotPermitted, match=r"compiler may not publish to \$JS.API.STREAM.MSG.GET.KF_DLQ"):
            await fetch(compiler, record.seq)
    finally:
        for b in (compiler, planner, admin):
            await b.close()
    assert any("$JS.API.STREAM.MSG.GET.KF_DLQ" in line and "compiler" in line for line in secured.violations())


async def test_keda_triggers_name_consumers_that_exist_in_account_g(secured):
    """The triggers' (account, stream, consumer) as the scaler reads them from the monitoring endpoint, once the
    services that own those consumers have started consuming with their own users."""
    scaled = [d for d in yaml.safe_load_all((K8S / "keda" / "scaledobjects.yaml").read_text())]
    triggers = [t["metadata"] for so in scaled for t in so["spec"]["triggers"]]
    wanted = {(md["stream"], md["consumer"]) for md in triggers}
    owners = {"coder": ["coder", *(persona_stage(p) for p in PERSONAS)], "compiler": ["compiler"]}
    stop = asyncio.Event()

    async def noop(d):
        return Ack()
    buses, tasks = [], []
    try:
        for user, stages in owners.items():
            bus = await _connect(secured, user)
            buses.append(bus)
            tasks += [asyncio.create_task(bus.consume(stage, noop, 1, stop)) for stage in stages]
        # each consumer is made by its service's task, a round trip a busy host may stall for seconds: waited for
        # until every trigger's consumer is there (a task that ended, e.g. refused, stops the wait)
        deadline = time.monotonic() + 30
        while not wanted <= (jsz := await asyncio.to_thread(_jsz, secured, triggers[0]["account"])) \
                and not any(t.done() for t in tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for b in buses:
            await b.close()
    assert wanted <= jsz, f"consumers missing after 30 s: {sorted(wanted - jsz)}; there: {sorted(jsz)}"
    assert {md["consumer"] for md in triggers} == {s for stages in owners.values() for s in stages}
    assert all(md["stream"] == WORK_STREAM for md in triggers)
    assert secured.violations() == []


def _jsz(server: SecuredNats, account: str) -> set[tuple[str, str]]:
    url = f"http://127.0.0.1:{server.http_port}/jsz?acc={urllib.parse.quote(account)}&consumers=true&config=true"
    with urllib.request.urlopen(url, timeout=30) as r:   # a bound on a hang, not on a busy host
        data = json.load(r)
    return {(s["name"], c["name"]) for a in data.get("account_details", []) if a["name"] == account
            for s in a.get("stream_detail", []) for c in s.get("consumer_detail", [])}


def _max_payload() -> int:
    m = re.search(r"^max_payload: (\d+)MB$", (NATS_DIR / "nats.conf").read_text(), re.M)
    assert m is not None
    return int(m.group(1)) * 2 ** 20


def test_the_largest_messages_fit_max_payload():
    """Events carry digests, not artifacts; the largest carry a whole kernel source: a proposal of a hand-written
    kernel, a campaign's start that lists it, and the dead letter that would wrap the proposal. Each is built
    with a source at the largest size the planner and the coder accept (KFACTORY_MAX_SOURCE_BYTES); the object
    store's chunks are the other large messages. Each must fit max_payload and the services' decode limit."""
    from nats.js.object_store import OBJ_DEFAULT_CHUNK_SIZE

    from kfactory.platform.config import Settings

    settings = Settings()
    source = "x" * settings.max_source_bytes
    pp = pb.PointProposed(point_id="p" * 24, family="f", params_json="{}", problem="softmax", target="cuda:sm_90a",
                          origin="manual:big", manual=pb.ManualSource(name="big", source=source))
    proposal = ev.make_event("c" * 13, "planner", "p" * 24, point_proposed=pp).SerializeToString()
    started = ev.make_event("c" * 13, "planner", "start", campaign_started=pb.CampaignStarted(
        spec=pb.CampaignSpec(problem="softmax", manual_sources=[pp.manual]))).SerializeToString()
    dead = ev.make_event("c" * 13, "coder", "k", dead_letter=pb.DeadLetter(
        stage="coder", subject="kf.v1.work.coder.c", reason="x" * 200, payload=proposal)).SerializeToString()
    sizes = {"proposal": len(proposal), "start": len(started), "dead letter": len(dead),
             "object chunk": OBJ_DEFAULT_CHUNK_SIZE}
    print(f"with a {len(source)} B source: {sizes}; max_payload {_max_payload()} B, "
          f"decode limit {settings.max_event_bytes} B")
    assert max(sizes.values()) <= min(_max_payload(), settings.max_event_bytes)


def test_nats_conf_and_auth_conf_are_valid_for_the_server(tmp_path):
    from kfactory.bus.natsd import nats_server_binary
    from secured_nats import local_conf

    (tmp_path / "auth.conf").write_text((NATS_DIR / "auth.conf").read_text())
    conf = tmp_path / "nats.conf"
    conf.write_text(local_conf((NATS_DIR / "nats.conf").read_text(), tmp_path, free_port(), free_port()))
    env = {"POD_NAME": "nats-0", "JS_MAX_FILE_STORE": "9GB",
           **{f"KF_NATS_{u.upper()}_PASSWORD": "pw" for u in nats_auth.USERS}}
    res = subprocess.run([nats_server_binary(), "-c", str(conf), "-t"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0, res.stderr
    # the whole deployed file too, cluster block included
    (tmp_path / "full.conf").write_text((NATS_DIR / "nats.conf").read_text())
    res = subprocess.run([nats_server_binary(), "-c", str(tmp_path / "full.conf"), "-t"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def test_redis_conf_wants_the_password_and_appends_to_its_file(tmp_path):
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server not installed")
    port = free_port()
    conf = (K8S / "base" / "redis" / "redis.conf").read_text()
    conf, n = re.subn(r"(?m)^dir /data$", f"dir {tmp_path}", conf)  # the volume's mount point, here
    assert n == 1
    (tmp_path / "redis.conf").write_text(conf)
    # as the StatefulSet runs it: the deployed file, then the password from the Secret on the command line
    proc = subprocess.Popen([binary, str(tmp_path / "redis.conf"), "--port", str(port), "--bind", "127.0.0.1",
                             "--requirepass", "s3cret"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port)
        # one try each; the timeout bounds a hang, with room for a busy host's round trip
        no_retry = {"host": "127.0.0.1", "port": port, "socket_timeout": 10, "retry": Retry(NoBackoff(), 0)}
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(**no_retry).set("k", "v")
        r = redis.Redis(password="s3cret", **no_retry)
        assert r.set("k", "v") and r.info("persistence")["aof_enabled"] == 1
        with pytest.raises(redis.ResponseError):  # renamed away for clients
            r.execute_command("FLUSHALL")
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    """Until the port takes connections; a busy host may take seconds to start a process."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)


async def test_a_service_started_as_another_services_user_is_refused_at_start_up(secured):
    """The compiler with the coder's credentials: the server would drop its consumer calls without a typed
    error (a timeout, later); start-up refuses it at once and names what it may not do. With its own user it
    starts."""
    from kfactory.platform.app import WiringError, start_services
    from kfactory.platform.config import Settings

    def settings(user: str) -> Settings:
        return Settings(nats_url=secured.url, nats_user=user, nats_password=secured.passwords[user],
                        redis_url=None)

    with pytest.raises(WiringError) as refused:
        await start_services(settings("coder"), ("compiler",), grpc=False)
    msg = str(refused.value)
    assert msg.startswith("NATS user 'coder' may not publish to $JS.API.CONSUMER.CREATE.KF_WORK.compiler, ")
    assert "which compiler needs: give each service its own user (KFACTORY_NATS_USER" in msg
    running = await start_services(settings("compiler"), ("compiler",), grpc=False)
    try:
        # ready (connected, its tasks running) from the start; the sleep is a window for a refused consumer call
        # to end a task, which a stall can only lengthen
        await asyncio.sleep(0.5)
        assert running.failed() is None and running.ready()
    finally:
        await running.shutdown()

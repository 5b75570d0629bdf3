"""A factory of six `kfactory serve` processes over a nats-server and a redis-server that tests can break:
kill or pause any process, restart either server on the same port with its data, and check the archive.

Used by the fault, auth and load tests; the servers are real binaries, the services the real code.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import redis
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kfactory.bus.natsd import EmbeddedNats
from kfactory.services.memory.archive import Archive
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from ports import free_port

SERVICES = ("planner", "coder", "compiler", "verifier", "benchmarker", "memory")


class Nats:
    """nats-server with file storage in a directory that outlives restarts, on one port for its whole life."""

    def __init__(self, directory: Path, config: str | None = None):
        # a port of this worker's own (tests/ports.py), not one the kernel chose: a restart binds it again
        # seconds later, by when any connection on the host could have taken an ephemeral one
        self.dir, self.config, self.port = directory, config, free_port()
        self.server = EmbeddedNats(directory, port=self.port, config=config)
        self.url = self.server.start()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc = self.server.proc
        if proc and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(15)

    def start(self) -> None:
        self.server = EmbeddedNats(self.dir, port=self.port, config=self.config)
        self.server.start()

    def restart(self, down_s: float = 0.5, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        self.server.stop()


class Redis:
    """redis-server with an append-only file (fsync on every write), so a restart keeps every claim and fence."""

    def __init__(self, directory: Path, password: str | None = None):
        self.dir, self.password, self.port = directory, password, free_port()
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"port {self.port}", "bind 127.0.0.1", f'dir "{directory}"', f'logfile "{directory}/redis.log"',
                 'save ""', "appendonly yes", "appendfsync always", "daemonize no"]
        if password:
            lines.append(f'requirepass "{password}"')
        (directory / "redis.conf").write_text("\n".join(lines) + "\n")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self, timeout_s: float = 30.0) -> None:
        self.proc = subprocess.Popen(["redis-server", str(self.dir / "redis.conf")], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.BusyLoadingError):
                    assert self.proc.poll() is None, (self.dir / "redis.log").read_text()[-2000:]
                    assert time.monotonic() < deadline, "redis-server did not answer"
                    time.sleep(0.05)
        except BaseException:   # not left running to hold its port through the worker's next tests
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)

    def restart(self, down_s: float = 0.5, wipe: bool = False) -> None:
        """Stop and start again; with `wipe`, its data is gone (a Redis without persistence, or a new one)."""
        self.stop()
        if wipe:
            for f in self.dir.iterdir():
                if f.name not in ("redis.conf", "redis.log"):
                    shutil.rmtree(f) if f.is_dir() else f.unlink()
        time.sleep(down_s)
        self.start()


class Plant:
    """The six services as processes; `env` is what each is started with (tests may add to it per service)."""

    def __init__(self, tmp: Path, nats_url: str, redis_url: str, extra_env: dict[str, str] | None = None):
        self.tmp = tmp
        self.planner_addr = f"127.0.0.1:{free_port()}"
        self.memory_addr = f"127.0.0.1:{free_port()}"
        self.env = {**os.environ, "KFACTORY_NATS_URL": nats_url, "KFACTORY_REDIS_URL": redis_url,
                    "KFACTORY_PLANNER_ADDR": self.planner_addr, "KFACTORY_MEMORY_ADDR": self.memory_addr,
                    "KFACTORY_DATA_DIR": str(tmp / "data"), "KFACTORY_ACK_WAIT_S": "2",
                    "KFACTORY_MAX_DELIVER": "4", "KFACTORY_NAK_DELAY_S": "0.2", "KFACTORY_THREADS": "1",
                    "KFACTORY_LOG_LEVEL": "warning",
                    # a handler that hangs is cancelled and logged well before a test's waits run out (longer
                    # than any pause a test inflicts, which the monotonic clock counts against the handler)
                    "KFACTORY_HANDLER_TIMEOUT_S": "90", **(extra_env or {})}
        self.procs: dict[str, subprocess.Popen] = {}
        self.extra: dict[str, dict[str, str]] = {}
        #: the secure profile's client side: (CA certificate PEM, bearer token), or None for plaintext gRPC
        self.tls: tuple[bytes, str] | None = None

    def channel(self, addr: str, token: str | None = None) -> grpc.Channel:
        """A blocking gRPC channel to a service, with TLS and the token (or `token`) in the secure profile."""
        if self.tls is None:
            return grpc.insecure_channel(addr)
        ca, default = self.tls
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
        if (token if token is not None else default):
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token if token is not None else default))
        return grpc.secure_channel(addr, creds)

    def start(self, name: str, key: str | None = None) -> subprocess.Popen:
        """Start service `name` (as process `key`, default the name: a second replica needs another key)."""
        key = key or name
        log = open(self.tmp / f"{key}.log", "ab")
        env = {**self.env, **self.extra.get(name, {})}
        p = subprocess.Popen([sys.executable, "-m", "kfactory.cli.main", "serve", name], env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        self.procs[key] = p
        return p

    def start_all(self) -> None:
        for name in SERVICES:
            self.start(name)
        self.wait_healthy()

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[key]
        p.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            p.wait(30)

    def retire(self, key: str) -> None:
        """Stop a process for good (SIGTERM) and forget it."""
        self.kill(key, signal.SIGTERM)
        del self.procs[key]

    def wait_healthy(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        for addr in (self.planner_addr, self.memory_addr):
            while True:
                try:
                    with self.channel(addr) as ch:
                        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if r.status == r.SERVING:
                        break
                except grpc.RpcError:
                    pass
                self.assert_alive()
                assert time.monotonic() < deadline, f"{addr} not healthy; logs in {self.tmp}"
                time.sleep(0.2)

    def assert_alive(self) -> None:
        for key, p in self.procs.items():
            rc = p.poll()
            assert rc is None or rc == -signal.SIGKILL, f"{key} exited with {rc}; see {self.tmp}/{key}.log"

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # -- campaigns -------------------------------------------------------------------------------------
    def submit(self, spec: pb.CampaignSpec) -> str:
        with self.channel(self.planner_addr) as ch:
            return sgrpc.CampaignsStub(ch).Submit(spb.SubmitRequest(spec=spec), timeout=60).id

    def status(self, cid: str) -> spb.CampaignStatus | None:
        """The planner's status of a campaign; None while the planner is not answering (being restarted)."""
        try:
            with self.channel(self.planner_addr) as ch:
                return sgrpc.CampaignsStub(ch).Get(spb.GetCampaignRequest(id=cid), timeout=5)
        except grpc.RpcError:
            return None

    def wait(self, cid: str, until, timeout: float = 120, what: str = "") -> spb.CampaignStatus:
        """Poll the campaign's status until `until(status)`; the processes must stay alive meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.status(cid)
            if s is not None and until(s):
                return s
            self.assert_alive()
            assert time.monotonic() < deadline, (f"campaign {cid}: {what or 'condition'} not reached: {s}; logs in "
                                                 f"{self.tmp}; handlers stuck: {self.stuck_handlers() or 'none'}")
            time.sleep(0.1)

    def stuck_handlers(self) -> list[str]:
        """The log lines of handlers the bus cancelled as stuck (each names the awaits it hung in)."""
        return [line for log in sorted(self.tmp.glob("*.log"))
                for line in log.read_text(errors="replace").splitlines() if "handler stuck" in line]

    def wait_finished(self, cid: str, timeout: float = 120) -> spb.CampaignStatus:
        return self.wait(cid, lambda s: s.state != "running", timeout, "finished")

    def archive(self) -> Archive:
        return Archive(self.tmp / "data" / "archive.sqlite")

    def wait_archived(self, cid: str, timeout: float = 30) -> None:
        """Until memory has archived the campaign's end."""
        wait_archived(self.tmp / "data" / "archive.sqlite", cid, timeout)


def wait_archived(path: Path, cid: str, timeout: float) -> None:
    """Until the memory service, a process of its own following the stream, has archived the end of campaign
    `cid` in the archive at `path` (AssertionError after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    arch = Archive(path)
    try:
        while not arch.q("SELECT 1 FROM events WHERE campaign=? AND kind='campaign_finished'", (cid,)):
            assert time.monotonic() < deadline, f"memory did not archive the end of {cid} within {timeout:g} s"
            time.sleep(0.1)
    finally:
        arch.close()


def check_exactly_once(plant: Plant, cid: str, status: spb.CampaignStatus) -> dict[str, int]:
    """The archive of a finished campaign: every proposed point has exactly one candidate (or one coder-stage
    rejection) and exactly one terminal outcome; every candidate's evidence chain is complete and has each stage
    once; the archive's counts equal the planner's. Returns the archive's counts by event kind."""
    plant.wait_archived(cid)
    stuck = plant.stuck_handlers()
    assert not stuck, stuck  # a hang recovered from is still a bug
    arch = plant.archive()
    try:
        kinds = dict(arch.q("SELECT kind, COUNT(*) FROM events WHERE campaign=? GROUP BY kind", (cid,)))
        c = status.counts
        assert kinds.get("point_proposed", 0) == c.proposed, (kinds, c)
        outcomes = arch.q("SELECT point_id, COUNT(*) FROM outcomes WHERE campaign=? GROUP BY point_id", (cid,))
        dead = _dead_lettered_points(arch, cid)
        assert len(outcomes) + len(dead - {p for p, _ in outcomes}) == c.proposed, (outcomes, dead, c)
        assert all(n == 1 for _, n in outcomes), [o for o in outcomes if o[1] != 1]
        created = arch.q("SELECT candidate, COUNT(*) FROM events WHERE campaign=? AND kind='candidate_created' "
                         "GROUP BY candidate", (cid,))
        assert all(n == 1 for _, n in created), created
        for kind, field in (("compiled", "compiled"), ("verified", "verified"), ("measured", "measured"),
                            ("compile_failed", "compile_failed")):
            assert kinds.get(kind, 0) == getattr(c, field), (kind, kinds, c)
        for (cand,) in arch.q("SELECT candidate FROM outcomes WHERE campaign=? AND reason='measured'", (cid,)):
            # by the producers' clocks: a restarted memory archives the redelivered events of its last batch
            # after newer ones, so archive order (seq) is not the chain's order
            chain = [k for (k,) in arch.q("SELECT kind FROM events WHERE candidate=? AND campaign=? "
                                          "ORDER BY time_ns", (cand, cid))]
            assert chain == ["candidate_created", "compiled", "verified", "measured"], (cand, chain)
        return kinds
    finally:
        arch.close()


def _dead_lettered_points(arch: Archive, cid: str) -> set[str]:
    out = set()
    for (payload,) in arch.q("SELECT payload FROM events WHERE campaign=? AND kind='dead_letter'", (cid,)):
        try:
            inner = pb.Event.FromString(pb.Event.FromString(payload).dead_letter.payload)
        except DecodeError:  # dead-lettered because it was no event at all
            continue
        if inner.HasField("point_proposed"):
            out.add(inner.point_proposed.point_id)
    return out

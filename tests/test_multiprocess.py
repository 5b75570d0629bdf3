"""The six services as separate OS processes over a real nats-server and a real redis-server."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kfactory.platform.app import SERVICE_NAMES
from kfactory.services.memory.archive import Archive
from kfactory.v1 import services_pb2 as spb
from kfactory.v1 import services_pb2_grpc as sgrpc
from fault_plant import wait_archived
from ports import free_port


class Factory:
    """Six `kfactory serve` processes sharing NATS and Redis. `ceilings`: the session's measured host ceilings,
    copied into the data directory so that the services do not measure them again (14 s of probes a test
    beside the other test worker; tests/test_cpu_target.py tests the measuring)."""

    def __init__(self, tmp: Path, nats_url: str, redis_url: str, ceilings: Path, cc: str = "cc"):
        self.tmp = tmp
        (tmp / "data").mkdir(exist_ok=True)
        shutil.copy(ceilings, tmp / "data" / "ceilings.json")
        self.env = {**os.environ, "KFACTORY_NATS_URL": nats_url, "KFACTORY_REDIS_URL": redis_url,
                    "KFACTORY_PLANNER_ADDR": f"127.0.0.1:{free_port()}",
                    "KFACTORY_MEMORY_ADDR": f"127.0.0.1:{free_port()}",
                    "KFACTORY_DATA_DIR": str(tmp / "data"), "KFACTORY_ACK_WAIT_S": "3",
                    "KFACTORY_RUNNER_TIMEOUT_S": "4", "KFACTORY_MEASURE_MAX_S": "0.2",
                    "KFACTORY_MEASURE_MIN_S": "0.05", "KFACTORY_COMPARE_MAX_S": "0.4", "KFACTORY_CC": cc,
                    "KFACTORY_THREADS": "2"}
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """`kfactory serve name`, with `env` over the factory's environment (this process's own settings)."""
        log = open(self.tmp / f"{name}.log", "ab")
        p = subprocess.Popen([sys.executable, "-m", "kfactory.cli.main", "serve", name],
                             env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = p
        return p

    def wait_healthy(self, timeout: float = 60) -> None:
        for key in ("KFACTORY_PLANNER_ADDR", "KFACTORY_MEMORY_ADDR"):
            self.wait_serving(self.env[key], "", timeout, key)

    def wait_serving(self, addr: str, service: str, timeout: float, what: str, proc: str | None = None) -> None:
        """Until the gRPC health service at `addr` says `service` is SERVING (failing early if `proc` exited)."""
        deadline = time.monotonic() + timeout
        while True:
            if proc is not None:
                assert self.procs[proc].poll() is None, (self.tmp / f"{proc}.log").read_text()[-3000:]
            try:
                with grpc.insecure_channel(addr) as ch:
                    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"{what} not serving; logs in {self.tmp}"
            time.sleep(0.2)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", *args], env=self.env, capture_output=True,
                             text=True, timeout=120)
        if check:
            assert res.returncode == 0, res.stderr
        return res

    def wait_finished(self, cid: str, timeout: float = 300) -> dict:
        """The campaign's `kfactory status --json` once it has ended. The wait polls the planner over gRPC: a
        `kfactory status` process a poll would take a second of cpu from the campaign it waits on."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with grpc.insecure_channel(self.env["KFACTORY_PLANNER_ADDR"]) as ch:
                    state = sgrpc.CampaignsStub(ch).Get(spb.GetCampaignRequest(id=cid), timeout=5).state
            except grpc.RpcError:
                state = "running"   # the planner is being restarted by the test
            if state != "running":
                return json.loads(self.cli("status", cid, "--json").stdout)
            for name, p in self.procs.items():
                assert p.poll() is None, f"{name} died; see {self.tmp}/{name}.log"
            time.sleep(0.3)
        raise AssertionError(f"campaign {cid} did not finish; logs in {self.tmp}")

    def wait_archived(self, cid: str, timeout: float = 60) -> None:
        """Until memory has archived the campaign's end (a fixed second was not always enough on a loaded
        host)."""
        wait_archived(self.tmp / "data" / "archive.sqlite", cid, timeout)

    def stop(self) -> None:
        """SIGTERM to each, SIGKILL to any still running after 30 s (a loaded host's orderly stop, which writes
        the last spans, may take more than a few seconds)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def factory_env(tmp_path, nats_url, redis_url_session, host_ceilings):
    return tmp_path, nats_url, redis_url_session, host_ceilings


def _archive_check(tmp: Path, cid: str, proposed: int) -> None:
    """Every proposed point has exactly one terminal outcome, and its evidence chain is complete."""
    arch = Archive(tmp / "data" / "archive.sqlite")
    rows = arch.q("SELECT point_id, COUNT(*) FROM outcomes WHERE campaign=? GROUP BY point_id", (cid,))
    assert len(rows) == proposed, rows
    assert all(n == 1 for _, n in rows), rows
    for (cand,) in arch.q("SELECT candidate FROM outcomes WHERE campaign=? AND reason='measured'", (cid,)):
        kinds = [k for (k,) in arch.q("SELECT kind FROM events WHERE candidate=? AND campaign=? ORDER BY seq",
                                      (cand, cid))]
        # a candidate screened out before verification (issue 23's order) ends its chain at its screen's timing
        assert (kinds[:4] == ["candidate_created", "compiled", "verified", "measured"]
                or kinds == ["candidate_created", "compiled", "measured"]), kinds
    arch.close()


def test_six_processes_complete_a_campaign_and_answer_grpc(factory_env, small_softmax):
    tmp, nats_url, redis_url, ceilings = factory_env
    f = Factory(tmp, nats_url, redis_url, ceilings)
    watch = None
    try:
        for name in SERVICE_NAMES:
            f.start(name)
        f.wait_healthy()
        sub = json.loads(f.cli("submit", small_softmax, "--budget", "4", "--strategy", "random", "--json").stdout)
        cid = sub["id"]
        watch = subprocess.Popen([sys.executable, "-m", "kfactory.cli.main", "watch", cid], env=f.env,
                                 stdout=subprocess.PIPE, text=True)
        status = f.wait_finished(cid)
        assert status["state"] == "completed"
        counts = status["counts"]
        assert counts["proposed"] == 5 and counts["measured"] >= 1
        f.wait_archived(cid)
        lines = watch.communicate(timeout=60)[0].splitlines()
        assert lines[0].startswith("campaign_started") and lines[-1].startswith("campaign_finished")
        best = json.loads(f.cli("best", "softmax", "--json").stdout)
        assert best["score_s"] > 0
        # the verdict's figures travel with the best entry: every shape x distribution with its errors
        dists = {c["distribution"] for c in best["checks"]}
        assert {"normal", "masked", "memo:same-buffers"} <= dists
        assert all(c["passed"] and c["seed"] and "max_abs_err" in c for c in best["checks"])
        assert "| shape | distribution | seed |" in f.cli("best", "softmax").stdout
        # what a next campaign of softmax would be warm-started with
        priors = json.loads(f.cli("priors", "softmax", "--json").stdout)["priors"]
        assert priors and priors[0]["relative"] == 1.0 and priors[0]["campaign_id"] == cid
        board = json.loads(f.cli("best", "--campaign", cid, "--json").stdout)["entries"]
        assert len(board) == counts["measured"]
        evidence = json.loads(f.cli("best", "--candidate", board[0]["candidate_id"], "--json").stdout)
        assert "void kernel" in evidence["source"] and len(evidence["events"]) >= 4
        report = f.cli("report", cid, "--out", str(tmp / "rep")).stdout.strip()
        assert Path(report).read_text().startswith(f"# Campaign {cid}")
        assert "## Verification of the best candidate" in Path(report).read_text()
        _archive_check(tmp, cid, counts["proposed"])
        # Campaigns.Cancel and Campaigns.List through gRPC: a second campaign, cancelled at once, ends cancelled,
        # and the list (status without an id) holds both with their states
        other = json.loads(f.cli("submit", small_softmax, "--budget", "400", "--strategy", "random",
                                 "--json").stdout)["id"]
        # by a unique prefix, as status takes one (cancel and watch took full ids only)
        assert json.loads(f.cli("cancel", other[:8], "--json").stdout)["id"] == other
        assert f.wait_finished(other)["state"] == "cancelled"
        listed = {s["id"]: s["state"] for s in json.loads(f.cli("status", "--json").stdout)["campaigns"]}
        assert listed == {cid: "completed", other: "cancelled"}
    finally:
        if watch is not None and watch.poll() is None:   # a failed assertion before it ended: not left running
            watch.kill()
            watch.communicate()
        f.stop()


def test_killing_the_compiler_mid_campaign_loses_nothing(factory_env, small_softmax):
    tmp, nats_url, redis_url, ceilings = factory_env
    marker = tmp / "compiling"
    slow_cc = tmp / "slow-cc"
    # slow at compiles alone (not at --version and the like, asked before a compile: tests/test_cpu_cache.py)
    slow_cc.write_text(f'#!/bin/sh\ncase " $* " in *" -shared "*) touch {marker}; sleep 1.5;; esac\nexec cc "$@"\n')
    slow_cc.chmod(0o755)
    f = Factory(tmp, nats_url, redis_url, ceilings, cc=str(slow_cc))
    try:
        for name in SERVICE_NAMES:
            f.start(name)
        f.wait_healthy()
        cid = json.loads(f.cli("submit", small_softmax, "--budget", "4", "--strategy", "random", "--json").stdout)["id"]
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, "the compiler never started compiling"
            time.sleep(0.05)
        f.procs["compiler"].kill()  # SIGKILL while it holds an unacked message
        f.procs["compiler"].wait()
        time.sleep(1.0)
        f.start("compiler")
        status = f.wait_finished(cid)
        assert status["state"] == "completed"
        counts = status["counts"]
        assert counts["proposed"] == 5
        assert counts["measured"] + counts["rejected"] + counts["compile_failed"] == 5
        f.wait_archived(cid)
        _archive_check(tmp, cid, counts["proposed"])
    finally:
        f.stop()


def test_serve_refuses_to_start_without_nats(tmp_path):
    env = {**os.environ, "KFACTORY_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
    res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "serve", "compiler"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1
    assert "cannot reach NATS" in res.stderr and "KFACTORY_NATS_URL" in res.stderr


def test_serve_refuses_to_start_without_redis(tmp_path, nats_url):
    env = {**os.environ, "KFACTORY_NATS_URL": nats_url, "KFACTORY_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    res = subprocess.run([sys.executable, "-m", "kfactory.cli.main", "serve", "coder"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1
    assert "claims store" in res.stderr and "KFACTORY_REDIS_URL" in res.stderr

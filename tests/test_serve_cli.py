"""`kfactory serve` started with an address it cannot listen on: one line naming the setting, exit 2, never an
internal error; and a second planner on a planner's address is that case (no SO_REUSEPORT: the two would have
split the clients between them). A service started without a claims store says its claims hold in its process
only."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from ports import free_port

KFACTORY = [sys.executable, "-m", "kfactory.cli.main"]


def test_an_address_that_cannot_be_listened_on_is_a_usage_error(tmp_path, nats_url):
    env = {**{k: v for k, v in os.environ.items() if k != "KFACTORY_REDIS_URL"}, "KFACTORY_NATS_URL": nats_url,
           "KFACTORY_DATA_DIR": str(tmp_path / "data")}
    out = subprocess.run([*KFACTORY, "serve", "planner", "--grpc-addr", "garbage"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "kfactory serve: cannot listen on garbage" in out.stderr, out.stderr
    assert "internal error" not in out.stderr
    addr = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen([*KFACTORY, "serve", "planner", "--grpc-addr", addr], env=env, stdout=subprocess.DEVNULL,
                             stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:   # until the first planner listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", int(addr.split(":")[1]))) == 0:
                    break
            assert first.poll() is None and time.monotonic() < deadline, "the first planner did not start"
            time.sleep(0.2)
        second = subprocess.run([*KFACTORY, "serve", "planner", "--grpc-addr", addr], env=env, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2 and f"cannot listen on {addr}" in second.stderr, second.stderr
        assert first.poll() is None   # the first one serves on
    finally:
        first.terminate()
        first.wait(30)
        log.close()
    # no KFACTORY_REDIS_URL: the service says its claims hold in this process only, once, as it starts
    assert (tmp_path / "first.log").read_text().count("claims are in-process (KFACTORY_REDIS_URL unset)") == 1

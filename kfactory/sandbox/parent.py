"""Parent side of the runner: starts, talks to, times out and replaces runner child processes.

It speaks the typed protocol of kfactory.sandbox.protocol. Faults of the candidate become RunnerFault exceptions
(one class per FaultKind: RunnerCrashed, RunnerTimeout, LoadFailed, DeviceFault, LaunchFailed, CudaFailed) that
the services turn into rejection events; a failure of the runner's own code is a HarnessError, which is no
RunnerFault and so is never a verdict. The service process itself never loads candidate code.
"""
from __future__ import annotations

import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import time

from kfactory.observability.log import get_logger
from kfactory.observability import stagetime
from kfactory.sandbox import protocol
from kfactory.sandbox.protocol import Exit, Fault, FaultKind, Load, Ping, Reply, Request, Unload

log = get_logger("runner")


class RunnerFault(Exception):
    """The candidate ended its request abnormally: a verdict (`reason`), never a service error."""
    kind: FaultKind = FaultKind.CRASHED

    def __init__(self, message: str, fault: Fault | None = None):
        super().__init__(message)
        self.fault = fault

    @property
    def reason(self) -> int:
        """The rejection reason of this fault (kfactory.sandbox.protocol.REJECT_REASONS)."""
        return self.kind.reason


class RunnerCrashed(RunnerFault):
    """The runner died: a signal (segfault, abort, kill by a resource limit) or an exit; or the kernel raised."""
    kind = FaultKind.CRASHED


class RunnerTimeout(RunnerFault):
    """The runner did not answer within its wall-clock limit and was killed."""
    kind = FaultKind.TIMEOUT


class LoadFailed(RunnerFault):
    """The runner could not load or bind the kernel (missing symbol, bad object)."""
    kind = FaultKind.LOAD_FAILED


class DeviceFault(RunnerCrashed):
    """The kernel faulted on the device (illegal address, trap, misaligned access...); the runner was replaced."""
    kind = FaultKind.DEVICE_FAULT


class LaunchFailed(LoadFailed):
    """The launch rule gave an invalid configuration, or the driver refused the launch."""
    kind = FaultKind.LAUNCH_FAILED


class CudaFailed(RunnerCrashed):
    """Another CUDA error while the kernel's work was in flight; the runner was replaced."""
    kind = FaultKind.CUDA_ERROR


#: the exception raised for each candidate fault kind, and how its message begins
FAULT_ERRORS: dict[FaultKind, tuple[type[RunnerFault], str]] = {
    FaultKind.CRASHED: (RunnerCrashed, ""), FaultKind.TIMEOUT: (RunnerTimeout, ""),
    FaultKind.LOAD_FAILED: (LoadFailed, ""), FaultKind.DEVICE_FAULT: (DeviceFault, "device fault: "),
    FaultKind.LAUNCH_FAILED: (LaunchFailed, "launch failed: "),
    FaultKind.CUDA_ERROR: (CudaFailed, "CUDA error in the runner: "),
}


class HarnessError(Exception):
    """The runner's own code failed (a bug, or an environment it cannot work in), not the candidate: not a
    RunnerFault, so it propagates out of verify and measure and the service dead-letters the work (HARNESS_FAILED).
    `traceback` is the child's, when the failure was in the child."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


def fault_error(fault: Fault) -> RunnerFault | HarnessError:
    """The exception for a fault a child replied."""
    if not fault.kind.is_candidate:
        return HarnessError(f"runner error: {fault.message}", fault.traceback)
    cls, prefix = FAULT_ERRORS[fault.kind]
    return cls(prefix + fault.message, fault)


#: what a child process's environment leaves out: the factory's settings and secrets (generated code, an engine
#: and a package's reference need none of them)
PRIVATE_ENV = ("KFACTORY_", "NATS", "REDIS")


def child_env() -> dict[str, str]:
    """This process's environment less PRIVATE_ENV: what a child running code kfactory did not write gets."""
    return {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_ENV)}


def kill_group(proc: subprocess.Popen) -> None:
    """Kill a child started in a process group of its own, with everything it started (a kernel may have
    forked), and reap it; nothing when it has ended."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:   # it ended between the poll and the kill
            pass
        proc.wait()


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...]:
    """`unshare -n` (root) or `unshare -rn` (user namespaces) when it works here, else nothing."""
    exe = shutil.which("unshare")
    if not exe:
        return ()
    for prefix in ((exe, "-n"), (exe, "-rn")):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=5).returncode == 0:
                return prefix
        except (OSError, subprocess.TimeoutExpired):
            continue
    return ()


class Runner:
    """One runner child at a time; replaced after a fault, a timeout or max_runs commands."""

    def __init__(self, threads: int, timeout_s: float = 20.0, mem_mb: int = 4096, max_runs: int = 500,
                 isolate_network: bool = True, child_module: str = "kfactory.sandbox.child",
                 env: dict[str, str] | None = None):
        """`child_module` is run as `python -m child_module`; mem_mb=0 sets no address-space limit;
        `env` adds variables to the child's environment (a GPU runner's CUDA_VISIBLE_DEVICES)."""
        self.threads, self.timeout_s, self.mem_mb, self.max_runs = threads, timeout_s, mem_mb, max_runs
        self.isolate_network, self.child_module, self.extra_env = isolate_network, child_module, env or {}
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self.loaded: set[str] = set()
        self.restarts = 0
        self._r: int | None = None   # the reply pipe's read end, while a child runs

    def _start(self) -> None:
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = child_env()
        env["OMP_NUM_THREADS"] = str(self.threads)
        env.update(self.extra_env)
        prefix = network_isolation_prefix() if self.isolate_network else ()
        cpu_s = int(max(60, self.timeout_s * self.threads * 4))
        cmd = [*prefix, sys.executable, "-m", self.child_module, str(p2c_r), str(c2p_w),
               str(self.threads), str(self.mem_mb), str(cpu_s)]
        self.proc = subprocess.Popen(cmd, pass_fds=(p2c_r, c2p_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        os.close(p2c_r)
        os.close(c2p_w)
        self._w = os.fdopen(p2c_w, "wb")
        self._r = c2p_r
        self._buf = b""
        self.runs = 0
        self.loaded = set()
        self._request(Ping(), timeout_s=30)

    def request(self, req: Request, timeout_s: float | None = None) -> Reply:
        """Send one request and wait for its reply; raises the RunnerFault of a candidate fault, HarnessError for
        the runner's own. The round trip is accounted as the enclosing work's "runner" part, less the kernels'
        own run time ("kernel")."""
        with stagetime.span("runner"):
            reply = self._request(req, timeout_s)
            stagetime.credit("kernel", kernel_seconds(reply))
        return reply

    def _request(self, req: Request, timeout_s: float | None) -> Reply:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self._send(req)
        reply = self._read_reply(timeout_s or self.timeout_s)
        self.runs += 1
        if reply.fault is not None:
            raise self._failed(reply.fault)
        if self.runs >= self.max_runs:
            self.stop()
        return reply

    def _send(self, req: Request) -> None:
        try:
            line = protocol.encode_request(req)
        except (TypeError, ValueError) as e:  # a request that is no JSON: the caller's bug, not the candidate's
            raise HarnessError(f"the {req.op} request cannot be encoded: {e}") from e
        try:
            self._w.write(line)
            self._w.flush()
        except BrokenPipeError as e:
            raise self._crashed() from e

    def _failed(self, fault: Fault) -> RunnerFault | HarnessError:
        """The exception for a failed reply. A child that says it is exiting is reaped; one whose own code failed
        is replaced too, as its state is unknown."""
        if fault.exiting or not fault.kind.is_candidate:
            self.kill()
        return fault_error(fault)

    def _read_reply(self, timeout_s: float) -> Reply:
        deadline, fd = time.monotonic() + timeout_s, self._r
        if fd is None:  # the pipe was closed with a child that is gone
            raise self._crashed()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RunnerTimeout(f"no answer within {timeout_s:.1f}s; runner killed")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise self._crashed()
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return protocol.decode_reply(line)
        except protocol.ProtocolError as e:  # the kernel can write to the reply pipe too: its doing, say, not ours
            self.kill()
            raise RunnerCrashed(f"runner sent garbage: {line[:200]!r}") from e

    def _crashed(self) -> RunnerCrashed:
        rc = self.proc.wait(timeout=10) if self.proc else None
        self._reset()
        if rc is not None and rc < 0:
            return RunnerCrashed(f"runner killed by signal {signal.Signals(-rc).name}")
        return RunnerCrashed(f"runner exited with status {rc}")

    def reserve(self, requests: int) -> None:
        """Have the next `requests` requests answered by one child: replace the child now if it would reach
        max_runs before them (a reservation larger than max_runs cannot be kept and is not attempted). A
        loaded kernel's state (a call counter) lives in its child, so a check that must come a number of
        calls after a timing in the same process (kfactory.judge.measure.measure) reserves its requests first."""
        if self.proc is not None and requests <= self.max_runs and self.runs + requests > self.max_runs:
            self.stop()

    def ensure_loaded(self, load: Load) -> None:
        """Load `load.key` unless this child has it loaded already."""
        if load.key not in self.loaded or self.proc is None or self.proc.poll() is not None:
            self.request(load)
            self.loaded.add(load.key)

    def unload(self, key: str) -> Reply | None:
        """Have the child drop `key` (protocol.Unload): its reply, or None when no live child holds it. The
        candidate is done with, so a child that fails here is replaced, never a reason to lose its result."""
        alive = self.proc is not None and self.proc.poll() is None
        held = key in self.loaded
        self.loaded.discard(key)
        if not (alive and held):
            return None
        try:
            return self.request(Unload(key))
        except (RunnerFault, HarnessError) as e:
            log.warning("the runner failed to unload a kernel; replacing it", key=key, error=str(e))
            self.stop()
            return None

    def _reset(self) -> None:
        self.restarts += 1
        self.proc = None
        self.loaded = set()
        for f in (getattr(self, "_w", None),):
            if f:
                try:
                    f.close()
                except BrokenPipeError:
                    pass
        if self._r is not None:
            os.close(self._r)
            self._r = None

    def kill(self) -> None:
        """Kill the runner's whole process group (a kernel may have forked)."""
        if self.proc:
            kill_group(self.proc)
            self._reset()

    def stop(self) -> None:
        """Ask the runner to exit, then make sure it did."""
        if self.proc and self.proc.poll() is None:
            try:
                self._w.write(protocol.encode_request(Exit()))
                self._w.flush()
                self.proc.wait(timeout=2)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if self.proc:
            self._reset()


def kernel_seconds(reply: Reply) -> float:
    """How long the kernels ran in a runner's reply: the child's own account (busy_s: every call, warm-up
    included), else the timed calls it reports (a child that keeps no account, such as the cuda child)."""
    if reply.busy_s is not None:
        return float(reply.busy_s)
    return float(sum(reply.seconds)) + float(sum(sum(s) for s in reply.samples.values()))

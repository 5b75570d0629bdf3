"""Run a generated engine in a child process (kfactory/engines/child.py) and talk to it over pipes.

Generated code never runs in the calling process: `EngineRunner` starts `python -m kfactory.engines.child` in a
session of its own (killed as a group), with an address-space limit and, where it works here, without network
(kfactory.sandbox.parent.network_isolation_prefix), and sends it typed requests. The child opens the model,
prepares the design's tensors and loads the library itself; the parent only sends token ids and receives
logits. Every way the engine can fail is a typed `EngineFault`:

    EngineCrashed     the child died (a segfault: the signal is named) or closed its pipe
    EngineTimeout     no answer within the request's limit; the child was killed
    EngineLoadFailed  the library did not load, lacked an ABI symbol, or kf_engine_new refused its tensors
    EngineRefused     a call returned an error code (a token out of range, the context full)

A failure of the child's own Python (the model missing, a bug here) is a `HarnessError`, never a verdict on the
engine. After a crash or a timeout the runner is closed; `start()` again makes a new child.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Sequence

import numpy as np

from kfactory.engines.design import EngineDesign
from kfactory.sandbox.parent import child_env, kill_group, network_isolation_prefix

#: default address-space limit of an engine child (the real model's tensors, prepared, are well under a GiB)
MEM_MB = 8192


class EngineFault(Exception):
    """The engine under test failed (a verdict on it): `kind` names how."""
    kind = "crashed"


class EngineCrashed(EngineFault):
    kind = "crashed"


class EngineTimeout(EngineFault):
    kind = "timeout"


class EngineLoadFailed(EngineFault):
    kind = "load_failed"


class EngineRefused(EngineFault):
    kind = "engine"


class HarnessError(Exception):
    """The child's own code or environment failed; not the engine's fault. `traceback` is the child's."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


FAULTS: dict[str, type[EngineFault]] = {"load_failed": EngineLoadFailed, "engine": EngineRefused}


@dataclass(frozen=True)
class BenchFigures:
    """A timing in the child: prefill of `context` tokens, then single decode steps after it (all repeats)."""
    context: int
    prefill_s: list[float]
    step_s: list[float]

    @property
    def prefill_tok_s(self) -> float:
        """Prefill tokens per second from the fastest repeat (the benches' figure, as their baselines')."""
        return self.context / min(self.prefill_s)

    @property
    def prefill_median_tok_s(self) -> float:
        """Prefill tokens per second from the median repeat (a campaign's figure, local or through the
        services: the benchmarker's timing is the median too)."""
        return self.context / float(np.median(self.prefill_s))

    @property
    def decode_tok_s(self) -> float:
        """Decode steps per second from the median step."""
        return 1.0 / float(np.median(self.step_s))


@dataclass(frozen=True)
class PairedFigures:
    """Decode steps in bursts after a prefill of `context` tokens, the read probe before the first burst and
    after each (EngineRunner.paired): reads_gbps[i] the probe's figures at each thread count asked for, step_s[b]
    burst b's steps, which attend context + b * burst_steps + 1 .. context + (b + 1) * burst_steps positions."""
    context: int
    burst_steps: int
    reads_gbps: list[list[float]]
    step_s: list[list[float]]

    def read_around(self, b: int) -> float:
        """The larger read bandwidth of the probes just before and just after burst b (any thread count)."""
        return max(max(self.reads_gbps[b]), max(self.reads_gbps[b + 1]))

    def burst_tok_s(self, b: int) -> float:
        """Burst b's decode steps per second, from its median step."""
        return 1.0 / float(np.median(self.step_s[b]))

    def burst_context(self, b: int) -> int:
        """The tokens in the cache before burst b's first step."""
        return self.context + b * self.burst_steps


class EngineRunner:
    """One engine (model, design, library) in one child process; a context manager.

    `model` is a built-in model name or a package directory (kfactory.models.load_model), `so_path` the
    library built from the design's source, `ctx` the KV cache's capacity in positions."""

    def __init__(self, model: str, design: EngineDesign, so_path: Path | str, ctx: int, *,
                 threads: int | None = None, cache_dir: Path | str | None = None, timeout_s: float = 60.0,
                 open_timeout_s: float = 300.0, mem_mb: int = MEM_MB, isolate_network: bool = True):
        self.model, self.design, self.so_path, self.ctx = model, design, str(so_path), ctx
        self.threads = threads if threads is not None else design.threads
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.timeout_s, self.open_timeout_s, self.mem_mb = timeout_s, open_timeout_s, mem_mb
        self.isolate_network = isolate_network
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self._r: int | None = None
        self._w: IO[bytes] | None = None
        self._buf = b""

    def __enter__(self) -> "EngineRunner":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> dict[str, Any]:
        """Start the child and open the engine in it; returns what the child reports (design_id, open_s,
        prepare_s, weight_bytes)."""
        self.close()
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        env = child_env()
        env["OMP_NUM_THREADS"] = str(self.threads)
        # read by libgomp when the engine library loads it, so it is set here (the design's `spin` and `wait`)
        for name, value in self.design.omp_env().items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        prefix = network_isolation_prefix() if self.isolate_network else ()
        cmd = [*prefix, sys.executable, "-m", "kfactory.engines.child", str(p2c_r), str(c2p_w), str(self.mem_mb)]
        self.proc = subprocess.Popen(cmd, pass_fds=(p2c_r, c2p_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)
        os.close(p2c_r)
        os.close(c2p_w)
        self._w, self._r, self._buf = os.fdopen(p2c_w, "wb"), c2p_r, b""
        self.info, _ = self._request({"op": "open", "model": self.model, "cache_dir": self.cache_dir,
                                      "design": self.design.as_dict(), "so": self.so_path, "ctx": self.ctx,
                                      "threads": self.threads}, self.open_timeout_s)
        return self.info

    # -- requests ------------------------------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Logits of the last token (vocab,), or of every token (n, vocab) with all_logits."""
        _, out = self._request({"op": "prefill", "tokens": [int(t) for t in tokens], "all": all_logits},
                               self.timeout_s * (1 + len(tokens) / 64))
        assert out is not None
        return out if all_logits else out.reshape(-1)

    def decode(self, token: int) -> np.ndarray:
        _, out = self._request({"op": "decode", "token": int(token)}, self.timeout_s)
        assert out is not None
        return out

    def reset(self) -> None:
        self._request({"op": "reset"}, self.timeout_s)

    def bench(self, context: int = 128, decode_tokens: int = 32, repeats: int = 3) -> BenchFigures:
        """Time a prefill of `context` tokens and `decode_tokens` decode steps after it, in the child."""
        reply, _ = self._request({"op": "bench", "context": context, "decode_tokens": decode_tokens,
                                  "repeats": repeats},
                                 self.timeout_s * repeats * (2 + context / 64 + decode_tokens))
        return BenchFigures(context, list(reply["prefill_s"]), list(reply["step_s"]))

    def paired(self, context: int, bursts: int, burst_steps: int, probe_so: Path | str, probe_elements: int,
               probe_threads: list[int]) -> PairedFigures:
        """Prefill `context` tokens, then `bursts` bursts of `burst_steps` timed decode steps, the cpu target's read
        probe (kfactory.targets.cpu.ceiling.probe_library, over `probe_elements` floats) run in the child at each
        of `probe_threads` before the first burst and after each: the engine and the host's read bandwidth
        measured at the same moments."""
        reply, _ = self._request({"op": "paired", "context": context, "bursts": bursts, "burst_steps": burst_steps,
                                  "probe_so": str(probe_so), "probe_elements": probe_elements,
                                  "probe_threads": list(probe_threads)},
                                 # a tenth of the request limit a step or probe pass: far above either
                                 self.timeout_s * (2 + context / 64 + (bursts * burst_steps
                                                                       + (bursts + 1) * len(probe_threads)) / 10))
        return PairedFigures(context, burst_steps, [list(r) for r in reply["reads_gbps"]],
                             [list(b) for b in reply["step_s"]])

    def close(self) -> None:
        """Ask the child to exit, then kill its process group if it has not."""
        if self.proc is not None and self.proc.poll() is None and self._w is not None:
            try:
                self._w.write(b'{"op": "exit"}\n')
                self._w.flush()
                self.proc.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self._kill()

    # -- the wire ------------------------------------------------------------------------------------------

    def _request(self, req: dict, timeout_s: float) -> tuple[dict, np.ndarray | None]:
        if self.proc is None or self._w is None:
            raise HarnessError("the engine runner is not started (or was closed after a fault)")
        try:
            self._w.write((json.dumps(req) + "\n").encode())
            self._w.flush()
        except BrokenPipeError as e:
            raise self._crashed() from e
        deadline = time.monotonic() + timeout_s
        self._read_until(lambda: b"\n" in self._buf, deadline, timeout_s, req["op"])
        head, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(head)
        except ValueError as e:   # only the engine's code could have written this into the reply pipe
            self._kill()
            raise EngineCrashed(f"the engine child sent garbage: {head[:200]!r}") from e
        if not reply.get("ok"):
            kind, message = reply.get("kind"), reply.get("message", "")
            if kind in FAULTS:
                raise FAULTS[kind](f"{req['op']}: {message}")
            self._kill()
            raise HarnessError(f"engine child ({req['op']}): {message}", reply.get("traceback", ""))
        nbytes = int(reply.get("nbytes", 0))
        if not nbytes:
            return reply, None
        # the payload goes straight into its array (logits of a long prefill are hundreds of MB: appending
        # chunks to a bytes object would copy them over and over)
        out = bytearray(nbytes)
        have = min(nbytes, len(self._buf))
        out[:have] = self._buf[:have]
        self._buf = self._buf[have:]
        view = memoryview(out)
        while have < nbytes:
            self._wait_readable(deadline, timeout_s, req["op"])
            assert self._r is not None
            got = os.readv(self._r, [view[have:]])
            if not got:
                raise self._crashed()
            have += got
        return reply, np.frombuffer(out, dtype=np.float32).reshape(reply["shape"])

    def _wait_readable(self, deadline: float, timeout_s: float, op: str) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._r is None:
                self._kill()
                raise EngineTimeout(f"{op}: no answer within {timeout_s:.1f} s; engine child killed")
            if select.select([self._r], [], [], left)[0]:
                return

    def _read_until(self, done, deadline: float, timeout_s: float, op: str) -> None:
        while not done():
            self._wait_readable(deadline, timeout_s, op)
            assert self._r is not None
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise self._crashed()
            self._buf += chunk

    def _crashed(self) -> EngineCrashed:
        rc = None
        if self.proc is not None:
            try:
                rc = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                rc = None
        self._kill()
        if rc is not None and rc < 0:
            return EngineCrashed(f"engine child killed by signal {signal.Signals(-rc).name}")
        return EngineCrashed(f"engine child exited with status {rc}")

    def _kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
        self.proc = None
        if self._w is not None:
            try:
                self._w.close()
            except BrokenPipeError:
                pass
            self._w = None
        if self._r is not None:
            os.close(self._r)
            self._r = None

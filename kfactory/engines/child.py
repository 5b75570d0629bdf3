"""The engine's child process: opens the model, prepares its tensors for the design, loads the generated library
and serves requests from kfactory.engines.runner.EngineRunner. Never imported by a service.

Started as `python -m kfactory.engines.child RFD WFD MEM_MB`: it reads requests on RFD and answers on WFD (never on
stdout, which the generated code may write to). The wire format (parent and child are always the same version):

    request: one JSON line {"op": ..., ...}
    reply:   one JSON line {"ok": true, ...} or {"ok": false, "kind": ..., "message": ..., "traceback": ...};
             a reply with "nbytes" > 0 is followed by that many bytes: a float32 array of shape "shape"

Ops: open {model, cache_dir, design, so, ctx, threads}; prefill {tokens, all}; decode {token}; reset;
bench {context, decode_tokens, repeats}; paired {context, bursts, burst_steps, probe_so, probe_elements,
probe_threads}; exit. A roofline uses the cpu target's ceilings (kfactory.engines.baselines.roofline.host_ceilings);
`paired` alone also reads the host's bandwidth here, with the cpu target's read probe between bursts of decode
steps, so that both are measured at the same moments (bench/engine.py's paired rounds). Failure kinds:
"load_failed" (the library could not be loaded or refused its tensors), "engine" (a call returned an error
code), "harness" (this file's own code or the environment failed: not the engine's fault).
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import time
import traceback
from typing import Any, BinaryIO

import numpy as np

from kfactory.engines.abi import AbiError, Engine
from kfactory.engines.design import EngineDesign
from kfactory.engines.prepare import arena
from kfactory.models import load_model


#: the largest file the child may write (kfactory.sandbox.child limits its runners the same way)
FSIZE_MB = 64


class Failure(Exception):
    """A request failed as `kind` (see the module docstring)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def bench_tokens(n: int, vocab: int) -> list[int]:
    """A fixed token sequence for timing (the values do not change the work done)."""
    return [(17 + 31 * i) % vocab for i in range(n)]


class ReadProbe:
    """The cpu target's read probe (kfactory.targets.cpu.ceiling.probe_library) loaded in this process, over a
    buffer of `elements` ones: read(threads) is one pass at each thread count, in GB/s. The probe runs on the
    calling thread's OpenMP thread count, set through the probe library's own OpenMP runtime (the engine's
    parallel regions name their thread counts, so they are not changed by it)."""

    def __init__(self, so_path: str, elements: int):
        try:
            self.lib = ctypes.CDLL(so_path)
            self.kernel = self.lib.kernel
            self._set = self.lib.omp_set_num_threads
            self._get = self.lib.omp_get_max_threads
        except (OSError, AttributeError) as e:
            raise Failure("harness", f"read probe {so_path}: {e}") from e
        self.kernel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self.kernel.restype = None
        self._set.argtypes = [ctypes.c_int]
        self.x = np.ones(elements, dtype=np.float32)
        self.y = np.zeros(3, dtype=np.float32)

    def read(self, threads: list[int]) -> list[float]:
        """One pass of the probe at each of `threads`, in GB/s (bytes read over its time)."""
        was, out = int(self._get()), []
        try:
            for t in threads:
                self._set(t)
                t0 = time.perf_counter()
                self.kernel(self.x.ctypes.data, self.y.ctypes.data, self.x.size)
                dt = time.perf_counter() - t0
                # every element read (a sum of ones, exact this far in float32) on the threads asked for
                if int(self.y[1]) != t or abs(float(self.y[0]) - self.x.size) > 1e-3 * self.x.size:
                    raise Failure("harness", f"read probe summed {float(self.y[0])} on {int(self.y[1])} threads; "
                                             f"expected {self.x.size} on {t}")
                out.append(self.x.nbytes / dt / 1e9)
        finally:
            self._set(was)
        return out


class Server:
    """Holds the opened engine between requests."""

    def __init__(self) -> None:
        self.engine: Engine | None = None

    def op_open(self, req: dict) -> tuple[dict, np.ndarray | None]:
        t0 = time.perf_counter()
        model = load_model(req["model"]).open(req.get("cache_dir"))
        design = EngineDesign.from_dict(req["design"])
        t1 = time.perf_counter()
        tensors = arena(model, design)   # one buffer in the order a step reads it (prepare.arena)
        t2 = time.perf_counter()
        try:
            self.engine = Engine(req["so"], tensors, model.config, int(req["ctx"]), int(req["threads"]))
        except (OSError, AbiError) as e:   # the library's own fault: it does not load, or refuses its tensors
            raise Failure("load_failed", str(e)) from e
        return {"design_id": self.engine.design_id, "open_s": t1 - t0, "prepare_s": t2 - t1,
                "weight_bytes": int(sum(t.data.nbytes for t in tensors)), "vocab": model.config.vocab}, None

    def _engine(self) -> Engine:
        if self.engine is None:
            raise Failure("harness", "no engine is open: send open first")
        return self.engine

    def op_prefill(self, req: dict) -> tuple[dict, np.ndarray | None]:
        return {}, self._call(lambda e: e.prefill(req["tokens"], bool(req.get("all", False))))

    def op_decode(self, req: dict) -> tuple[dict, np.ndarray | None]:
        return {}, self._call(lambda e: e.decode(int(req["token"])))

    def op_reset(self, req: dict) -> tuple[dict, np.ndarray | None]:
        self._engine().reset()
        return {}, None

    def _call(self, fn) -> np.ndarray:
        try:
            return fn(self._engine())
        except AbiError as e:
            raise Failure("engine", str(e)) from e

    def op_bench(self, req: dict) -> tuple[dict, np.ndarray | None]:
        """Prefill `context` tokens (timed), then `decode_tokens` single steps (each timed), `repeats` times
        from an empty cache; timing happens here, next to the engine."""
        e = self._engine()
        context, steps, repeats = int(req["context"]), int(req["decode_tokens"]), int(req.get("repeats", 3))
        if context + steps > e.ctx:
            raise Failure("harness", f"bench needs {context + steps} positions; the engine holds {e.ctx}")
        tokens = bench_tokens(context + steps, e.config.vocab)
        out = np.empty(e.config.vocab, dtype=np.float32)
        prefill_s, step_s = [], []
        for _ in range(repeats):
            e.reset()
            t0 = time.perf_counter()
            self._call(lambda eng: eng.prefill(tokens[:context]))
            prefill_s.append(time.perf_counter() - t0)
            step_s += self._steps(tokens[context:], out)
        e.reset()
        return {"prefill_s": prefill_s, "step_s": step_s, "context": context}, None

    def op_paired(self, req: dict) -> tuple[dict, np.ndarray | None]:
        """After a prefill of `context` tokens, `bursts` runs of `burst_steps` single decode steps (each timed),
        each run between two passes of the read probe at every count in `probe_threads`: the host's read
        bandwidth measured at the moments the engine runs, in the same process. Reply: "reads_gbps" (bursts + 1
        probes, a figure per thread count), "step_s" (a list a burst) and "context"."""
        e = self._engine()
        context, bursts, n = int(req["context"]), int(req["bursts"]), int(req["burst_steps"])
        threads = [int(t) for t in req["probe_threads"]]
        if context < 1 or bursts < 1 or n < 1 or not threads or min(threads) < 1:
            raise Failure("harness", f"paired needs context, bursts, burst_steps and probe threads of at least 1 "
                                     f"(got {context}, {bursts}, {n}, {threads})")
        if context + bursts * n > e.ctx:
            raise Failure("harness", f"paired needs {context + bursts * n} positions; the engine holds {e.ctx}")
        probe = ReadProbe(str(req["probe_so"]), int(req["probe_elements"]))
        tokens = bench_tokens(context + bursts * n, e.config.vocab)
        out = np.empty(e.config.vocab, dtype=np.float32)
        e.reset()
        self._call(lambda eng: eng.prefill(tokens[:context]))
        reads, steps = [probe.read(threads)], []
        for b in range(bursts):
            steps.append(self._steps(tokens[context + b * n:context + (b + 1) * n], out))
            reads.append(probe.read(threads))
        e.reset()
        return {"reads_gbps": reads, "step_s": steps, "context": context}, None

    def _steps(self, tokens: list[int], out: np.ndarray) -> list[float]:
        """One decode step a token, each timed: their seconds."""
        seconds = []
        for tok in tokens:
            t0 = time.perf_counter()
            self._call(lambda eng: eng.decode(tok, out))
            seconds.append(time.perf_counter() - t0)
        return seconds


def _limit(mem_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # a crashing engine must not spend seconds writing a core
    # the engine writes no files; the child itself at most a generated test model (tiny-llama: under 1 MB)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_MB << 20, FSIZE_MB << 20))
    if mem_mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))


def _send(wr: BinaryIO, header: dict[str, Any], payload: np.ndarray | None) -> None:
    if payload is not None:
        data = np.ascontiguousarray(payload, dtype=np.float32)
        header = {**header, "shape": list(data.shape), "nbytes": data.nbytes}
        wr.write((json.dumps(header) + "\n").encode())
        wr.write(data.tobytes())
    else:
        wr.write((json.dumps(header) + "\n").encode())
    wr.flush()


def main() -> None:
    rfd, wfd, mem_mb = (int(v) for v in sys.argv[1:4])
    _limit(mem_mb)
    server = Server()
    rd, wr = os.fdopen(rfd, "rb"), os.fdopen(wfd, "wb")
    for line in rd:
        try:
            req = json.loads(line)
            if req.get("op") == "exit":
                break
            handler = getattr(server, f"op_{req.get('op')}", None)
            if handler is None:
                raise Failure("harness", f"no such op {req.get('op')!r}")
            header, payload = handler(req)
            _send(wr, {"ok": True, **header}, payload)
        except Failure as e:
            _send(wr, {"ok": False, "kind": e.kind, "message": str(e), "traceback": traceback.format_exc()}, None)
        except Exception as e:  # noqa: BLE001 - this child's own failure: replied with its traceback, typed harness
            _send(wr, {"ok": False, "kind": "harness", "message": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()}, None)


if __name__ == "__main__":
    main()

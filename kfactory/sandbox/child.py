"""The runner: a child process that loads candidate kernels and runs them on inputs in shared memory.

It is started by kfactory.sandbox.parent.Runner, never imported by a service. It speaks JSON lines on the file
descriptors given on its command line (never on stdout, which candidate code may write to), limits its own
resources before loading anything, and knows nothing of the bus.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os
import resource
import sys
import time

import numpy as np


#: the kernel's argument types: tensors, shape symbols and int parameters (int64), float parameters as the
#: signature declares them (kfactory.problems.params.abi_argtypes); a C float must be passed as one
ARGTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double}


def _limit(mem_mb: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if mem_mb > 0:
        # 0 means no address-space limit: a GPU driver reserves far more virtual memory than it uses
        resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))


class Child:
    """Holds the loaded kernels and the mapped buffers of the current command."""

    def __init__(self, threads: int):
        self.threads = threads
        self.kernels: dict[str, object] = {}
        self.kinds: dict[str, str] = {}
        self.maps: dict[str, np.memmap] = {}
        #: the previous command's mappings stay mapped through the next command, so consecutive calls
        #: never get their buffers at the same addresses (a memo keyed by pointer sees new pointers)
        self.prev_maps: dict[str, np.memmap] = {}
        #: the parent's shared-memory arenas (a command's "keep"), mapped once and kept across commands: the
        #: parent uses them in turn, so consecutive commands still see different addresses, and no command pays
        #: for mapping and faulting in its buffers again
        self.kept: dict[str, np.memmap] = {}
        self.keep: frozenset[str] = frozenset()

    def begin(self, cmd: dict) -> None:
        """Before a command: let go of kept arenas the parent no longer uses (it names those it does)."""
        if "keep" in cmd:
            self.keep = frozenset(cmd["keep"])
            self.kept = {p: m for p, m in self.kept.items() if p in self.keep}

    def op_ping(self, cmd: dict) -> dict:
        return {"pid": os.getpid()}

    def op_load(self, cmd: dict) -> dict:
        key = cmd["key"]
        if cmd["kind"] == "so":
            lib = ctypes.CDLL(cmd["path"], mode=os.RTLD_LOCAL | os.RTLD_NOW)
            fn = getattr(lib, cmd["entry"])
            fn.restype = None
            fn.argtypes = [ARGTYPES[a] for a in cmd["argtypes"]]
            self.kernels[key] = fn
        else:
            spec = importlib.util.spec_from_file_location("kf_problem_ref", cmd["module"])
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            # the problem's scalar parameters as keyword arguments (kfactory.problems.params)
            self.kernels[key] = mod.baselines(**cmd.get("params", {}))[cmd["name"]]
        self.kinds[key] = cmd["kind"]
        return {}

    def _bind(self, key: str, argset: list[dict]):
        """A zero-argument callable running kernel `key` on one argument set (mapped once, outside timing)."""
        fn = self.kernels[key]
        arrays = {a["name"]: self._view(a) for a in argset if "path" in a}
        if self.kinds[key] == "so":
            args = [arrays[a["name"]].ctypes.data if "path" in a else float(a["float"]) if "float" in a
                    else int(a["int"]) for a in argset]
            return lambda: fn(*args), arrays
        ins = {a["name"]: arrays[a["name"]] for a in argset if a.get("role") == "in"}
        outs = {a["name"]: arrays[a["name"]] for a in argset if a.get("role") == "out"}
        return lambda: fn(ins, outs, self.threads), arrays

    def _view(self, a: dict) -> np.ndarray:
        """An array at an offset of a shared file; each file is mapped once per command."""
        path = a["path"]
        mm = self.maps.get(path)
        if mm is None:
            mm = self.kept.get(path)
        if mm is None:
            mm = np.memmap(path, dtype=np.uint8, mode="r+")
            (self.kept if path in self.keep else self.maps)[path] = mm
        return np.ndarray(tuple(a["shape"]), dtype=a["dtype"], buffer=mm, offset=a.get("offset", 0))

    def op_call(self, cmd: dict) -> dict:
        """Run once; then once per entry of "steps" on the same buffers, each step first saving the previous
        outputs to its "outputs", writing its "inputs" into the input buffers and poisoning the outputs."""
        call, arrays = self._bind(cmd["key"], cmd["args"])
        seconds = [self._timed(call)]
        for step in cmd.get("steps", []):
            for name, desc in step["outputs"].items():
                self._view(desc)[...] = arrays[name]
            for name, desc in step["inputs"].items():
                arrays[name][...] = self._view(desc)
            for name, value in step["poison"].items():
                arrays[name][...] = value
            seconds.append(self._timed(call))
        # MAP_SHARED pages of a tmpfs file are the parent's pages too: no msync needed
        return {"seconds": seconds, "busy_s": sum(seconds)}

    @staticmethod
    def _timed(call) -> float:
        t0 = time.perf_counter_ns()
        call()
        return (time.perf_counter_ns() - t0) * 1e-9

    def op_bench(self, cmd: dict) -> dict:
        """Interleaved timing: round-robin over kernels (A B A B ...), each call on the next argument set."""
        # keep every mapping alive while its pointers are in use: a collected memmap unmaps its memory
        pairs = {k["key"]: [self._bind(k["key"], s) for s in k["argsets"]] for k in cmd["kernels"]}
        bound = {k: [call for call, _ in v] for k, v in pairs.items()}
        keys = list(bound)
        warm_rounds, warm_s = self._warm_up(bound, cmd["warmup_s"])

        def timed(k: str, i: int) -> float:
            return self._timed(bound[k][i % len(bound[k])])

        samples, i = sample_interleaved({k: functools.partial(timed, k) for k in keys}, cmd)
        del pairs
        # sets 0 .. reached-1 were called (warm-up and timing walk them in order): the parent checks exactly
        # those outputs; a set never reached still holds its poison and is not a result
        return {"samples": samples, "reached": {k: min(len(bound[k]), max(i, warm_rounds)) for k in keys},
                "busy_s": warm_s + sum(sum(s) for s in samples.values())}

    @staticmethod
    def _warm_up(bound: dict, warmup_s: float) -> tuple[int, float]:
        """Call every kernel round after round until warmed up (see warm_up); (the rounds it took, their
        seconds in all: the kernels' time, for the parent's account of device time)."""
        spent = [0.0]

        def one_round(n: int) -> float:
            t0 = time.perf_counter()
            for calls in bound.values():
                calls[n % len(calls)]()
            took = time.perf_counter() - t0
            spent[0] += took
            return took
        # every argument set is called once before any timed call (within the warm-up's time cap): a kernel that
        # computes only on a set's first call (a fresh, poisoned output) must be timed by its repeat calls
        rounds = warm_up(one_round, warmup_s, min_rounds=max(len(calls) for calls in bound.values()))
        return rounds, spent[0]


def warm_up(one_round, warmup_s: float, min_rounds: int = 2) -> int:
    """Run one_round(n) -> seconds until warmup_s has passed and a round's time is within 10% of the previous
    one (caches, page tables, clocks settled) and at least min_rounds rounds have run, but for no longer than
    10 x warmup_s; the rounds it took."""
    start = time.perf_counter()
    prev, n = None, 0
    while True:
        took = one_round(n)
        n += 1
        elapsed = time.perf_counter() - start
        stable = prev is not None and abs(took - prev) <= 0.1 * prev
        # the 10 x warmup_s cap wins over min_rounds: a slow kernel must not spend its runner's time limit here
        if (n >= 2 and elapsed >= 10 * warmup_s) or (n >= max(2, min_rounds) and elapsed >= warmup_s and stable):
            return n
        prev = took


def sample_interleaved(samplers: dict, cmd: dict) -> tuple[dict[str, list[float]], int]:
    """Round-robin over the kernels (A B A B ...), each sampler(i) timing round i, until max_s has passed, or
    min_samples rounds and min_s have and every kernel's noise is under the bound; (samples, rounds)."""
    samples: dict[str, list[float]] = {k: [] for k in samplers}
    start = time.perf_counter()
    i = 0
    while True:
        for k, sampler in samplers.items():
            samples[k].append(sampler(i))
        i += 1
        elapsed = time.perf_counter() - start
        if elapsed >= cmd["max_s"]:
            return samples, i
        if i >= cmd["min_samples"] and elapsed >= cmd["min_s"] and all(
                _noise(s) <= cmd["noise"] for s in samples.values()):
            return samples, i


def _noise(s: list[float]) -> float:
    if len(s) < 4:
        return float("inf")
    q1, med, q3 = np.percentile(s, [25, 50, 75])
    return (q3 - q1) / med if med > 0 else float("inf")


def main(child_cls=None) -> None:
    """Serve commands with `child_cls` (a Child subclass; a target's child module passes its own)."""
    rfd, wfd, threads, mem_mb, cpu_s = (int(v) for v in sys.argv[1:6])
    _limit(mem_mb, cpu_s)
    child = (child_cls or Child)(threads)
    rd = os.fdopen(rfd, "r")
    wr = os.fdopen(wfd, "w")
    for line in rd:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        try:
            child.begin(cmd)
            reply = {"ok": True, **getattr(child, "op_" + cmd["op"])(cmd)}
        except (OSError, AttributeError, KeyError, ValueError, TypeError, ImportError) as e:
            # loading or binding failed (missing symbol, bad library): the parent types it
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        finally:
            child.prev_maps, child.maps = child.maps, {}
        wr.write(json.dumps(reply) + "\n")
        wr.flush()


if __name__ == "__main__":
    main()

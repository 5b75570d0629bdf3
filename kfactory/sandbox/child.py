"""The runner: a child process that loads candidate kernels and runs them on inputs in shared memory.

It is started by kfactory.sandbox.parent.Runner, never imported by a service. It speaks the typed protocol of
kfactory.sandbox.protocol on the file descriptors given on its command line (never on stdout, which candidate code
may write to), limits its own resources before loading anything, and knows nothing of the bus.

Only code that is not ours (the kernel, the problem's reference.py) can fail as the candidate: the ops wrap exactly
those calls and raise KernelFault. Any other exception is a bug or an environment error of the runner itself and
is replied as a HARNESS fault with its traceback (serve), never as the candidate's.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import resource
import sys
import time
import traceback
from typing import Any

import numpy as np

from kfactory.sandbox import protocol
from kfactory.sandbox.orders import williams
from kfactory.sandbox.protocol import Arg, Bench, Call, Fault, FaultKind, Load, Ping, Reply, Request, Unload


#: the kernel's argument types: tensors, shape symbols and int parameters (int64), float parameters as the
#: signature declares them (kfactory.problems.params.abi_argtypes); a C float must be passed as one
ARGTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "f32": ctypes.c_float, "f64": ctypes.c_double}


class KernelFault(Exception):
    """The candidate's own code failed in this child (it could not be loaded, or it raised): replied as `fault`."""

    def __init__(self, kind: FaultKind, message: str, code: int = 0, exiting: bool = False):
        super().__init__(message)
        self.fault = Fault(kind, message, code=code, exiting=exiting)


def _limit(mem_mb: int, cpu_s: int) -> None:
    """The child's limits, set before anything is loaded. The address space: `mem_mb` for the child and its
    kernel, and on top of that the shared buffers the harness maps (Child.fit_limit raises the soft limit by
    them), up to a hard limit of `mem_mb` and the whole shared-memory filesystem, as the buffers live there;
    0: no address-space limit (a GPU driver reserves far more virtual memory than it uses)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if mem_mb > 0:
        fs = os.statvfs(protocol.shared_dir())
        hard = (mem_mb << 20) + fs.f_blocks * fs.f_frsize
        inherited = resource.getrlimit(resource.RLIMIT_AS)[1]   # a hard limit can be lowered, never raised
        if inherited != resource.RLIM_INFINITY:
            hard = min(hard, inherited)
        resource.setrlimit(resource.RLIMIT_AS, (min(mem_mb << 20, hard), hard))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))


def _size(path: str) -> int:
    """The file's size now (-1 where it is gone)."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


class Child:
    """Holds the loaded kernels and the mapped buffers of the current command."""

    def __init__(self, threads: int):
        self.threads = threads
        self.kernels: dict[str, Any] = {}
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
        #: the address space the child and its kernel may use beside the harness's mappings (0: unlimited)
        self.own_bytes = 0

    def begin(self, req: Request) -> None:
        """Before a request: let go of kept arenas the parent no longer uses (it names those it does)."""
        keep = getattr(req, "keep", None)
        if keep is not None:
            self.keep = frozenset(keep)
            # an arena the parent grew in place since (kfactory.sandbox.shm.ShmBuffers.grow) is mapped again, whole
            self.kept = {p: m for p, m in self.kept.items() if p in self.keep and _size(p) == m.size}
            self.fit_limit()

    def fit_limit(self, mapping: int = 0) -> None:
        """Hold the address space to own_bytes beside the shared buffers the child maps (those it holds, and
        `mapping` more about to be mapped): the limit is on the kernel's own allocations, and the buffers are the
        harness's, as large as the problem's tensors and the cache make them (five softmax 4096x4096 kernels'
        timing sets took 5 GiB; a fixed limit failed their mapping, a harness error, where the filesystem had
        room). Lowered again as mappings are let go."""
        if not self.own_bytes:
            return
        held = sum(m.size for maps in (self.maps, self.prev_maps, self.kept) for m in maps.values())
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        soft = self.own_bytes + held + mapping
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))

    def op_ping(self, req: Ping) -> Reply:
        return Reply(pid=os.getpid())

    def op_load(self, req: Load) -> Reply:
        if req.kind == "so":
            argtypes = [ARGTYPES[a] for a in req.argtypes]
            fn = _bind_symbol(req.path, req.entry)
            fn.restype = None
            fn.argtypes = argtypes
            self.kernels[req.key] = fn
        elif req.kind == "baseline":
            self.kernels[req.key] = _baseline(req, "baselines", "kf_problem_ref")
        else:
            raise ValueError(f"unknown kind {req.kind!r} for the cpu runner (so or baseline)")
        self.kinds[req.key] = req.kind
        return Reply()

    def op_unload(self, req: Unload) -> Reply:
        """Drop kernel `key` (protocol.Unload); a key never loaded is no error (the parent's view may be older)."""
        self.kernels.pop(req.key, None)
        self.kinds.pop(req.key, None)
        return Reply()

    def _bind(self, key: str, argset: list[Arg]):
        """A zero-argument callable running kernel `key` on one argument set (mapped once, outside timing)."""
        fn = self.kernels[key]
        arrays = {a["name"]: self._view(a) for a in argset if "path" in a}
        if self.kinds[key] == "so":
            args = [arrays[a["name"]].ctypes.data if "path" in a else float(a["float"]) if "float" in a
                    else int(a["int"]) for a in argset]
            return lambda: fn(*args), arrays
        ins = {a["name"]: arrays[a["name"]] for a in argset if a.get("role") == "in"}
        outs = {a["name"]: arrays[a["name"]] for a in argset if a.get("role") == "out"}
        return raising_as_kernel(lambda: fn(ins, outs, self.threads)), arrays

    def _mapping(self, path: str) -> np.memmap:
        """Shared file `path`, mapped once per command, or once for as long as the parent keeps it (an arena it
        names in a command's "keep")."""
        mm = self.maps.get(path)
        if mm is None:
            mm = self.kept.get(path)
        if mm is None:
            self.fit_limit(os.stat(path).st_size)
            mm = np.memmap(path, dtype=np.uint8, mode="r+")
            (self.kept if path in self.keep else self.maps)[path] = mm
        return mm

    def _view(self, a: Arg) -> np.ndarray:
        """An array at an offset of a shared file (`_mapping`)."""
        return np.ndarray(tuple(a["shape"]), dtype=a["dtype"], buffer=self._mapping(a["path"]),
                          offset=a.get("offset", 0))

    def op_call(self, req: Call) -> Reply:
        """Run once; then once per step on the same buffers, each step first saving the previous outputs to its
        "outputs", writing its "inputs" into the input buffers and poisoning the outputs."""
        call, arrays = self._bind(req.key, req.args)
        seconds = [self._timed(call)]
        for step in req.steps:
            for name, desc in step["outputs"].items():
                self._view(desc)[...] = arrays[name]
            for name, desc in step["inputs"].items():
                arrays[name][...] = self._view(desc)
            for name, value in step["poison"].items():
                arrays[name][...] = value
            seconds.append(self._timed(call))
        # MAP_SHARED pages of a tmpfs file are the parent's pages too: no msync needed
        return Reply(seconds=seconds, busy_s=sum(seconds))

    @staticmethod
    def _timed(call) -> float:
        t0 = time.perf_counter_ns()
        call()
        return (time.perf_counter_ns() - t0) * 1e-9

    def op_bench(self, req: Bench) -> Reply:
        """Interleaved timing: round-robin over kernels (A B A B ...), each call on the next argument set."""
        # keep every mapping alive while its pointers are in use: a collected memmap unmaps its memory
        pairs = {k.key: [self._bind(k.key, s) for s in k.argsets] for k in req.kernels}
        bound = {k: [call for call, _ in v] for k, v in pairs.items()}
        keys = list(bound)
        warm_rounds, warm_s = self._warm_up(bound, req.warmup_s)

        def timed(k: str, i: int) -> float:
            return self._timed(bound[k][i % len(bound[k])])

        samples, i = sample_interleaved({k: functools.partial(timed, k) for k in keys}, req)
        del pairs
        # sets 0 .. reached-1 were called (warm-up and timing walk them in order): the parent checks exactly
        # those outputs; a set never reached still holds its poison and is not a result
        return Reply(samples=samples, reached={k: min(len(bound[k]), max(i, warm_rounds)) for k in keys},
                     busy_s=warm_s + sum(sum(s) for s in samples.values()))

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


def sample_interleaved(samplers: dict, req: Bench) -> tuple[dict[str, list[float]], int]:
    """Round-robin over the kernels, each sampler(i) timing round i, until max_s has passed, or min_samples rounds
    and min_s have and every kernel is settled (see settled); (samples, rounds). Round i calls the kernels in the
    order williams(n)[i mod its length] (kfactory.sandbox.orders: A B C, B C A, C A B, C B A, A C B, B A C), so
    that every kernel is called in every place of a round, and right after every other kernel, equally often: on
    the 2-core host the same kernel under three keys ran about 2% slower first in a round than last, in A B C order
    always, which is as large as the differences between the best kernels a showdown decides between."""
    samples: dict[str, list[float]] = {k: [] for k in samplers}
    order = list(samplers.items())
    start = time.perf_counter()
    i = 0
    next_check = 0
    rounds = [[order[j] for j in row] for row in williams(len(order))]
    while True:
        for k, sampler in rounds[i % len(rounds)]:
            samples[k].append(sampler(i))
        i += 1
        elapsed = time.perf_counter() - start
        if elapsed >= req.max_s:
            return samples, i
        # settled() reads every sample: asked after every round it cost more than a 30 us kernel's call once
        # thousands were in (the host's time that the kernels did not get), so it is asked again only after a
        # sixteenth more rounds, which ends the timing at most that much later
        if i >= req.min_samples and elapsed >= req.min_s and i >= next_check:
            if all(settled(s, req.noise, req.precision) for s in samples.values()):
                return samples, i
            next_check = i + max(1, i // 16)


def settled(s: list[float], noise: float, precision: float = 0.0) -> bool:
    """Whether a kernel's timing may end: its noise (interquartile range over median) is at most `noise`, or, with
    `precision` > 0, its median's 95% confidence interval (the order-statistic one, as the judge's summary
    computes it, here with the normal approximation of its ranks) has a half-width of at most `precision` of the
    median. A kernel whose calls vary more than `noise` on a busy host needs no more calls once its median is that
    precise: more calls make the median more precise, never the calls less varied."""
    if len(s) < 4:
        return False
    q1, med, q3 = np.percentile(s, [25, 50, 75])
    if med <= 0:
        return False
    if (q3 - q1) / med <= noise:
        return True
    n = len(s)
    lo = median_rank_lo(n)
    if precision <= 0 or lo < 1:   # too few calls for a 95% interval inside the range
        return False
    part = np.partition(np.asarray(s), [lo, n - 1 - lo])
    return (part[n - 1 - lo] - part[lo]) / 2 <= precision * med


def median_rank_lo(n: int) -> int:
    """The 0-based lower rank of the 95% order-statistic interval of n samples' median by the normal approximation,
    one lower: never narrower than the exact one the judge's summary reports (kfactory.judge.stats.median_ranks),
    without scipy in the runner."""
    return int(np.floor(n / 2 - 0.98 * np.sqrt(n))) - 1


def _bind_symbol(path: str, entry: str) -> Any:
    """The candidate's `entry` in the shared object at `path`; KernelFault(LOAD_FAILED) when the object does not
    load or lacks the symbol (the candidate's doing: the parent wrote the file the compiler made)."""
    try:
        return getattr(ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW), entry)
    except (OSError, AttributeError) as e:
        raise KernelFault(FaultKind.LOAD_FAILED, f"cannot load {entry!r}: {type(e).__name__}: {e}") from e


def _baseline(req: Load, factory: str, module_name: str):
    """Baseline `req.name` of the problem's reference.py (`factory`: baselines or cuda_baselines, called with the
    problem's scalar parameters, kfactory.problems.params). The problem's code, not ours: whatever it raises is a
    KernelFault(LOAD_FAILED) of the kernel under that key."""
    try:
        spec = importlib.util.spec_from_file_location(module_name, req.module)
        if spec is None or spec.loader is None:
            raise ImportError(f"{req.module} is not a Python module")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return getattr(mod, factory)(**req.params)[req.name]
    except Exception as e:  # noqa: BLE001 - foreign code may raise anything; it is typed, not swallowed
        raise KernelFault(FaultKind.LOAD_FAILED, f"baseline {req.name!r} of {req.module}: {factory}() failed: "
                                                 f"{type(e).__name__}: {e}") from e


def raising_as_kernel(call, exiting: bool = False):
    """`call` (a baseline: Python code that is not ours) with whatever it raises turned into KernelFault(CRASHED);
    `exiting`: the child must end after replying (a CUDA context the failure may have poisoned)."""
    def run():
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - foreign code may raise anything; it is typed, not swallowed
            raise KernelFault(FaultKind.CRASHED, f"the kernel raised {type(e).__name__}: {e}",
                              exiting=exiting) from e
    return run


def serve(child: "Child", req: Request) -> Reply:
    """Serve one request: the op's reply, the candidate's fault (KernelFault), or a HARNESS fault with the
    traceback for any other exception, which is the runner's own code failing."""
    try:
        child.begin(req)
        return getattr(child, "op_" + req.op)(req)
    except KernelFault as e:
        return Reply(fault=e.fault)
    except Exception as e:  # noqa: BLE001 - by elimination the harness's: reported with its traceback, never a verdict
        return Reply(fault=Fault(FaultKind.HARNESS, f"{req.op}: {type(e).__name__}: {e}",
                                 traceback=traceback.format_exc()))
    finally:
        child.prev_maps, child.maps = child.maps, {}
        child.fit_limit()


def _harness_fault(message: str) -> Reply:
    return Reply(fault=Fault(FaultKind.HARNESS, message, traceback=traceback.format_exc()))


def _encoded(reply: Reply) -> bytes:
    """The reply's line; a reply that cannot be encoded (an op put a non-JSON value in it) is a harness fault."""
    try:
        return protocol.encode_reply(reply)
    except (TypeError, ValueError) as e:
        return protocol.encode_reply(_harness_fault(f"the reply cannot be encoded: {e}"))


def main(child_cls=None) -> None:
    """Serve requests with `child_cls` (a Child subclass; a target's child module passes its own). A reply whose
    fault says the child is exiting (its CUDA context may be poisoned) is the last: the process ends after it."""
    rfd, wfd, threads, mem_mb, cpu_s = (int(v) for v in sys.argv[1:6])
    _limit(mem_mb, cpu_s)
    child = (child_cls or Child)(threads)
    child.own_bytes = max(mem_mb, 0) << 20
    rd = os.fdopen(rfd, "rb")
    wr = os.fdopen(wfd, "wb")
    for line in rd:
        try:
            req = protocol.decode_request(line)
        except protocol.ProtocolError as e:  # the parent sent what this child cannot read: ours, not the kernel's
            reply = _harness_fault(f"bad request: {e}")
        else:
            if isinstance(req, protocol.Exit):
                break
            reply = serve(child, req)
        wr.write(_encoded(reply))
        wr.flush()
        if reply.fault is not None and reply.fault.exiting:
            os._exit(3)  # no clean-up: a faulting kernel poisons the context, and freeing in it can hang


if __name__ == "__main__":
    main()

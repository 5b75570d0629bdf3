"""The target interface: compile a candidate, run it in a runner, time it, describe the device."""
from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from kfactory.v1 import events_pb2 as pb


#: signals that stop a compiler from outside: a Ctrl-C reaches every process of the terminal's process group, a
#: shutdown or a lost terminal ends the rest; a compiler stopped by one says nothing of the source it compiled
INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


class CompilerInterrupted(RuntimeError):
    """The compiler was stopped from outside before it finished (INTERRUPTS): no verdict on the source, the work
    is to be done again (raised, so the compiler service's message is retried, not answered)."""


def check_not_interrupted(returncode: int, command: str) -> None:
    """Raise CompilerInterrupted when `returncode` (subprocess's: -N for a death by signal N) is one of
    INTERRUPTS'."""
    if returncode < 0 and -returncode in INTERRUPTS:
        raise CompilerInterrupted(f"{command} was stopped by {signal.Signals(-returncode).name} before it finished")


@dataclass
class CompileResult:
    """An artifact and its resource report, or a typed failure with the compiler's message."""
    ok: bool
    report: pb.CompileReport
    artifact: bytes = b""
    log: str = ""
    reason: int = pb.REJECT_REASON_UNSPECIFIED
    message: str = ""


@dataclass
class CallResult:
    """One checked call: the outputs it wrote, its wall time, whether it wrote its inputs, and which
    tensors had a guard band around them written (a write out of bounds)."""
    outputs: dict[str, np.ndarray]
    seconds: float
    mutated: list[str] = field(default_factory=list)
    out_of_bounds: list[str] = field(default_factory=list)


@dataclass
class BenchResult:
    """Interleaved samples per kernel key, and per key the outputs the last timed calls left in the input sets
    they reached (the first ones, in the order of the input sets)."""
    samples: dict[str, list[float]]
    outputs: dict[str, list[dict[str, np.ndarray]]]
    #: how the samples were taken: wall (a host clock around each call), events, graph, replayed
    mode: str = "wall"
    #: per key, NVML readings around the measurement (GPU targets)
    telemetry: dict[str, pb.GpuTelemetry] = field(default_factory=dict)
    #: sets drawn and compared on the device (Session.bench_drawn): per key, per set, {output: figures}, where
    #: `outputs` is then empty
    figures: dict[str, list[dict]] = field(default_factory=dict)
    #: with `figures`: per key, per set, {input: bytes the timed calls wrote into it} (against a fresh draw)
    mutated: dict[str, list[dict[str, int]]] = field(default_factory=dict)


class DeviceCheckUnavailable(RuntimeError):
    """device_check or bench_drawn asked of a session that cannot judge that check on its device; the message is
    device_check_unavailable's reason. The judge asks device_check_unavailable first and takes the host path."""


@dataclass
class DeviceChecked:
    """A verification call judged where the outputs are (Session.device_check): per run, the comparison figures
    of each output against the float64 reference (kfactory.targets.cuda.judge_kernels.merge's keys); per later
    run, how many elements of each output differ in value from the first run's (a NaN equals a NaN, -0 equals 0,
    as the host counts two runs: numerics.differing_elements); per input, the bytes in which it differs
    from a fresh draw of the same seed (what the kernel wrote into it); the tensors whose guard bands changed."""
    seconds: list[float]
    figures: list[dict[str, dict]]
    differ: list[dict[str, int]]
    mutated: dict[str, int]
    out_of_bounds: list[str]


class Session(ABC):
    """Runs kernels of one problem on one device, always in a runner process, never in the caller's."""

    @abstractmethod
    def load_artifact(self, key: str, artifact: bytes, entry: str, launch: dict | None = None) -> None:
        """Make kernel `key` callable. `launch` is the cuda launch rule ({"grid", "block", "smem"} expressions
        over the shape symbols and the rule's "params"); targets that need none ignore it."""

    @abstractmethod
    def load_baseline(self, key: str, name: str) -> None: ...

    def call(self, key: str, shape: dict[str, int], inputs: dict[str, np.ndarray]) -> CallResult:
        """Run once on fresh buffers with every output poisoned first."""
        return self.call_sequence(key, shape, [inputs])[0]

    @abstractmethod
    def call_sequence(self, key: str, shape: dict[str, int], steps: list[dict[str, np.ndarray]]) -> list[CallResult]:
        """Run once per step on the same buffers (fresh ones for the first step), the step's inputs written and
        outputs poisoned before each; this is how memoisation keyed by pointer or by sampled values is caught.
        Mutation is reported for the last step only."""

    @abstractmethod
    def bench(self, keys: list[str], shape: dict[str, int], input_sets: list[dict[str, np.ndarray]],
              *, min_samples: int, min_s: float, max_s: float, noise: float, warmup_s: float,
              precision: float = 0.0) -> BenchResult:
        """Time the kernels interleaved (A B A B ...) over a rotating pool of input sets, until the stop that
        protocol.Bench describes (`precision` 0: by noise alone)."""

    def unload(self, key: str) -> None:
        """Forget kernel `key` (a candidate this session is done with): its runner drops it, a later call needs
        load_artifact again. The default holds nothing to forget."""

    def ready_buffers(self, benches: list[tuple[dict[str, int], int, int]]) -> None:
        """Make the buffers the largest of `benches` (shape, kernels timed together, input sets each) takes now,
        before the device is held for them, as host work (the judge calls this beside the sets it draws ahead).
        The default has no buffers to make."""

    def device_check_unavailable(self, shape: dict[str, int], dist: str) -> str | None:
        """None when device_check can judge this shape and distribution; else why not (by default the target
        has no judge of its own and the host judges)."""
        return f"the {type(self).__name__} judges on the host"

    def device_check(self, key: str, shape: dict[str, int], dist: str, seed: int, runs: int = 2) -> DeviceChecked:
        """Inputs of `dist` drawn from `seed` where the kernel runs (kfactory.judge.counter_rng is the host twin
        of the draw), the float64 reference computed and each output compared there, `runs` runs on the same
        buffers; only where device_check_unavailable says None, else DeviceCheckUnavailable. By default a target
        has no judge of its own."""
        raise DeviceCheckUnavailable(self.device_check_unavailable(shape, dist) or "no device judge")

    def bench_drawn(self, keys: list[str], shape: dict[str, int], dist: str, seeds: list[int], *, min_samples: int,
                    min_s: float, max_s: float, noise: float, warmup_s: float, compare: bool = True,
                    precision: float = 0.0) -> BenchResult:
        """bench() on input sets drawn where the kernels run, one per seed (as device_check draws them), each
        set's outputs compared there with its float64 reference: the result's `figures`, not its outputs (with
        compare=False, as a screen needs, neither: no reference is computed); only where
        device_check_unavailable says None, else DeviceCheckUnavailable."""
        raise DeviceCheckUnavailable(self.device_check_unavailable(shape, dist) or "no device judge")

    def call_overhead_s(self) -> float:
        """Seconds a timed call costs when the kernel does nothing (0 where timing sees the kernel alone, as
        device events do)."""
        return 0.0

    @abstractmethod
    def close(self) -> None: ...


class Target(ABC):
    """A place kernels run: cpu, cuda, replay. Selected by name with kfactory.targets.get_target."""
    name: str = ""
    #: the source languages compile() takes (kfactory check refuses another as a usage error)
    languages: tuple[str, ...] = ()
    #: verification runs the kernel at full width too, so it must hold the device lease like timing does
    exclusive_verify: bool = True
    #: a short timing costs far less here than a verification, so the search's candidates are screened before they
    #: are verified (kfactory/judge/order.py); a replayed target answers both from a recording and keeps the old order
    screens_first: bool = True

    @abstractmethod
    def device(self) -> pb.DeviceInfo: ...

    @abstractmethod
    def compile(self, source: str, language: str, flags: str, entry: str) -> CompileResult: ...

    @abstractmethod
    def session(self, problem, threads: int) -> Session: ...

    def cache_bytes(self) -> int:
        """Bytes an input pool must exceed so that timed calls do not run from a warm cache."""
        return 64 << 20

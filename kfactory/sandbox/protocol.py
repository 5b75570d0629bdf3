"""The runner protocol: typed requests and replies between a runner parent (kfactory.sandbox.parent) and its child
(kfactory.sandbox.child, kfactory.targets.cuda.child), and the one set of fault kinds.

One request type per op, one Reply type, one FaultKind enum with its RejectReason. Messages cross the pipe as one
JSON line each, encoded and decoded here only (encode_request/decode_request, encode_reply/decode_reply). Parent
and child are always the same version, so the wire format may change with the code: nothing else reads it.

A fault is either the candidate's (FaultKind.is_candidate: it crashed, hung, faulted on the device, could not be
loaded, was refused a launch) and becomes a verdict, or the harness's (FaultKind.HARNESS: an exception in the
runner's own code, with its traceback) and is a service error, never a verdict.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypedDict

from kfactory.v1 import events_pb2 as pb


def shared_dir() -> str:
    """Where the parent makes the files that hold a request's buffers (kfactory.sandbox.shm): /dev/shm, else the
    temporary directory. The child sizes its address-space limit by this filesystem (child._limit)."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class FaultKind(str, Enum):
    """Why a request failed. Every kind but HARNESS is the candidate's own fault and has a RejectReason."""
    CRASHED = "crashed"              # the runner died (signal, exit), sent garbage, or the kernel raised
    TIMEOUT = "timeout"              # no answer within the wall-clock limit; the runner was killed
    LOAD_FAILED = "load_failed"      # the kernel could not be loaded or bound (missing symbol, bad object)
    DEVICE_FAULT = "device_fault"    # the kernel faulted on the device (illegal address, trap); runner ends
    LAUNCH_FAILED = "launch_failed"  # the launch rule gave an invalid configuration, or the driver refused it
    CUDA_ERROR = "cuda_error"        # another CUDA error while the kernel's work was in flight; runner ends
    HARNESS = "harness"              # the runner's own code failed: a bug or an environment error, not a verdict

    @property
    def is_candidate(self) -> bool:
        """True for a fault of the kernel under test (a verdict), False for the harness's own."""
        return self is not FaultKind.HARNESS

    @property
    def reason(self) -> int:
        """The rejection reason of a candidate fault; ValueError for HARNESS, which is never a verdict."""
        if self is FaultKind.HARNESS:
            raise ValueError("a harness fault is not the candidate's and has no rejection reason")
        return REJECT_REASONS[self]


#: the one mapping of candidate faults to rejection reasons (a load failure counts as a crash, as it always has)
REJECT_REASONS: dict[FaultKind, int] = {
    FaultKind.CRASHED: pb.CRASHED, FaultKind.TIMEOUT: pb.TIMEOUT, FaultKind.LOAD_FAILED: pb.CRASHED,
    FaultKind.DEVICE_FAULT: pb.DEVICE_FAULT, FaultKind.LAUNCH_FAILED: pb.LAUNCH_FAILED,
    FaultKind.CUDA_ERROR: pb.CRASHED,
}


@dataclass(frozen=True)
class Fault:
    """A failed request: its kind, a message, the CUresult `code` (cuda), whether the child is `exiting` (its
    context may be poisoned: the parent reaps it), and for HARNESS the child's `traceback`."""
    kind: FaultKind
    message: str
    code: int = 0
    exiting: bool = False
    traceback: str = ""


# -- argument descriptors (plain JSON objects: built by kfactory.sandbox.shm_args and kfactory.problems.params,
# read by the children): a TensorArg or a ScalarArg, typed as plain dicts at the boundary (Arg) ----------------

class TensorArg(TypedDict, total=False):
    """A tensor in a shared-memory file: `offset` bytes into `path`; `role` "in" or "out"."""
    name: str
    path: str
    offset: int
    dtype: str
    shape: list[int]
    role: str


class ScalarArg(TypedDict, total=False):
    """A scalar argument: a shape symbol or int parameter ("int"), or a float parameter ("float")."""
    name: str
    int: int
    float: float


#: one argument's descriptor: the fields of a TensorArg or of a ScalarArg
Arg = dict[str, Any]


class Step(TypedDict):
    """One more run of a call on the same buffers: where the previous outputs go, the inputs to copy in (TensorArg
    descriptors), and the poison to write into the outputs first (per tensor name)."""
    outputs: dict[str, Arg]
    inputs: dict[str, Arg]
    poison: dict[str, float]


# -- requests ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """Base of every request; `op` names it on the wire and the child's op_<op> serves it."""
    op: ClassVar[str] = ""


@dataclass(frozen=True)
class Ping(Request):
    """Is the child up (the cuda child also starts CUDA here)."""
    op: ClassVar[str] = "ping"


@dataclass(frozen=True)
class Exit(Request):
    """Ask the child to exit."""
    op: ClassVar[str] = "exit"


@dataclass(frozen=True)
class Load(Request):
    """Make kernel `key` callable. kind "so" (cpu: `path`, `entry`, `argtypes`), "cubin" (cuda: also
    `launch_rule`), or "baseline" (the problem's reference.py `module`, its baseline `name`, with `params`)."""
    op: ClassVar[str] = "load"
    key: str
    kind: str
    path: str = ""
    entry: str = ""
    argtypes: list[str] = field(default_factory=list)
    launch_rule: dict | None = None
    module: str = ""
    name: str = ""
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Call(Request):
    """Run kernel `key` once on `args`, then once per step on the same buffers. `shape` gives the launch rule its
    sizes (cuda); `keep` names the shared-memory arenas the child keeps mapped (None: leave them as they are)."""
    op: ClassVar[str] = "call"
    key: str
    args: list[Arg]
    steps: list[Step] = field(default_factory=list)
    shape: dict[str, int] = field(default_factory=dict)
    keep: list[str] | None = None


@dataclass(frozen=True)
class BenchKernel:
    """One kernel of a bench and its rotating argument sets."""
    key: str
    argsets: list[list[Arg]]


@dataclass(frozen=True)
class Bench(Request):
    """Interleaved timing (A B A B ...) of `kernels` until `max_s`, or `min_samples` and `min_s` with every
    kernel settled: its noise under `noise`, or (with `precision` > 0) its median known within that fraction
    (kfactory.sandbox.child.settled); warm-up first. `mode` (cuda): "events" or "graph". cuda: an argument set's
    tensors may be drawn and compared on the device as DeviceCheck's are ("draw" and "compare" descriptors, and
    `reference` as DeviceCheck.reference): then the reply's info holds {"figures": {key: [{output: figures}
    per set]}} instead of outputs copied back, or nothing with `reference["compare"]` False (a screen's sets)."""
    op: ClassVar[str] = "bench"
    kernels: list[BenchKernel]
    min_samples: int
    min_s: float
    max_s: float
    noise: float
    warmup_s: float
    precision: float = 0.0
    mode: str = "events"
    shape: dict[str, int] = field(default_factory=dict)
    keep: list[str] | None = None
    reference: dict | None = None

    def __post_init__(self):
        # decoded from JSON the kernels are dicts: make them BenchKernels (frozen, hence object.__setattr__)
        kernels = [k if isinstance(k, BenchKernel) else BenchKernel(**k) for k in self.kernels]
        object.__setattr__(self, "kernels", kernels)


@dataclass(frozen=True)
class DeviceQuery(Request):
    """The device's description (cuda): name, uuid, arch, cc, sm_count, l2_bytes, smem_optin, mem_bytes."""
    op: ClassVar[str] = "device"


@dataclass(frozen=True)
class Ceilings(Request):
    """Measure the device's ceilings (cuda): copy bandwidth over `copy_bytes`, fp32 peak for `arch`, bf16
    matmul peak at `matmul_n`."""
    op: ClassVar[str] = "ceilings"
    arch: str = ""
    copy_bytes: int = 2 << 30
    matmul_n: int = 8192


@dataclass(frozen=True)
class Unload(Request):
    """Forget kernel `key`, a candidate the parent is done with: a runner kept warm across candidates does not
    hold every module it ever loaded. cuda: the module is unloaded and the reply's info says what device memory
    the child still holds ({"live_bytes": its allocator's buffers besides its own scratch, "free_bytes": the
    driver's free memory}), which the parent checks for leaks; cpu: the kernel is dropped (its library stays
    mapped: a loaded shared object cannot be closed safely while ctypes may hold its symbols)."""
    op: ClassVar[str] = "unload"
    key: str


@dataclass(frozen=True)
class DeviceCheck(Request):
    """Verify kernel `key` where its outputs are (cuda): `args` in the ABI's order, but a tensor carries no
    shared-memory path: an input carries "draw" {"seed", "tensor", "kind", "a", "b", "neg_inf", "cols"} and is
    drawn in place by the judge's counter-based generator (kfactory.judge.counter_rng is its host twin), an output
    carries "compare" {"atol", "rtol"}. The problem's float64 reference kernel (`reference`: {"path" of its
    cubin, "launch" rule, "symbols", "params"}) runs on the drawn inputs; the kernel then runs `runs` times on
    the same buffers, outputs poisoned before each run and compared with the reference on the device.
    Reply.info: {"figures": [{output: figures} per run] (kfactory.targets.cuda.judge_kernels.merge's keys),
    "differ": [{output: elements differing in value from the first run's} per later run], "mutated": {input: bytes that
    differ from a fresh draw}}; out_of_bounds and seconds as a call's."""
    op: ClassVar[str] = "device_check"
    key: str
    args: list[Arg]
    reference: dict
    shape: dict[str, int] = field(default_factory=dict)
    runs: int = 2


REQUESTS: dict[str, type[Request]] = {r.op: r for r in (Ping, Exit, Load, Call, Bench, DeviceQuery, Ceilings,
                                                         DeviceCheck, Unload)}


# -- the reply --------------------------------------------------------------------------------------------

@dataclass
class Reply:
    """The answer to any request: `fault` is None when it succeeded; the other fields are those the op fills.

    call: seconds (per run), out_of_bounds (cuda: tensors whose guard band changed). bench: samples per key,
    reached (cpu: sets the calls reached), mode, launches_per_sample, flushed (cuda). ping: pid. device and
    ceilings: info. busy_s: the kernels' own run time (cpu); cpu_s and cpu_limit_s: the child's CPU time
    used and its limit (cuda, -1 = none), so the parent replaces it before the limit ends it."""
    fault: Fault | None = None
    pid: int = 0
    seconds: list[float] = field(default_factory=list)
    out_of_bounds: list[str] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    reached: dict[str, int] = field(default_factory=dict)
    mode: str = ""
    launches_per_sample: dict[str, int] = field(default_factory=dict)
    flushed: bool = False
    busy_s: float | None = None
    cpu_s: float = 0.0
    cpu_limit_s: float = -1.0
    info: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.fault is None


class ProtocolError(ValueError):
    """A line that is no message of this protocol (unknown op, missing or unknown fields, not JSON)."""


def encode_request(req: Request) -> bytes:
    """One JSON line for `req`."""
    return _line({"op": req.op, **_fields(req)})


def decode_request(line: bytes | str) -> Request:
    """The request a line holds; ProtocolError when it holds none."""
    obj = _parse(line)
    cls = REQUESTS.get(obj.pop("op", None))
    if cls is None:
        raise ProtocolError(f"no such op in {str(line)[:200]!r}")
    try:
        return cls(**obj)
    except TypeError as e:
        raise ProtocolError(f"malformed {cls.op} request: {e}") from e


def encode_reply(reply: Reply) -> bytes:
    """One JSON line for `reply` (the fault's kind as its value)."""
    return _line(_fields(reply))


def decode_reply(line: bytes | str) -> Reply:
    """The reply a line holds; ProtocolError when it holds none."""
    obj = _parse(line)
    fault = obj.pop("fault", None)
    try:
        if fault is not None:
            fault = Fault(**{**fault, "kind": FaultKind(fault.get("kind"))})
        return Reply(fault=fault, **obj)
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"malformed reply: {e}") from e


def _line(obj: dict) -> bytes:
    return (json.dumps(obj, default=_fields) + "\n").encode()


def _fields(obj: Any) -> dict:
    """A dataclass's fields by name, not copied (json.dumps calls this for each nested one: dataclasses.asdict
    deep-copied every list first, tenths of a second for a bench's thousands of argument sets)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _parse(line: bytes | str) -> dict:
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not JSON: {str(line)[:200]!r}") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"not a JSON object: {str(line)[:200]!r}")
    return obj

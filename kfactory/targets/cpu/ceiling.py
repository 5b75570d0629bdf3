"""Measured ceilings of a cpu host, measured once per device and thread count and cached on disk:

- mem_bandwidth_gbps: a copy-scale stream (cpu_stream.c), bytes read + written over time. What a kernel that
  writes as much as it reads (softmax, a norm) can reach; the kernels' GB/s are reported as a fraction of it.
- read_bandwidth_gbps: a vector sum (cpu_read.c), bytes read over time. A read stream needs no stores and no
  read-for-ownership of the lines stored, so it is the ceiling of what only reads: an LLM decode step's roofline
  uses it (kfactory.engines.baselines.roofline), the copy figure reported beside it.
- peak_gflops: FMA chains in registers (cpu_fma.c).
- peak_int8_gops: chains of int8 dot products in registers (cpu_int8.c: vpdpbusd, AVX512-VNNI or AVX-VNNI),
  each byte product counted 2 ops (multiply + add, as an FMA counts 2 flops); 0 on a host without such an
  instruction. The roofline of an engine whose decode takes its products in integers (`q4_decode: vnni`) sets
  that work against it, not against the fp32 peak.

The speed-of-light floor (kfactory.judge.measure.sol_floor_s) is bytes over a bandwidth, halved (SOL_SLACK), and
must never call an honest kernel too fast. Its bandwidth is weighted by the share of the problem's tensor bytes
that are written (kfactory.judge.measure.floor_bandwidth_gbps): the copy figure for a kernel that writes as much
as it reads, the read figure for one that only reads. Both probes read the runner's shared-memory buffers, as
every kernel does; on the project's loaded host a read stream measured up to 2.2x the copy stream at one thread,
past the floor's slack.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np

from kfactory.observability.log import get_logger
from kfactory.platform.fsutil import atomic_write
from kfactory.sandbox.parent import Runner, RunnerFault
from kfactory.sandbox.shm import ShmBuffers
from kfactory.sandbox.protocol import Arg, Bench, BenchKernel, Load

log = get_logger("ceiling")
HERE = Path(__file__).parent
ELEMENTS = 1 << 25  # 128 MB per array: far beyond any last-level cache
FMA_ITERS = 1 << 22
FMA_CHAINS = 8  # independent FMA chains per thread in cpu_fma.c (its lanes per chain it reports itself)
INT8_CHAINS = 12  # independent vpdpbusd chains per thread in cpu_int8.c (its products per instruction it reports)
#: what the cached figures were measured with: version 2's FMA probe keeps its chains in registers (version 1's
#: spilled on AVX2 hosts and reported a peak 10-20x low); version 3 added the read-only stream, version 4 reads it
#: as eight streams a thread (3's single stream read ~1.4x low), version 5 added the int8 dot-product peak.
#: Figures cached by an older version are measured again.
PROBES_VERSION = 5
#: a cached measurement taken at more than this load (the share of the cores busy just before it or just after
#: it, whichever is more: load_per_core) is measured again when a later start finds the host at under half that
#: load, and the best of both is kept: a probe beside other work reads low (5.1-5.7 GB/s read at a load average of
#: 7, three times the 2-core host's cores busy, against 14-15 GB/s with most of them idle), and a low bandwidth
#: raises the speed-of-light floor, which may then call an honest kernel too fast
BUSY_LOAD_PER_CORE = 0.5
#: how long load_per_core watches the cores (at 100 ticks a second, 50 ticks a core): paid only by a start that
#: measures, or that finds an entry measured busy (or with no load recorded)
LOAD_WINDOW_S = 0.5
PROC_STAT = "/proc/stat"
#: the probes' first inputs (the rest are ones): the FMA probe's chain seeds, multiplier and addend
X_HEAD = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.999999, 1e-6)
#: probe flags: the read and FMA probes are vectorised by hand as wide as the host's registers
NATIVE = "-O3 -march=native -fopenmp"


def probe_library(target, source: str = "cpu_read.c", flags: str = NATIVE) -> Path:
    """Probe `source` (the read probe by default) compiled by `target` into its cache directory: the shared
    library's path. Its entry is kernel(x, y, n) (n floats of x); the read probe's y[0] is the sum, y[1] the
    threads that ran, and it runs on the calling thread's OpenMP thread count. RuntimeError where it does not
    compile."""
    res = target.compile((HERE / source).read_text(), "c", flags, "kernel")
    if not res.ok:
        raise RuntimeError(f"probe {source} failed to compile: {res.log[-500:]}")
    # named by its bytes and written whole (atomic_write): a process may hold the library mapped (an engine
    # child runs the probe for a whole paired round), and a file rewritten in place under it crashes it
    so = target.cache_dir / f"{Path(source).stem}-{hashlib.sha256(res.artifact).hexdigest()[:16]}.so"
    if not so.exists():
        atomic_write(so, res.artifact)
    return so


class ProbeRunner:
    """One runner on `threads` OpenMP threads, with buffers for every probe (x of `elements` floats, ones after
    X_HEAD; y of `out_elements`, default as many), that runs probes one after another. A host's ceilings take four
    probes at each thread count; a child and fresh buffers (256 MiB for the streams) for each probe cost about 2 s
    of the 13 s they took. The probes only read x (the read probe's sum shows it is still ones)."""

    def __init__(self, target, threads: int, elements: int = ELEMENTS, out_elements: int | None = None):
        self.target = target
        self.elements, self.out_elements = elements, elements if out_elements is None else out_elements
        self.bufs = ShmBuffers()
        try:
            self.x_path, self.x_off, self.x = self.bufs.new((elements,), "float32")
            self.y_path, self.y_off, self.y = self.bufs.new((self.out_elements,), "float32")
            self.x[:] = 1.0
            head = min(len(X_HEAD), elements)
            self.x[:head] = X_HEAD[:head]
        except BaseException:
            self.bufs.close()
            raise
        self.runner = Runner(threads, timeout_s=60)   # its child starts at the first request

    def __enter__(self) -> "ProbeRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.runner.stop()
        finally:
            self.bufs.close()

    def run(self, source: str, flags: str, n: int, elements: int, out_elements: int | None = None
            ) -> tuple[float, np.ndarray]:
        """(median seconds, y[:3] after the last run) of probe `source` run as kernel(x, y, n) over the first
        `elements` floats of x and `out_elements` of y (default: as many)."""
        out_elements = elements if out_elements is None else out_elements
        if elements > self.elements or out_elements > self.out_elements:
            raise ValueError(f"probe {source} needs {elements} and {out_elements} floats; this runner has "
                             f"{self.elements} and {self.out_elements}")
        so = probe_library(self.target, source, flags)
        name = so.stem   # a child that died meanwhile is replaced, and the probe loaded into the new one
        self.runner.ensure_loaded(Load(name, "so", path=str(so), entry="kernel", argtypes=["ptr", "ptr", "i64"]))
        args: list[Arg] = [
            {"name": "x", "path": self.x_path, "offset": self.x_off, "dtype": "float32", "shape": [elements]},
            {"name": "y", "path": self.y_path, "offset": self.y_off, "dtype": "float32", "shape": [out_elements]},
            {"name": "n", "int": n}]
        self.y[:3] = np.nan   # what a probe reports is its own, never the last one's
        reply = self.runner.request(Bench([BenchKernel(name, [args])], min_samples=10, min_s=0.3, max_s=1.0,
                                          noise=0.02, warmup_s=0.05), timeout_s=60)
        return float(np.median(reply.samples[name])), np.array(self.y[:3])


def _run_probe(target, threads: int, source: str, flags: str, n: int, elements: int,
               out_elements: int | None = None, probes: ProbeRunner | None = None) -> tuple[float, np.ndarray]:
    """(median seconds, y after the last run) of probe `source` run as kernel(x, y, n) in a runner (`probes`', or
    one of its own); x holds `elements` floats, y `out_elements` (default: as many)."""
    if probes is not None:
        return probes.run(source, flags, n, elements, out_elements)
    with ProbeRunner(target, threads, elements, out_elements) as own:
        return own.run(source, flags, n, elements, out_elements)


def measure_bandwidth(target, threads: int, probes: ProbeRunner | None = None) -> float:
    """Read+write bandwidth in GB/s of a simple OpenMP copy-scale loop (median of its samples)."""
    med, _ = _run_probe(target, threads, "cpu_stream.c", "-O3 -fopenmp", ELEMENTS, ELEMENTS, probes=probes)
    return 2 * 4 * ELEMENTS / med / 1e9


def measure_read_bandwidth(target, threads: int, probes: ProbeRunner | None = None) -> float:
    """Read-only bandwidth in GB/s of a vector sum over ELEMENTS floats on `threads` threads (median of its
    samples): every byte counted is read once and nothing but the sum is written."""
    med, y = _run_probe(target, threads, "cpu_read.c", NATIVE, ELEMENTS, ELEMENTS, 16, probes=probes)
    # the sum shows every element was read (x is ones after X_HEAD; float32 sums of ones are exact this far)
    expected = ELEMENTS - len(X_HEAD) + sum(X_HEAD)
    if int(y[1]) != threads or abs(float(y[0]) - expected) > 1e-3 * expected:
        raise RuntimeError(f"read probe summed {float(y[0])} on {int(y[1])} threads; expected about {expected} "
                           f"on {threads}")
    return 4 * ELEMENTS / med / 1e9


def measure_peak_gflops(target, threads: int, probes: ProbeRunner | None = None) -> float:
    """fp32 GFLOP/s of independent FMA chains in vector registers on every thread."""
    med, y = _run_probe(target, threads, "cpu_fma.c", NATIVE, FMA_ITERS, 16, probes=probes)
    threads_ran, lanes = float(y[1]), float(y[2])
    return threads_ran * FMA_ITERS * FMA_CHAINS * lanes * 2 / med / 1e9  # multiply + add per lane


def measure_peak_int8_gops(target, threads: int, probes: ProbeRunner | None = None) -> float:
    """int8 GOP/s (a byte product and its add counted 2) of independent vpdpbusd chains in vector registers on
    every thread; 0.0 where the host has no int8 dot-product instruction."""
    med, y = _run_probe(target, threads, "cpu_int8.c", NATIVE, FMA_ITERS, 16, probes=probes)
    threads_ran, products = float(y[1]), float(y[2])
    return threads_ran * FMA_ITERS * INT8_CHAINS * products * 2 / med / 1e9


def _read(cache: Path) -> dict:
    try:
        return json.loads(cache.read_text()) if cache.exists() else {}
    except ValueError:
        return {}


def read_cached(data_dir, key: str, names: tuple[str, ...]) -> dict[str, float] | None:
    """The ceilings cached for a device in data_dir/ceilings.json, or None unless every name is there."""
    return _figures(_read(Path(data_dir) / "ceilings.json").get(key, {}), names)


def _figures(entry: dict, names: tuple[str, ...]) -> dict[str, float] | None:
    return {n: float(entry[n]) for n in names} if all(n in entry for n in names) else None


def write_cached(data_dir, key: str, figures: dict[str, float], **extra) -> None:
    """Add one device's ceilings to data_dir/ceilings.json atomically (re-read first: another process or
    target may have written its own figures meanwhile)."""
    cache = Path(data_dir) / "ceilings.json"
    data = _read(cache)
    data[key] = {**figures, **extra, "measured_at": time.time()}
    atomic_write(cache, json.dumps(data, indent=1).encode())


CPU_CEILINGS = ("mem_bandwidth_gbps", "read_bandwidth_gbps", "peak_gflops", "peak_int8_gops")


def cache_key(device_id: str) -> str:
    """The device's entry in ceilings.json: figures measured by older probes are not this version's."""
    return f"{device_id}#probes{PROBES_VERSION}"


def load_per_core(window_s: float = LOAD_WINDOW_S) -> float:
    """The share of this host's cores busy now: their busy time over `window_s`, from /proc/stat (user, nice,
    system, irq, softirq and steal: a virtual machine's stolen time is a neighbour's load, and reads as low as any).
    Not the 1-minute load average, a lagging mean: right after heavy work it still reads busy, so a measurement
    taken on a quiet host was recorded busy and taken again at the next start (12 s on the project's host), and
    right as heavy work begins it still reads quiet, so low figures were recorded as a quiet host's and kept.
    Where /proc/stat cannot be read (not Linux), or shows no ticks, the 1-minute load average a core."""
    try:
        before = _cpu_times()
        _sleep(window_s)
        return busy_share(before, _cpu_times())
    except (OSError, ValueError, IndexError):
        return _load_average()


def _sleep(seconds: float) -> None:
    """time.sleep, by a name of this module's own (a test replaces it, not the process's time.sleep)."""
    time.sleep(seconds)


def _load_average() -> float:
    """The 1-minute load average over the cores, at most 1 (every core busy), as busy_share reads."""
    return min(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _cpu_times() -> list[int]:
    """/proc/stat's aggregate cpu line: user nice system idle iowait irq softirq steal (in clock ticks)."""
    with open(PROC_STAT) as f:
        fields = f.readline().split()
    if fields[0] != "cpu":
        raise ValueError(f"{PROC_STAT} does not start with the aggregate cpu line")
    return [int(v) for v in fields[1:9]]


def busy_share(before: list[int], after: list[int]) -> float:
    """The share of the cores' ticks between two /proc/stat readings that were busy (idle and iowait are not), in
    [0, 1]; ValueError when no tick passed (no share to tell: "quiet" would be the unsafe guess). A counter that
    went back (iowait may: proc(5)) counts as no ticks of its own."""
    delta = [max(0, b - a) for a, b in zip(before, after)]
    total = sum(delta)
    if total <= 0:
        raise ValueError("no clock tick passed between the two readings of /proc/stat")
    return min(1.0, max(0.0, (total - delta[3] - delta[4]) / total))


def ceilings(target, device_id: str, threads: int, load: float | None = None) -> dict[str, float]:
    """{"mem_bandwidth_gbps" (copy), "read_bandwidth_gbps", "peak_gflops", "peak_int8_gops"} from the cache or
    measured now (0.0 where they cannot be). A cached entry measured on a busy host (BUSY_LOAD_PER_CORE) is
    measured again when the host is now much quieter, keeping the larger of each figure; so is one whose load was
    not recorded (cached before the load was kept), once, when the host is not busy now. A measurement is recorded
    with the busier of the loads just before and just after it (a quiet moment between bursts of other work is no
    quiet host). `load`: the share of the host's cores busy, for both readings (default: load_per_core() each
    time)."""
    key = cache_key(device_id)
    entry = _read(Path(target.settings.data_dir) / "ceilings.json").get(key, {})
    found, then = _figures(entry, CPU_CEILINGS), entry.get("load_per_core")
    if then is not None:
        then = min(float(then), 1.0)   # recorded as a load average before: over 1 a core, every core was busy
    if found is not None and then is not None and then <= BUSY_LOAD_PER_CORE:
        return found   # measured on a quiet host: no need to read the load now
    now = load_per_core() if load is None else load
    stale = now <= BUSY_LOAD_PER_CORE if then is None else then > BUSY_LOAD_PER_CORE and now < then / 2
    if found is not None and not stale:
        return found
    figures = _measure(target, device_id, threads)
    if figures is None:
        return found or dict.fromkeys(CPU_CEILINGS, 0.0)
    now = max(now, load_per_core() if load is None else load)
    if found is not None:
        log.info("measured the host's ceilings again: the cached ones were measured with "
                 f"{'an unrecorded share' if then is None else f'{then:.2f}'} of the cores busy, now {now:.2f}",
                 device=device_id)
        figures = {k: max(v, found[k]) for k, v in figures.items()}
        now = now if then is None else min(now, then)
    write_cached(target.settings.data_dir, key, figures, threads=threads, load_per_core=round(now, 3))
    log.info("measured host ceilings", device=device_id, **{k: round(v, 1) for k, v in figures.items()})
    return figures


def _measure(target, device_id: str, threads: int) -> dict[str, float] | None:
    """The probes' figures at 1 and `threads` threads (the best of both: on some hosts, shared cores and VMs, one
    thread streams faster), or None when they cannot run. One ProbeRunner per thread count runs its four probes."""
    measured: list[dict[str, float]] = []
    try:
        for t in sorted({1, threads}):
            with ProbeRunner(target, t) as probes:
                figures = {"mem_bandwidth_gbps": measure_bandwidth(target, t, probes),
                           "read_bandwidth_gbps": measure_read_bandwidth(target, t, probes),
                           "peak_gflops": measure_peak_gflops(target, t, probes)}
                try:
                    figures["peak_int8_gops"] = measure_peak_int8_gops(target, t, probes)
                except (RunnerFault, RuntimeError, OSError) as e:
                    # only integer kernels' rooflines need it; a compiler without the intrinsics must not cost the
                    # rest (it runs last: a probe that killed the runner leaves nothing else of this count to run)
                    log.warning(f"could not measure the host's int8 peak on {t} thread(s); without a figure at "
                                "any count, integer designs' rooflines have no compute side", error=str(e),
                                device=device_id)
                    figures["peak_int8_gops"] = 0.0
            measured.append(figures)
    except (RunnerFault, RuntimeError, OSError) as e:
        log.warning("could not measure the host's ceilings; floors and roofline fractions will be 0", error=str(e),
                    device=device_id)
        return None
    return {k: max(f[k] for f in measured) for k in CPU_CEILINGS}

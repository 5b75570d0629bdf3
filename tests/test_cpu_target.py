"""The cpu target and the judge: compile typed, run in a runner, faults typed, checks with figures."""
from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys

import numpy as np
import pytest

from conftest import kernel_source
from kfactory.engines.build import build as engine_build
from kfactory.judge.checks import InputPool
from kfactory.judge.measure import measure
from kfactory.judge.verify import verify
from kfactory.problems import load_problem
from kfactory.sandbox.parent import RunnerCrashed, RunnerTimeout
from kfactory.targets import UnknownTarget, get_target
from kfactory.targets.base import CompilerInterrupted
from kfactory.targets.cpu.target import _llc_bytes, cpu_identity
from kfactory.v1 import events_pb2 as pb


@pytest.fixture
def target(settings):
    return get_target("cpu", settings)


@pytest.fixture
def problem(small_softmax):
    return load_problem(small_softmax)


@pytest.fixture
def session(target, problem):
    s = target.session(problem, 2)
    yield s
    s.close()


def _load(target, session, key: str, source: str, flags: str = "-O2 -fopenmp"):
    res = target.compile(source, "c", flags, "kernel")
    assert res.ok, res.log
    session.load_artifact(key, res.artifact, "kernel")
    return res


def test_unknown_target_is_refused(settings):
    with pytest.raises(UnknownTarget, match="known targets: cpu"):
        get_target("tpu", settings)


def test_compile_error_is_typed_with_the_log(target):
    res = target.compile("void kernel( {", "c", "-O2", "kernel")
    assert not res.ok and res.reason == pb.COMPILE_ERROR
    assert "error" in res.log and res.report.compiler.startswith(target.settings.cc)


@pytest.mark.parametrize("signal_name, interrupted", [("INT", True), ("TERM", True), ("SEGV", False)])
def test_a_compiler_stopped_from_outside_is_no_verdict(settings, tmp_path, monkeypatch, signal_name, interrupted):
    """A compiler a Ctrl-C or a shutdown stopped (its whole process group gets the signal) raises
    CompilerInterrupted, so the compiler service's message is retried instead of answered with a compile error
    of the candidate; a compiler that crashed by itself is still a typed compile failure. The engine build too."""
    # a Python compiler that kills itself with the default action: sh's `kill -INT $$` was flaky, since dash
    # catches SIGINT in a script and may reach its end, exiting 0, before it acts on it (CI at 9fab2c1's clone)
    cc = tmp_path / "cc"
    cc.write_text(f"#!{sys.executable}\nimport os, resource, signal\n"
                  "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"   # SEGV: no core file
                  f"signal.signal(signal.SIG{signal_name}, signal.SIG_DFL)\n"
                  f"os.kill(os.getpid(), signal.SIG{signal_name})\n")
    cc.chmod(0o755)
    stopped = get_target("cpu", settings.model_copy(update={"cc": str(cc)}))
    if interrupted:
        with pytest.raises(CompilerInterrupted, match=f"stopped by SIG{signal_name}"):
            stopped.compile("void kernel(void) {}", "c", "-O2", "kernel")
        monkeypatch.setenv("CC", str(cc))
        with pytest.raises(CompilerInterrupted):
            engine_build("int kf_x(void) { return 1; }\n", tmp_path / "engines")
    else:
        res = stopped.compile("void kernel(void) {}", "c", "-O2", "kernel")
        assert not res.ok and res.reason == pb.COMPILE_ERROR and "exited with -11" in res.message


def test_unresolved_symbol_fails_at_compile_time(target):
    res = target.compile("void missing(void); void kernel(void){ missing(); }", "c", "-O2", "kernel")
    assert not res.ok and res.reason == pb.COMPILE_ERROR


@pytest.mark.parametrize("language, source, said", [
    ("c", "void kernal(float *x) {}", "has no function 'kernel' (it has: 'kernal')"),
    ("cpp", "void kernel(float *x) {}", "only the C++-mangled '_Z6kernelPf': declare the kernel extern \"C\""),
    ("c", "", "has no function 'kernel' (it has: none)"),
    ("c", "static void kernel(float *x) {}\nvoid other(void) { kernel(0); }", "(it has: 'other')"),
])
def test_a_missing_entry_is_a_compile_error_that_says_what_to_fix(target, language, source, said):
    """A misspelt entry, a C++ one without extern "C", an empty file, a static one: each compiles and links, and
    was a runner crash at load ("cannot load 'kernel'") before the shared object's symbols were read."""
    res = target.compile(source, language, "-O2", "kernel")
    assert not res.ok and res.reason == pb.COMPILE_ERROR
    assert said in res.message and res.message.startswith("the shared object has no function 'kernel'")
    ok = target.compile('extern "C" void kernel(float *x) {}', "cpp", "-O2", "kernel")
    assert ok.ok, ok.message


def test_an_entry_defined_weak_indirect_or_versioned_is_found(target, tmp_path):
    """nm -D types an inline C++ function W and an ifunc i, and names a version script's symbol kernel@@V1: each
    is a function dlsym finds under its name."""
    from kfactory.targets.cpu.target import _dynamic_symbols

    weak = target.compile("__attribute__((weak)) void kernel(float *x) {}", "c", "-O2", "kernel")
    ifunc = target.compile("static void impl(float *x) {}\nstatic void (*pick(void))(float *) { return impl; }\n"
                           "void kernel(float *x) __attribute__((ifunc(\"pick\")));", "c", "-O2", "kernel")
    assert weak.ok and ifunc.ok, (weak.message, ifunc.message)
    (tmp_path / "k.c").write_text("void kernel(float *x) {}\n")
    (tmp_path / "v.map").write_text("V1 { global: kernel; local: *; };\n")
    subprocess.run([target.settings.cc, "-shared", "-fPIC", "-o", str(tmp_path / "k.so"), str(tmp_path / "k.c"),
                    f"-Wl,--version-script={tmp_path / 'v.map'}"], check=True)
    assert "kernel" in _dynamic_symbols(tmp_path / "k.so")[1]


def test_nm_missing_or_failing_is_the_harness_s_error_not_the_kernel_s(target, tmp_path, monkeypatch):
    """A kernel is never refused for 'no function kernel' because nm could not tell."""
    from kfactory.sandbox.parent import HarnessError
    from kfactory.targets.cpu.target import _dynamic_symbols

    (tmp_path / "junk.so").write_text("not an object")
    with pytest.raises(HarnessError, match="nm could not read the compiled kernel junk.so: "):
        _dynamic_symbols(tmp_path / "junk.so")
    # nm stopped by a Ctrl-C (it is in the compiler's process group): no verdict, the work is retried (it was
    # dead-lettered as the harness's failure: CI at 3f02b37's clone)
    (tmp_path / "bin").mkdir()
    stopped = tmp_path / "bin" / "nm"
    stopped.write_text(f"#!{sys.executable}\nimport os, signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
                       "os.kill(os.getpid(), signal.SIGINT)\n")
    stopped.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(CompilerInterrupted, match="nm was stopped by SIGINT"):
        _dynamic_symbols(tmp_path / "junk.so")
    stopped.unlink()
    with pytest.raises(HarnessError, match=r"nm \(binutils\) is needed"):
        _dynamic_symbols(tmp_path / "junk.so")


def test_report_lists_imported_symbols(target, problem):
    source, flags = problem.reference_source("cpu")
    res = target.compile(source, "c", flags, "kernel")
    assert res.ok and res.report.artifact_bytes > 0
    assert any(s.startswith("expf") for s in res.report.imports)
    assert any(s.startswith("GOMP_parallel") for s in res.report.imports)


def test_reference_kernel_passes_every_check(target, session, problem):
    _load(target, session, "ref", *problem.reference_source("cpu"))
    v = verify(session, "ref", problem, InputPool(problem, 1))
    assert v.passed, v.message
    # every shape x distribution, then the three calls of the memoisation probe
    assert len(v.checks) == len(problem.shapes("all")) * len(problem.spec.distributions) + 3
    assert all(c.passed and c.max_abs_err < 1e-6 and c.seed for c in v.checks)
    assert {c.distribution for c in v.checks} == set(problem.spec.distributions) | {
        "memo:first", "memo:same-buffers", "memo:near-duplicate"}


def test_an_unloaded_kernel_is_dropped_by_the_runner_and_loads_again(target, session, problem):
    """A candidate done with is unloaded: the same warm runner drops it (the child answers), forgets it, and a
    later load of the same key runs again in that runner."""
    _load(target, session, "ref", *problem.reference_source("cpu"))
    shape = {"rows": 3, "cols": 1000}
    x = {"x": np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)}
    first = session.call("ref", shape, x).outputs["y"].copy()
    pid = session.runner.proc.pid
    session.unload("ref")
    assert "ref" not in session.runner.loaded and "ref" not in session.loads
    with pytest.raises(KeyError):
        session.call("ref", shape, x)
    _load(target, session, "ref", *problem.reference_source("cpu"))
    assert np.array_equal(session.call("ref", shape, x).outputs["y"], first) and session.runner.proc.pid == pid


@pytest.mark.parametrize("name,reason", [("segfault", pb.CRASHED), ("hang", pb.TIMEOUT),
                                         ("wrong", pb.WRONG_RESULT), ("partial", pb.WRONG_RESULT),
                                         ("mutates_input", pb.INPUT_MUTATED)])
def test_broken_kernels_get_typed_reasons(target, session, problem, name, reason):
    _load(target, session, name, kernel_source(name))
    v = verify(session, name, problem, InputPool(problem, 1))
    assert not v.passed
    assert v.reason == reason, (pb.RejectReason.Name(v.reason), v.message)


def test_runner_is_replaced_after_a_crash(target, session, problem):
    _load(target, session, "segv", kernel_source("segfault"))
    _load(target, session, "ref", *problem.reference_source("cpu"))
    shape = problem.shapes("optimize")[0]
    x = {"x": np.ones((shape["rows"], shape["cols"]), np.float32)}
    with pytest.raises(RunnerCrashed, match="SIGSEGV"):
        session.call("segv", shape, x)
    out = session.call("ref", shape, x).outputs["y"]
    np.testing.assert_allclose(out, 1.0 / shape["cols"], rtol=1e-5)
    assert session.runner.restarts >= 1


def test_hang_is_killed_within_the_limit(target, session, problem):
    import time

    _load(target, session, "hang", kernel_source("hang"))
    shape = problem.shapes("optimize")[0]
    t0 = time.monotonic()
    with pytest.raises(RunnerTimeout):
        session.call("hang", shape, {"x": np.ones((shape["rows"], shape["cols"]), np.float32)})
    assert time.monotonic() - t0 < target.settings.runner_timeout_s + 5


def test_measure_interleaves_and_checks_timed_outputs(target, session, problem, settings):
    _load(target, session, "ref", *problem.reference_source("cpu"))
    session.load_baseline("numpy", "numpy")
    shape = problem.shapes("optimize")[0]
    res = measure(session, ["ref", "numpy"], problem, shape, InputPool(problem, 1), 1 << 20, settings)
    assert not res.reason, res.message
    for t in res.timings.values():
        assert t.samples >= settings.measure_min_samples and t.output_checked
        assert t.q1_s <= t.median_s <= t.q3_s and t.ci_low_s <= t.median_s <= t.ci_high_s
    # interleaved A B A B: both kernels got the same number of samples
    assert res.timings["ref"].samples == res.timings["numpy"].samples


def test_wrong_timed_output_is_caught(target, session, problem, settings):
    _load(target, session, "wrong", kernel_source("wrong"))
    res = measure(session, ["wrong"], problem, problem.shapes("optimize")[0], InputPool(problem, 1), 1 << 20,
                  settings)
    assert res.reason == pb.WRONG_RESULT


def test_floor_does_not_call_an_honest_read_stream_too_fast(small_softmax):
    """A decode step's attention reads its KV cache and writes one vector per head. On this host, one thread,
    load average 7, the probes measured copy 2.61 GB/s and read 5.73 GB/s back to back (the read stream 2.2x the
    copy): a kernel streaming the cache at the read figure takes less than the floor the copy figure alone sets
    (bytes / 2.61 GB/s / SOL_SLACK), so it would be rejected as too fast. The floor's bandwidth is weighted by the
    bytes written (kfactory.judge.measure.floor_bandwidth_gbps): almost the read figure here, exactly the copy
    figure for softmax (as many bytes written as read), and the copy figure where no read figure is known."""
    from kfactory.judge.measure import SOL_SLACK, floor_bandwidth_gbps, sol_floor_s
    attention = load_problem("decode_attention_gqa")
    shape = {"H": 9, "KV": 3, "ctx": 1024, "D": 64}
    nbytes, flops = attention.cost(shape)
    copy, read, peak = 2.61, 5.73, 72.6
    honest_s = nbytes / (read * 1e9)
    assert nbytes / (copy * 1e9) / SOL_SLACK > honest_s > flops / (peak * 1e9)   # memory bound; copy floor flags it
    dev = pb.DeviceInfo(mem_bandwidth_gbps=copy, read_bandwidth_gbps=read, peak_gflops=peak)
    # 2304 of 1,577,472 tensor bytes are written: the floor is within 0.4% of the read figure's
    assert sol_floor_s(attention, shape, dev) == pytest.approx(honest_s / SOL_SLACK, rel=4e-3)
    assert sol_floor_s(attention, shape, dev) < honest_s
    no_read = pb.DeviceInfo(mem_bandwidth_gbps=copy, peak_gflops=peak)
    assert sol_floor_s(attention, shape, no_read) == pytest.approx(nbytes / (copy * 1e9) / SOL_SLACK)
    softmax = load_problem(small_softmax)
    for s in softmax.shapes("all"):
        assert floor_bandwidth_gbps(softmax, s, dev) == pytest.approx(copy)
    # a read figure measured below the copy figure never raises a floor
    low_read = pb.DeviceInfo(mem_bandwidth_gbps=copy, read_bandwidth_gbps=copy / 3, peak_gflops=peak)
    assert floor_bandwidth_gbps(attention, shape, low_read) == copy


def test_read_dominated_reference_passes_the_floor_with_its_fraction_of_the_weighted_bandwidth(target, settings):
    """The honest reference of a problem that only reads (decode_attention_gqa) is timed against this host's
    measured ceilings: it is not too fast, and its fraction of speed of light is its GB/s over the floor's
    bandwidth (between the copy and the read figures, nearly the read one), not over the copy figure."""
    from kfactory.judge.measure import floor_bandwidth_gbps
    attention = load_problem("decode_attention_gqa")
    shape = {"H": 9, "KV": 3, "ctx": 1024, "D": 64}
    dev = target.device()
    session = target.session(attention, 1)
    try:
        _load(target, session, "ref", *attention.reference_source("cpu"))
        res = measure(session, ["ref"], attention, shape, InputPool(attention, 1), target.cache_bytes(), settings,
                      device=dev)
    finally:
        session.close()
    assert not res.reason, res.message
    t = res.timings["ref"]
    bandwidth = floor_bandwidth_gbps(attention, shape, dev)
    assert dev.mem_bandwidth_gbps <= bandwidth <= max(dev.mem_bandwidth_gbps, dev.read_bandwidth_gbps)
    assert t.gbps > 0 and t.sol_fraction == pytest.approx(t.gbps / bandwidth)


def test_cache_bytes_follows_the_setting_else_the_host(settings):
    """The timing sets are sized by twice the last-level cache: cpu_cache_mb where set (the tests set 32), the
    size /sys reports where it is 0."""
    assert get_target("cpu", settings.model_copy(update={"cpu_cache_mb": 32})).cache_bytes() == 64 << 20
    assert get_target("cpu", settings.model_copy(update={"cpu_cache_mb": 5})).cache_bytes() == 10 << 20
    detected = get_target("cpu", settings.model_copy(update={"cpu_cache_mb": 0})).cache_bytes()
    assert detected == 2 * _llc_bytes() and detected >= 2 << 20


def test_device_reports_a_measured_bandwidth_cached_per_host(settings):
    import json

    target = get_target("cpu", settings)
    dev = target.device()
    assert 0.5 < dev.mem_bandwidth_gbps < 2000
    from kfactory.targets.cpu.ceiling import cache_key
    cache = json.loads((settings.data_dir / "ceilings.json").read_text())
    assert cache[cache_key(f"{dev.device_id}/{dev.threads}")]["mem_bandwidth_gbps"] == dev.mem_bandwidth_gbps
    assert get_target("cpu", settings).device().mem_bandwidth_gbps == dev.mem_bandwidth_gbps
    # the read-only stream is a device fact too, cached beside the copy figure
    assert 0.5 < dev.read_bandwidth_gbps < 2000
    assert cache[cache_key(f"{dev.device_id}/{dev.threads}")]["read_bandwidth_gbps"] == dev.read_bandwidth_gbps
    # and the int8 peak, measured where the host has the instruction
    assert cache[cache_key(f"{dev.device_id}/{dev.threads}")]["peak_int8_gops"] == dev.peak_int8_gops
    assert (dev.peak_int8_gops > dev.peak_gflops) if has_int8_dot() else dev.peak_int8_gops == 0


def test_read_probe_reads_at_least_what_the_copy_probe_moves(settings):
    """A read stream is no slower than a copy stream (bytes read + written): read >= 0.8 x copy, the 0.8 for the
    noise of a shared host. Both at one thread (a neighbour on the other core slows one thread least),
    alternated three times and the best of each taken, so a burst of load hits both alike."""
    from kfactory.targets.cpu.ceiling import measure_bandwidth, measure_read_bandwidth
    target = get_target("cpu", settings)
    copy, read = [], []
    for _ in range(3):
        copy.append(measure_bandwidth(target, 1))
        read.append(measure_read_bandwidth(target, 1))
    assert max(read) >= 0.8 * max(copy), (read, copy)


def test_one_runner_child_runs_every_probe_of_a_thread_count(settings):
    """The host's ceilings take four probes at each thread count: one ProbeRunner runs them all in one child and
    one pair of buffers (a child and fresh buffers for each probe cost about 2 s of the 13 s they took). The
    copy probe before the read probe leaves x as the read probe's sum expects it (it raises otherwise)."""
    from kfactory.targets.cpu import ceiling
    target = get_target("cpu", settings)
    with ceiling.ProbeRunner(target, 1) as probes:
        figures = [ceiling.measure_bandwidth(target, 1, probes)]
        pid = probes.runner.proc.pid
        figures += [ceiling.measure_read_bandwidth(target, 1, probes), ceiling.measure_peak_gflops(target, 1, probes),
                    ceiling.measure_peak_int8_gops(target, 1, probes)]
        assert probes.runner.proc.pid == pid and probes.runner.restarts == 0
        with pytest.raises(ValueError, match="needs"):
            probes.run("cpu_read.c", ceiling.NATIVE, 1, ceiling.ELEMENTS + 1)
    assert all(f > 0 for f in figures[:3]) and (figures[3] > 0) == has_int8_dot()
    assert probes.runner.proc is None and not probes.bufs.dir.exists()   # stopped and freed with the ProbeRunner


def test_a_probe_runner_whose_child_died_loads_its_probe_into_the_next(settings):
    """The runner replaces a child that died between two probes; the probe is loaded into the new one (a Bench of
    a key the new child never loaded was a harness error), and what it reports is its own run's."""
    from kfactory.targets.cpu import ceiling
    with ceiling.ProbeRunner(get_target("cpu", settings), 1, elements=16) as probes:
        first, _ = probes.run("cpu_fma.c", ceiling.NATIVE, 1000, 16)
        os.kill(probes.runner.proc.pid, signal.SIGKILL)
        probes.runner.proc.wait()
        again, y = probes.run("cpu_fma.c", ceiling.NATIVE, 1000, 16)
    assert first > 0 and again > 0 and float(y[1]) == 1   # threads the probe ran: this run's, not NaN


def has_int8_dot() -> bool:
    """Whether this host has an int8 dot-product instruction the int8 probe times (AVX512-VNNI or AVX-VNNI)."""
    from kfactory.targets.cpu.cpuinfo import host_has
    return (host_has("avx512_vnni") and host_has("avx512f")) or host_has("avx_vnni")


def measured_here(figures: dict) -> dict:
    """The ceilings this host can measure: the int8 peak only where it has the instruction (0 elsewhere)."""
    return {k: v for k, v in figures.items() if k != "peak_int8_gops" or has_int8_dot()}


@pytest.mark.skipif(not has_int8_dot(), reason="the host has no int8 dot-product instruction (AVX512-VNNI, AVX-VNNI)")
def test_int8_probe_times_dot_products_faster_than_fp32_fmas(settings):
    """The int8 peak (vpdpbusd chains, a byte product and its add counted 2) is a real rate: above the fp32 FMA
    peak (each instruction does 4 byte products a 32-bit lane where an FMA does one; 4x on a Zen 4 core, 2x
    where the FMA has two ports and vpdpbusd one) and below 16x it."""
    from kfactory.targets.cpu.ceiling import measure_peak_gflops, measure_peak_int8_gops
    target = get_target("cpu", settings)
    fp32, int8 = measure_peak_gflops(target, 1), measure_peak_int8_gops(target, 1)
    assert 1.2 * fp32 < int8 < 16 * fp32, (fp32, int8)


def test_int8_probe_reports_no_products_without_the_instruction(settings):
    """Built for a processor without an int8 dot-product instruction (x86-64-v3: AVX2, no VNNI) the probe runs,
    says it did no products, and its peak is 0, not a figure made up from another instruction."""
    from kfactory.targets.cpu.ceiling import _run_probe
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64-v3 is an x86 processor level")
    _, y = _run_probe(get_target("cpu", settings), 1, "cpu_int8.c", "-O3 -march=x86-64-v3 -fopenmp", 1000, 16)
    assert float(y[1]) == 1 and float(y[2]) == 0


def test_ceilings_of_an_older_probe_version_are_measured_again(tmp_path):
    """An entry cached by an older PROBES_VERSION is not this version's: its figures are never read (even when
    it names every ceiling), the device is measured again and its figures cached under the new key."""
    import json

    from kfactory.platform.config import Settings
    from kfactory.targets.cpu.ceiling import CPU_CEILINGS, PROBES_VERSION, cache_key, ceilings
    assert cache_key("host/1") == f"host/1#probes{PROBES_VERSION}"
    old_key = f"host/1#probes{PROBES_VERSION - 1}"
    stale = dict.fromkeys(CPU_CEILINGS, 1e6)
    (tmp_path / "ceilings.json").write_text(json.dumps({old_key: stale}))
    got = ceilings(get_target("cpu", Settings(data_dir=tmp_path, threads=1)), "host/1", 1)
    assert set(got) == set(CPU_CEILINGS) and all(0 < v < 1e5 for v in measured_here(got).values()), got
    cache = json.loads((tmp_path / "ceilings.json").read_text())
    assert cache[old_key] == stale and {k: cache[cache_key("host/1")][k] for k in CPU_CEILINGS} == got


def test_ceilings_measured_on_a_busy_host_are_measured_again_when_it_is_quiet(tmp_path):
    """A cached entry measured at more than BUSY_LOAD_PER_CORE is probed again when a later start finds the host
    at under half that load, and the larger of each figure is kept (a low figure would raise the floor); one
    measured on a quiet host, or a host no quieter now, is read as it is."""
    import json

    from kfactory.platform.config import Settings
    from kfactory.targets.cpu.ceiling import BUSY_LOAD_PER_CORE, CPU_CEILINGS, cache_key, ceilings
    target = get_target("cpu", Settings(data_dir=tmp_path, threads=1))
    key, busy = cache_key("host/1"), 4 * BUSY_LOAD_PER_CORE

    def cached(value: float, load: float) -> None:
        entry = {**dict.fromkeys(CPU_CEILINGS, value), "load_per_core": load}
        (tmp_path / "ceilings.json").write_text(json.dumps({key: entry}))

    def entry() -> dict:
        return json.loads((tmp_path / "ceilings.json").read_text())[key]

    cached(1e-3, 0.1)                                          # quiet then: read as it is
    assert ceilings(target, "host/1", 1, load=0.0) == dict.fromkeys(CPU_CEILINGS, 1e-3)
    cached(1e-3, busy)                                         # busy then, as busy now: read as it is
    assert ceilings(target, "host/1", 1, load=busy * 0.9) == dict.fromkeys(CPU_CEILINGS, 1e-3)
    got = ceilings(target, "host/1", 1, load=0.1)              # busy then, quiet now: probed again
    assert all(v > 1e-3 for v in measured_here(got).values()), got
    assert {k: entry()[k] for k in CPU_CEILINGS} == got and entry()["load_per_core"] == 0.1
    cached(1e6, busy)                                          # a higher cached figure is kept
    assert ceilings(target, "host/1", 1, load=0.1) == dict.fromkeys(CPU_CEILINGS, 1e6)
    # no load recorded (an entry cached before it was kept): read as it is on a busy host, probed again once
    # on a quiet one, after which the entry carries its load and is read as it is
    (tmp_path / "ceilings.json").write_text(json.dumps({key: dict.fromkeys(CPU_CEILINGS, 1e-3)}))
    assert ceilings(target, "host/1", 1, load=busy) == dict.fromkeys(CPU_CEILINGS, 1e-3)
    got = ceilings(target, "host/1", 1, load=0.1)
    assert all(v > 1e-3 for v in measured_here(got).values()) and entry()["load_per_core"] == 0.1, got
    assert ceilings(target, "host/1", 1, load=0.1) == got


def test_the_load_is_the_share_of_the_cores_busy_now_and_a_quiet_entry_does_not_look(tmp_path, monkeypatch):
    """load_per_core reads /proc/stat's busy ticks over a moment, not the lagging 1-minute mean (a fake /proc/stat
    here, written again while it waits: the host's own is shared with every other test); a cached entry measured
    on a quiet host is read without looking at the cores at all (most starts pay nothing)."""
    import json

    from kfactory.platform.config import Settings
    from kfactory.targets.cpu import ceiling
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (guest guest_nice): idle and iowait are not busy, steal is
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    monkeypatch.setattr(ceiling, "PROC_STAT", str(stat))
    then = ["cpu  200 0 100 900 100 0 0 50 0 0\n"]
    monkeypatch.setattr(ceiling, "_sleep", lambda _s: stat.write_text(then[0]))
    assert ceiling.load_per_core() == pytest.approx(200 / 350)
    stat.write_text("cpu  100 0 50 800 90 0 0 0 0 0\n")
    then[0] = "cpu  150 0 50 850 80 0 0 0 0 0\n"   # iowait went back (proc(5) allows it): no ticks of its own
    assert ceiling.load_per_core() == 0.5
    stat.write_text(then[0])   # no tick passed: no share to tell, the load average instead
    monkeypatch.setattr(ceiling, "_load_average", lambda: 0.75)
    assert ceiling.load_per_core() == 0.75
    monkeypatch.setattr(ceiling, "PROC_STAT", str(tmp_path / "none"))   # no /proc/stat (not Linux): the same
    assert ceiling.load_per_core() == 0.75

    def looked(*_args):
        raise AssertionError("looked at the cores for an entry measured on a quiet host")
    monkeypatch.setattr(ceiling, "load_per_core", looked)
    key = ceiling.cache_key("host/1")
    quiet = {**dict.fromkeys(ceiling.CPU_CEILINGS, 7.0), "load_per_core": ceiling.BUSY_LOAD_PER_CORE}
    (tmp_path / "ceilings.json").write_text(json.dumps({key: quiet}))
    target = get_target("cpu", Settings(data_dir=tmp_path, threads=1))
    assert ceiling.ceilings(target, "host/1", 1) == dict.fromkeys(ceiling.CPU_CEILINGS, 7.0)


def test_a_measurement_is_recorded_with_the_busier_of_the_loads_before_and_after_it(tmp_path, monkeypatch):
    """Found by a review: a quiet moment read before the probes, between bursts of other work, recorded 12 s of
    probes beside that work as a quiet host's, never measured again. The load after the probes counts too; an
    entry recorded as a load average over 1 reads as every core busy."""
    import json

    from kfactory.platform.config import Settings
    from kfactory.targets.cpu import ceiling
    loads = iter([0.1, 0.9])   # before, after
    monkeypatch.setattr(ceiling, "load_per_core", lambda: next(loads))
    monkeypatch.setattr(ceiling, "_measure", lambda *_a: dict.fromkeys(ceiling.CPU_CEILINGS, 3.0))
    target = get_target("cpu", Settings(data_dir=tmp_path, threads=1))
    assert ceiling.ceilings(target, "host/1", 1) == dict.fromkeys(ceiling.CPU_CEILINGS, 3.0)
    entry = json.loads((tmp_path / "ceilings.json").read_text())[ceiling.cache_key("host/1")]
    assert entry["load_per_core"] == 0.9
    # an older entry's load average of 3 a core: busy, so a host with 60% of its cores busy is no quieter
    entry["load_per_core"] = 3.0
    (tmp_path / "ceilings.json").write_text(json.dumps({ceiling.cache_key("host/1"): entry}))
    monkeypatch.setattr(ceiling, "load_per_core", lambda: 0.6)
    monkeypatch.setattr(ceiling, "_measure", lambda *_a: pytest.fail("measured again though no quieter"))
    assert ceiling.ceilings(target, "host/1", 1) == dict.fromkeys(ceiling.CPU_CEILINGS, 3.0)


@pytest.mark.parametrize("source,needle", [
    ("#include <stdio.h>\nvoid kernel(void){}\n", "line 1: header <stdio.h> is not allowed"),
    ("#include <stdint.h>\nvoid kernel(void){\n  __asm__(\"nop\");\n}\n", "line 3: inline assembly"),
    ("#include <stdint.h>\nint pthread_create();\nvoid kernel(void){ pthread_create(); }\n",
     "line 2: pthread_create is not allowed"),
    ("#define CAT(a, b) a##b\nvoid kernel(void){}\n", "line 1: token pasting"),
    ("void kernel(void){ int fd = open(\"/etc/passwd\", 0); (void)fd; }\n", "line 1: open is not allowed"),
    # the same directives spelled as the preprocessor also reads them: digraphs, trigraphs, line splices
    ("%:include <unistd.h>\nvoid kernel(void){}\n", "line 1: header <unistd.h> is not allowed"),
    ("??=include <stdio.h>\nvoid kernel(void){}\n", "line 1: header <stdio.h> is not allowed"),
    ("#inc\\\nlude <unistd.h>\nvoid kernel(void){}\n", "line 1: header <unistd.h> is not allowed"),
    ("#define CAT(a, b) a %:%: b\nvoid kernel(void){}\n", "line 1: token pasting"),
    ("void kernel(void){ sys\\\ntem(0); }\n", "line 1: system is not allowed"),
])
def test_source_rules_name_the_rule_and_line(target, source, needle):
    res = target.compile(source, "c", "-O2", "kernel")
    assert not res.ok and res.reason == pb.STATIC_CHECK
    assert needle in res.message


def test_comments_and_strings_do_not_trip_the_rules(target):
    src = ('#include <math.h>\n/* we never fopen() here */\n'
           'void kernel(float *y){ const char *s = "socket"; y[0] = (float)s[0]; }\n')
    assert target.compile(src, "c", "-O2", "kernel").ok


def test_a_bare_extern_is_caught_by_the_symbol_whitelist(target):
    # getpid is not on the source check's list, but the object imports it: the whitelist refuses it
    src = "extern int getpid(void);\nvoid kernel(float *y){ y[0] = (float)getpid(); }\n"
    res = target.compile(src, "c", "-O2", "kernel")
    assert not res.ok and res.reason == pb.STATIC_CHECK and "getpid" in res.message


def test_every_family_point_sample_passes_the_rules(target):
    import random

    fam = load_problem("softmax").families["cpu_c"]
    for point in random.Random(5).sample(fam.points(), 6):
        source, flags, _ = fam.render(point)
        res = target.compile(source, "c", flags, "kernel")
        assert res.ok, (point, res.message)


def test_the_fma_probe_keeps_its_chains_in_registers(target):
    """The peak probe's vectors are as wide as the host's registers (64-byte vectors on an AVX2 host spill
    8 chains to the stack and measured a peak 10-20x low), and it reports the lanes its flop count needs."""
    from kfactory.targets.cpu.ceiling import _run_probe
    flags = open("/proc/cpuinfo").read().split()
    lanes = 16 if "avx512f" in flags else 8 if "avx" in flags else 4
    _, y = _run_probe(target, 1, "cpu_fma.c", "-O3 -march=native -fopenmp", 1000, 16)
    assert y[1] == 1.0 and y[2] == float(lanes)


def _cpuinfo_text(family: str, model: str, flags: str) -> str:
    """/proc/cpuinfo of a 2-cpu virtual machine that names its processor only "AMD EPYC"."""
    one = (f"processor\t: {{n}}\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
           f"model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu sse sse2 {flags}\n\n")
    return one.format(n=0) + one.format(n=1)


def test_two_processor_generations_under_one_model_name_are_two_devices():
    zen3 = _cpuinfo_text("25", "1", "avx avx2 fma f16c")
    zen4 = _cpuinfo_text("25", "17", "avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16")
    assert cpu_identity(zen3) == "cpu family=25;model=1;stepping=1;vendor_id=AuthenticAMD|avx,avx2,fma,f16c"
    assert cpu_identity(zen4).endswith("|avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512_vnni,avx512_bf16")
    assert cpu_identity(zen3) != cpu_identity(zen4)
    # the same processor with a flag the kernels do not use (a newer kernel's name for a feature) is the same
    assert cpu_identity(zen3.replace("fpu sse", "fpu newflag sse")) == cpu_identity(zen3)
    assert cpu_identity("") == "|"

"""The cuda runtime: launch rules, the kernel header, NVML decoding, the target without a GPU, the runner child
driven through a fake CUDA driver (host memory, Python kernels) so every op's Python runs here, and, on a
machine with a GPU (`-m gpu`), real kernels through CudaSession."""
from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from cuda_fake import (_as_i64, _bare_session, _Fake, _InProcessRunner, _ref, _softmax_kernel, _x, host_build,
                       judge_host, judge_kernels)

from kfactory.problems import load_problem
from kfactory.sandbox.parent import LoadFailed, Runner, RunnerCrashed
from kfactory.sandbox.protocol import Ceilings, DeviceQuery
from kfactory.targets import get_target
from kfactory.targets.cuda import nvml
from kfactory.v1 import events_pb2 as pb


def _have_gpu() -> bool:
    try:
        nvml.resolve_gpu(os.environ.get("KFACTORY_GPU", ""))
        return True
    except nvml.NvmlUnavailable:
        return False


HAVE_GPU = _have_gpu()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA GPU here")


# -- the target without a GPU ------------------------------------------------------------------------------

def test_make_takes_known_architectures_only(settings):
    t = get_target("cuda:sm_90a", settings)
    assert t.name == "cuda" and t.option == "sm_90a"
    assert get_target("cuda", settings).option == ""
    with pytest.raises(ValueError, match="sm_100a"):
        get_target("cuda:sm_75", settings)


@pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU error")
def test_device_without_a_gpu_is_a_clear_error_not_a_hang(settings):
    t = get_target("cuda:sm_90a", settings)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="no GPU"):
        t.device()
    assert time.monotonic() - t0 < 10


def test_cubin_needs_a_launch_rule(settings, monkeypatch):
    from kfactory.targets.cuda import target as cuda
    sess = _bare_session(cuda, settings)
    with pytest.raises(ValueError, match="needs a launch rule"):
        sess.load_artifact("k", b"\x7fELF", "kernel")
    with pytest.raises(ValueError, match="grid and block"):
        sess.load_artifact("k", b"\x7fELF", "kernel", {"grid": "rows"})
    sess.load_artifact("k", b"\x7fELF", "kernel", '{"grid": "rows", "block": "256"}')
    load = sess.loads["k"]
    assert load.kind == "cubin" and load.argtypes == ["ptr", "ptr", "i64", "i64"]
    assert load.launch_rule == {"grid": "rows", "block": "256", "smem": "0", "params": {}}
    assert open(load.path, "rb").read() == b"\x7fELF"


def test_child_module_imports_without_a_gpu():
    code = "import kfactory.targets.cuda.child as c; assert c.CudaChild and c.classify('cuEventSynchronize', 700)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr


def test_cuda_errors_are_classified_by_value():
    from kfactory.targets.cuda import child as c
    from kfactory.targets.cuda import driver
    R = driver.cu.CUresult
    assert c.classify("cuEventSynchronize", int(R.CUDA_ERROR_ILLEGAL_ADDRESS)) == "device_fault"
    assert c.classify("cuCtxSynchronize", int(R.CUDA_ERROR_MISALIGNED_ADDRESS)) == "device_fault"
    assert c.classify("cuLaunchKernel", int(R.CUDA_ERROR_INVALID_VALUE)) == "launch_failed"
    assert c.classify("cuLaunchKernel", int(R.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)) == "launch_failed"
    assert c.classify("cuMemcpyHtoD", int(R.CUDA_ERROR_INVALID_VALUE)) == "cuda_error"
    assert c.arch_of(9, 0) == "sm_90a" and c.arch_of(10, 0) == "sm_100a" and c.arch_of(8, 9) == "sm_89"


# -- the child's ops through a fake driver (tests/cuda_fake.py) --------------------------------------------

@pytest.fixture
def fake_cuda(monkeypatch):
    from kfactory.targets.cuda import driver  # every part of the child reads driver.cu at call time
    fake = _Fake(driver.cu)
    monkeypatch.setattr(driver, "cu", fake)
    return fake


@pytest.fixture
def fake_session(fake_cuda, settings):
    from kfactory.targets.cuda import target as cuda
    from kfactory.targets.cuda import child as cuda_child
    sess = _bare_session(cuda, settings)
    sess.runner = _InProcessRunner(cuda_child.CudaChild(1))
    return sess


def test_fake_call_runs_checks_guards_and_keeps_addresses_distinct(fake_session, fake_cuda):
    fake_session.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    x = _x(5, 33)
    res = fake_session.call("k", {"rows": 5, "cols": 33}, x)
    np.testing.assert_allclose(res.outputs["y"], _ref(x), rtol=1e-5)
    assert res.mutated == [] and res.out_of_bounds == [] and res.seconds > 0
    child = fake_session.runner.child
    first = set(child.prev_allocs)
    fake_session.call("k", {"rows": 5, "cols": 33}, x)
    assert first.isdisjoint(child.prev_allocs)  # the previous call's buffers were still held
    assert len(fake_cuda.mem) == 2  # ... and freed once the next call had its own
    seq = fake_session.call_sequence("k", {"rows": 3, "cols": 17}, [_x(3, 17, s) for s in (1, 2, 3)])
    for s, r in zip((1, 2, 3), seq):
        np.testing.assert_allclose(r.outputs["y"], _ref(_x(3, 17, s)), rtol=1e-5)


def test_fake_call_sees_an_out_of_bounds_write_in_the_guard_band(fake_session, fake_cuda):
    def spill(raw):
        _softmax_kernel(raw)
        ctypes.c_float.from_address(raw[1] + 4 * _as_i64(raw[2]) * _as_i64(raw[3])).value = 1.0
    fake_cuda.kernels["kernel"] = (4, spill)
    fake_session.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    res = fake_session.call("k", {"rows": 2, "cols": 8}, _x(2, 8))
    assert res.out_of_bounds == ["y"]


def test_fake_device_fault_and_refused_launch_are_typed(fake_session, fake_cuda):
    from kfactory.sandbox.parent import DeviceFault, LaunchFailed
    fake_session.load_artifact("bad", b"cubin-oob", "oob", {"grid": "rows", "block": "256"})
    with pytest.raises(DeviceFault, match="ILLEGAL_ADDRESS") as ei:
        fake_session.call("bad", {"rows": 2, "cols": 8}, _x(2, 8))
    runner = fake_session.runner
    assert isinstance(ei.value, RunnerCrashed) and runner.killed == 1  # the child said it is exiting: reaped
    assert ei.value.reason == pb.DEVICE_FAULT and runner.last_reply.fault.code == 700
    fake_cuda.sticky = 0
    fake_session.load_artifact("wide", b"cubin-wide", "kernel", {"grid": "rows", "block": "4096"})
    with pytest.raises(LaunchFailed, match="block.x=4096") as ei:
        fake_session.call("wide", {"rows": 2, "cols": 8}, _x(2, 8))
    assert ei.value.reason == pb.LAUNCH_FAILED
    fake_session.load_artifact("nosym", b"cubin-x", "missing", {"grid": "rows", "block": "32"})
    with pytest.raises(LoadFailed) as ei:
        fake_session.call("nosym", {"rows": 2, "cols": 8}, _x(2, 8))
    assert not isinstance(ei.value, LaunchFailed) and "CUDA_ERROR_NOT_FOUND" in str(ei.value)


def _files(session) -> set[str]:
    """Every shared-memory file the session's ring holds now."""
    return {str(f) for a in session.ring.arenas for f in a.dir.iterdir()}


def test_fake_unload_frees_the_module_and_the_buffers_and_finds_a_leak(fake_session, fake_cuda):
    """A candidate done with is unloaded: its module goes, the last call's buffers are freed, the runner no
    longer counts it loaded, and the child reports no device memory held; memory it still holds is a leak, for
    which the session replaces the runner."""
    fake_session.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    fake_session.call("k", {"rows": 4, "cols": 64}, _x(4, 64))
    child = fake_session.runner.child
    assert child.prev_allocs and "k" in fake_session.runner.loaded
    reply = fake_session.runner.unload("k")
    assert reply.info["live_bytes"] == 0 and reply.info["free_bytes"] > 0
    assert getattr(fake_cuda, "unloaded", 0) == 1 and "k" not in child.kernels and not child.prev_allocs
    assert "k" not in fake_session.runner.loaded and fake_session.runner.unload("k") is None   # nothing to drop
    fake_session.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    fake_session.call("k", {"rows": 4, "cols": 64}, _x(4, 64))   # loaded again on its next use
    child.mem.alloc(1 << 20)                                     # a buffer nobody frees: a leak
    stopped = []
    fake_session.runner.stop = lambda: stopped.append(True)
    fake_session.unload("k")
    assert stopped == [True] and "k" not in fake_session.loads


def test_fake_requests_take_the_rings_arenas_which_the_child_keeps_mapped(fake_session):
    fake_session.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    shape = {"rows": 5, "cols": 33}
    for s in range(5):   # more requests than the ring has arenas: it comes round
        res = fake_session.call("k", shape, _x(5, 33, s))
        np.testing.assert_allclose(res.outputs["y"], _ref(_x(5, 33, s)), rtol=1e-5)
    ring, child = fake_session.ring, fake_session.runner.child
    assert len(ring.arenas) == ring.count == 3 and set(child.kept) == set(ring.paths())
    assert _files(fake_session) == set(ring.paths())   # one file an arena: no fresh buffers beside them
    kept = dict(child.kept)
    sets = [_x(5, 33, s) for s in (7, 8)]
    res = fake_session.bench(["k"], shape, sets, min_samples=3, min_s=0.0, max_s=0.05, noise=1.0, warmup_s=0.0,
                             mode="events")
    for x, outs in zip(sets, res.outputs["k"]):
        np.testing.assert_allclose(outs["y"], _ref(x), rtol=1e-5)
    assert all(child.kept[p] is m for p, m in kept.items())   # mapped once, not again per request
    fake_session.close()
    assert not ring.arenas


def test_fake_a_request_over_the_arena_size_takes_fresh_buffers(fake_cuda, settings):
    from kfactory.targets.cuda import child as cuda_child
    from kfactory.targets.cuda import target as cuda

    sess = _bare_session(cuda, settings.model_copy(update={"cuda_arena_mb": 0}))
    sess.runner = _InProcessRunner(cuda_child.CudaChild(1))
    sess.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    for s in range(2):
        res = sess.call("k", {"rows": 3, "cols": 9}, _x(3, 9, s))
        np.testing.assert_allclose(res.outputs["y"], _ref(_x(3, 9, s)), rtol=1e-5)
    assert not sess.ring.arenas and not sess.runner.child.kept


@pytest.mark.parametrize("mode", ["events", "graph", None])
def test_fake_bench_interleaves_and_returns_every_sets_output(fake_session, fake_cuda, mode):
    fake_session.load_artifact("a", b"cubin-a", "kernel", {"grid": "rows", "block": "256"})
    fake_session.load_artifact("b", b"cubin-b", "kernel", {"grid": "cdiv(rows, W)", "block": "(32, W)",
                                                           "smem": "S", "params": {"W": 4, "S": 64 << 10}})
    sets = [_x(4, 50, s) for s in range(3)]
    res = fake_session.bench(["a", "b"], {"rows": 4, "cols": 50}, sets, min_samples=5, min_s=0.0, max_s=0.3,
                             noise=0.5, warmup_s=0.001, mode=mode)
    assert set(res.samples) == {"a", "b"} and len(res.samples["a"]) == len(res.samples["b"]) >= 5
    assert res.mode in ("events", "graph") and (mode is None or res.mode == mode)
    for k in ("a", "b"):
        assert len(res.outputs[k]) == 3
        for s, outs in zip(sets, res.outputs[k]):
            np.testing.assert_allclose(outs["y"], _ref(s), rtol=1e-5)
        assert isinstance(res.telemetry[k], pb.GpuTelemetry) and res.telemetry[k].retries == 0
    assert fake_cuda.smem_attr["kernel"] == 64 << 10
    assert fake_cuda.capturing is None
    leftover = set(fake_cuda.mem) - set(fake_session.runner.child.prev_allocs)
    if fake_session.runner.child.mem.scratch:
        leftover.discard(fake_session.runner.child.mem.scratch[0])
    assert not leftover  # every bench buffer was freed


def _judge_round_trip(arch: str, tmp_path):
    """The device judge on the current driver: softmax inputs drawn on the device (every distribution, -inf
    masks too) equal the host twin's bit for bit; the device's float64 reference matches reference.py; the
    device's comparison of an output with it gives the host judge's figures (a clean output passes, one with a
    wrong element fails at that element); two outputs are counted as differing where the host counts them. The
    cubins are built here, as a session builds them for its runner."""
    from kfactory.judge import counter_rng, numerics
    from kfactory.targets.cuda import driver
    from kfactory.targets.cuda import judge_kernels as jk
    from kfactory.targets.cuda.allocator import Allocator
    from kfactory.targets.cuda.compile import compile_cuda
    from kfactory.targets.cuda.device import CudaDevice
    from kfactory.targets.cuda.driver import check, dptr
    from kfactory.targets.cuda.judge_device import DeviceJudge, draw_spec, reference_request

    problem = load_problem("softmax")
    found = problem.reference_f64("cuda")
    assert found is not None
    source, flags, _ = found
    built = [compile_cuda(jk.source(), "cuda", jk.FLAGS, jk.DRAW, arch, None),
             compile_cuda(source, "cuda", flags, "reference_f64", arch, None)]
    assert all(r.ok for r in built), [r.log[-2000:] for r in built]
    (tmp_path / "judge.cubin").write_bytes(built[0].artifact)
    (tmp_path / "ref.cubin").write_bytes(built[1].artifact)
    dev = CudaDevice()
    dev.start()
    mem = Allocator(None)
    judge = DeviceJudge(dev, mem, [], built[0].artifact)
    tol = problem.spec.tolerance["float32"]
    for shape in ({"rows": 65, "cols": 4099}, {"rows": 1, "cols": 1}):
        n = shape["rows"] * shape["cols"]
        for dist in problem.spec.distributions:
            seed = 1234567 + n
            x, y, out = mem.alloc(4 * n), mem.alloc(8 * n), mem.alloc(4 * n)
            try:
                judge.draw(x, "float32", n, draw_spec(problem.spec.distributions[dist]["x"], seed, 0, shape["cols"]))
                got = np.empty((shape["rows"], shape["cols"]), dtype=np.float32)
                check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(got.ctypes.data, dptr(x), got.nbytes))
                want = counter_rng.draw(problem, shape, dist, seed)["x"]
                assert got.tobytes() == want.tobytes(), (shape, dist)
                ref_req = reference_request(problem, shape, str(tmp_path / "judge.cubin"), str(tmp_path / "ref.cubin"))
                judge.reference(ref_req, shape, {"x": x}, {"y": y})
                ref = np.empty(got.shape)
                check("cuMemcpyDtoH", driver.cu.cuMemcpyDtoH(ref.ctypes.data, dptr(y), ref.nbytes))
                np.testing.assert_allclose(ref, problem.reference.reference({"x": want})["y"], rtol=1e-12, atol=0)
                for wrong in (False, True):
                    o = ref.astype(np.float32)
                    if wrong:
                        o.flat[n // 2] += 0.5
                    check("cuMemcpyHtoD", driver.cu.cuMemcpyHtoD(dptr(out), o.ctypes.data, o.nbytes))
                    figures = judge.compare(out, "float32", y, n, tol.atol, tol.rtol)
                    host = numerics.compare(o, ref, tol.atol, tol.rtol, tol.norm_rel)
                    assert (figures["worst_excess"] <= 0) == host.passed == (not wrong), (shape, dist, wrong)
                    assert figures["max_abs"] == host.max_abs_err and figures["worst"] == host.worst_index
                if n < 3:
                    continue
                # two runs' outputs counted by value as the host counts them: -0 for 0 and a NaN with another
                # payload are the same answer; a changed value is not
                a = ref.astype(np.float32)
                a.flat[[0, n - 1]] = [0.0, np.nan]
                b = a.copy()
                b.flat[0] = -0.0
                b.view(np.uint32).flat[n - 1] ^= 1
                b.flat[n // 2] += 1.0
                other = mem.alloc(4 * n)
                try:
                    for host_array, addr in ((a, out), (b, other)):
                        check("cuMemcpyHtoD", driver.cu.cuMemcpyHtoD(dptr(addr), host_array.ctypes.data, a.nbytes))
                    assert judge.count_unequal(out, other, "float32", n) == numerics.differing_elements(a, b) == 1
                finally:
                    mem.free([other])
            finally:
                mem.free([x, y, out])


def test_fake_device_judge_matches_the_host_judge(fake_cuda, tmp_path):
    """The device judge's launches (parameters, grids, partials, copies) through the fake driver, whose judge
    kernels are the same C sources built for this host (tests/cuda_fake.py judge_kernels)."""
    from kfactory.targets.cuda.toolchain import CudaToolchainMissing
    softmax_ref = host_build(load_problem("softmax").reference_f64("cuda")[0], tmp_path / "ref.so")
    fake_cuda.kernels.update(judge_kernels(fake_cuda, judge_host(tmp_path / "judge.so"), softmax_ref))
    try:
        _judge_round_trip("sm_90a", tmp_path)
    except CudaToolchainMissing as e:
        pytest.skip(f"no CUDA toolchain wheels: {e}")


def _small_problem(tmp_path, name: str = "softmax"):
    """A problem with one large shape (just over the judge's LARGE_ELEMENTS, so it is judged on the device) and
    its small verify shapes (judged on the host)."""
    import shutil

    import yaml
    src = load_problem(name).directory
    dst = tmp_path / f"{name}_small"
    shutil.copytree(src, dst)
    spec = yaml.safe_load((dst / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = [dict(zip(spec["symbols"], (1025, 1024)))]
    (dst / "problem.yaml").write_text(yaml.safe_dump(spec))
    return load_problem(dst)


def _bf16_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _rmsnorm_kernel(raw):
    """rmsnorm in numpy on bf16 bits (x, w, y, rows, hidden, eps as a 4-byte float), rounded to nearest even."""
    rows, hidden = _as_i64(raw[3]), _as_i64(raw[4])
    eps = struct.unpack("<f", struct.pack("<I", raw[5] & 0xFFFFFFFF))[0]
    x = np.ctypeslib.as_array((ctypes.c_uint16 * (rows * hidden)).from_address(raw[0])).reshape(rows, hidden)
    w = np.ctypeslib.as_array((ctypes.c_uint16 * hidden).from_address(raw[1]))
    y = np.ctypeslib.as_array((ctypes.c_uint16 * (rows * hidden)).from_address(raw[2])).reshape(rows, hidden)
    xf = _bf16_f64(x)
    out = (xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * _bf16_f64(w)).astype(np.float32)
    u = out.view(np.uint32)
    y[...] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _judged_session(fake_cuda, settings, tmp_path, problem, **update):
    """A cuda session over the fake driver with the device judge on (and `update`'s settings), whose judge
    kernels and float64 reference are the same C sources built for this host, kernel "k" loaded; the problem's
    reference library comes back too, for a test that wires its own reference call."""
    from kfactory.targets.cuda import child as cuda_child
    from kfactory.targets.cuda import target as cuda
    ref = host_build(problem.reference_f64("cuda")[0], tmp_path / "ref.so")
    fake_cuda.kernels.update(judge_kernels(fake_cuda, judge_host(tmp_path / "judge.so"), ref))
    sess = _bare_session(cuda, settings.model_copy(update={"device_judge": True, **update}), problem)
    sess.runner = _InProcessRunner(cuda_child.CudaChild(1))
    sess.load_artifact("k", b"cubin", "kernel", {"grid": "rows", "block": "256"})
    return sess, ref


def _verified(sess, problem, pool=None):
    """verify() of kernel "k" (with `pool`, default a fresh one); skipped where NVRTC (which builds the judge's
    cubins) is not installed."""
    from kfactory.judge.checks import InputPool
    from kfactory.judge.verify import verify
    from kfactory.targets.cuda.toolchain import CudaToolchainMissing
    try:
        return verify(sess, "k", problem, pool or InputPool(problem, reuse=1))
    except CudaToolchainMissing as e:
        pytest.skip(f"no CUDA toolchain wheels: {e}")


def test_fake_verify_judges_rmsnorms_bf16_and_its_eps_on_the_device(fake_cuda, settings, tmp_path):
    """rmsnorm through the device judge: bf16 inputs drawn there, a float parameter (eps) passed to both the
    kernel and the float64 reference, bf16 outputs compared; a kernel that ignores eps fails on the tiny set."""
    from kfactory.judge import counter_rng
    problem = _small_problem(tmp_path, "rmsnorm")
    sess, ref = _judged_session(fake_cuda, settings, tmp_path, problem)
    fake_cuda.kernels["reference_f64"] = (6, lambda raw: ref.reference_f64_host(
        ctypes.c_void_p(raw[0]), ctypes.c_void_p(raw[1]), ctypes.c_void_p(raw[2]), ctypes.c_longlong(_as_i64(raw[3])),
        ctypes.c_longlong(_as_i64(raw[4])), ctypes.c_double(struct.unpack("<d", struct.pack("<Q", raw[5]))[0])))
    fake_cuda.kernels["kernel"] = (6, _rmsnorm_kernel)
    verdict = _verified(sess, problem)
    assert verdict.passed, verdict.message
    on_device = [c for c in verdict.checks if c.distribution.startswith(counter_rng.PREFIX)]
    assert len(on_device) == 2 * len(problem.spec.distributions)

    def no_eps(raw):   # eps 0: right wherever mean(x^2) >> eps, wrong on the tiny set
        _rmsnorm_kernel(raw[:5] + [0])
    fake_cuda.kernels["kernel"] = (6, no_eps)
    verdict = _verified(sess, problem)
    assert not verdict.passed and verdict.reason == pb.WRONG_RESULT and "tiny" in verdict.checks[-1].distribution


def test_fake_measure_draws_and_checks_large_timing_sets_on_the_device(fake_cuda, settings, tmp_path):
    """measure() with the device judge on: a large shape's timing sets are drawn on the device from fresh seeds
    and the timed calls' outputs compared there (figures, no outputs back); a kernel wrong there is
    WRONG_RESULT with its set's seed as a device:DIST regression input, which the host twin draws again."""
    from kfactory.judge import counter_rng
    from kfactory.judge.checks import InputPool, timing_dist
    from kfactory.judge.measure import measure
    problem = _small_problem(tmp_path)
    sess, _ = _judged_session(fake_cuda, settings, tmp_path, problem, measure_min_s=0.01, measure_max_s=0.05)
    s = sess.target.settings
    large = {"rows": 1025, "cols": 1024}
    got = measure(sess, ["k"], problem, large, InputPool(problem, reuse=1), 2 << 20, s)
    assert not got.reason, got.message
    assert got.timings["k"].output_checked and got.timings["k"].samples > 0

    def wrong_when_large(raw):
        _softmax_kernel(raw)
        if _as_i64(raw[2]) * _as_i64(raw[3]) > 1 << 20:
            ctypes.c_float.from_address(raw[1] + 4 * 4242).value += 0.01
    fake_cuda.kernels["kernel"] = (4, wrong_when_large)
    got = measure(sess, ["k"], problem, large, InputPool(problem, reuse=1), 2 << 20, s)
    assert got.reason == pb.WRONG_RESULT and "(set 0)" in got.message
    assert got.failed_input.distribution == counter_rng.PREFIX + timing_dist(problem)
    x = counter_rng.draw(problem, large, timing_dist(problem), got.failed_input.seed, rows=slice(4, 5))["x"]
    assert x.shape == (1, 1024) and np.isfinite(x).all()


def test_fake_probe_after_timing_draws_and_checks_on_the_device(fake_cuda, settings, tmp_path):
    """The check after a large shape's timing is a device check too: a fresh seed drawn there into fresh,
    poisoned buffers and compared there. A kernel that stops writing large outputs once it has made 64 calls
    (here: at the small shape, where the probe makes its calls after the timing) is caught by it, WRONG_RESULT;
    the host draws no probe set."""
    from kfactory.judge.checks import InputPool
    from kfactory.judge.measure import measure
    problem = _small_problem(tmp_path)
    sess, _ = _judged_session(fake_cuda, settings, tmp_path, problem, measure_min_s=0.01, measure_max_s=0.05)
    large, cache = {"rows": 1025, "cols": 1024}, 2 << 20
    small_calls = [0]

    def stops_writing(raw):
        if _as_i64(raw[2]) * _as_i64(raw[3]) <= 1 << 20:
            small_calls[0] += 1
            _softmax_kernel(raw)
        elif small_calls[0] < 64:
            _softmax_kernel(raw)
    fake_cuda.kernels["kernel"] = (4, stops_writing)
    pool = InputPool(problem, reuse=1)
    asked, get = [], pool._get   # every set the pool handed out (a used-up one is not kept to look at after)
    pool._get = lambda key, numel, make: asked.append(key) or get(key, numel, make)
    got = measure(sess, ["k"], problem, large, pool, cache, sess.target.settings)
    assert got.reason == pb.WRONG_RESULT and "after" in got.message and small_calls[0] >= 128, got.message
    assert got.failed_input is None   # the call count exposed it, not an input memory could replay
    assert not any(kind == "probe" for _, kind in asked)


def test_fake_timed_sets_drawn_on_the_device_catch_a_kernel_that_writes_its_inputs(fake_cuda, settings, tmp_path):
    """Sets drawn on the device are drawn again after the timing: a kernel honest on its first two calls on a
    set that then zeroes the set's input and answers without reading it (right for the zeroed input, so a
    reference computed from what the kernel left would agree) is INPUT_MUTATED, as on the host."""
    from kfactory.judge.checks import InputPool
    from kfactory.judge.measure import measure
    problem = _small_problem(tmp_path)
    sess, _ = _judged_session(fake_cuda, settings, tmp_path, problem, measure_min_s=0.01, measure_max_s=0.05)
    calls: dict[int, int] = {}

    def zeroes_its_input(raw):
        rows, cols = _as_i64(raw[2]), _as_i64(raw[3])
        calls[raw[0]] = calls.get(raw[0], 0) + 1
        if rows * cols <= 1 << 20 or calls[raw[0]] <= 2:
            return _softmax_kernel(raw)
        ctypes.memset(raw[0], 0, 4 * rows * cols)
        np.ctypeslib.as_array((ctypes.c_float * (rows * cols)).from_address(raw[1]))[:] = np.float32(1 / cols)
    fake_cuda.kernels["kernel"] = (4, zeroes_its_input)
    got = measure(sess, ["k"], problem, {"rows": 1025, "cols": 1024}, InputPool(problem, reuse=1), 2 << 20,
                  sess.target.settings)
    assert got.reason == pb.INPUT_MUTATED and "input x" in got.message, got.message


def test_fake_regression_inputs_drawn_on_a_device_are_replayed_there(fake_cuda, settings, tmp_path):
    """A regression input memory keeps from a device check (labelled device:DIST) is drawn again on the device
    where it can judge the shape (two runs, like any device check), not by the host twin; a kernel wrong on it
    is rejected at that input."""
    from kfactory.judge import counter_rng
    from kfactory.judge.checks import InputPool, RegressionInput
    problem = _small_problem(tmp_path)
    sess, _ = _judged_session(fake_cuda, settings, tmp_path, problem)
    large, seed = {"rows": 1025, "cols": 1024}, 12345
    reg = RegressionInput("1025x1024", counter_rng.PREFIX + "normal", seed)
    verdict = _verified(sess, problem, InputPool(problem, reuse=1, regressions=[reg]))
    assert verdict.passed, verdict.message
    replayed = [c for c in verdict.checks if c.distribution == "regression:device:normal"]
    assert len(replayed) == 2 and all(c.seed == seed and c.passed for c in replayed)
    first = counter_rng.draw(problem, large, "normal", seed, rows=slice(0, 1))["x"][0, :4].copy()

    def wrong_on_that_input(raw):
        _softmax_kernel(raw)
        if np.array_equal(np.ctypeslib.as_array((ctypes.c_float * 4).from_address(raw[0])), first):
            ctypes.c_float.from_address(raw[1] + 4 * 99).value += 0.01
    fake_cuda.kernels["kernel"] = (4, wrong_on_that_input)
    verdict = _verified(sess, problem, InputPool(problem, reuse=1, regressions=[reg]))
    assert not verdict.passed and verdict.reason == pb.WRONG_RESULT
    assert verdict.checks[-1].distribution == "regression:device:normal" and verdict.checks[-1].worst_index == 99


def test_fake_screen_draws_its_sets_on_the_device(fake_cuda, settings, tmp_path):
    """A screening timing of a large shape with the device judge on: its sets drawn there from the pool's
    screening seeds (the same for every screen), nothing drawn on the host, nothing compared; a kernel far
    slower than the campaign's best is screened out on that timing."""
    import time

    from kfactory.judge.checks import InputPool
    from kfactory.judge.screening import screen, screened_out
    problem = _small_problem(tmp_path)
    sess, _ = _judged_session(fake_cuda, settings, tmp_path, problem)
    large, cache, s = {"rows": 1025, "cols": 1024}, 2 << 20, sess.target.settings
    pool = InputPool(problem, reuse=1)
    first = screen(sess, "k", problem, large, pool, cache, s, bar_s=s.screen_factor * 1.0)
    assert not first.reason, first.message
    seeds = pool.screen_seeds(large, cache)
    assert first.timings["k"].samples >= s.screen_min_samples and first.timings["k"].median_s > 0
    assert not any(kind == "screen" for _, kind in pool._sets)

    def slow(raw):
        time.sleep(0.02)
        _softmax_kernel(raw)
    fake_cuda.kernels["kernel"] = (4, slow)
    second = screen(sess, "k", problem, large, pool, cache, s,
                    bar_s=s.screen_factor * first.timings["k"].median_s / 10)
    assert not second.reason and pool.screen_seeds(large, cache) == seeds
    assert screened_out(second.timings["k"].median_s, first.timings["k"].median_s / 10, s.screen_factor)


def test_a_session_without_a_device_judge_refuses_device_checks_with_its_reason(fake_session, settings):
    """The judge asks device_check_unavailable first; asked anyway, a session that cannot judge there refuses
    with a typed error carrying the reason: the cpu target (no judge of its own), a cuda one with the judge off."""
    from kfactory.targets.base import DeviceCheckUnavailable
    large = {"rows": 1025, "cols": 1024}
    cpu = get_target("cpu", settings).session(load_problem("softmax"), 1)
    try:
        with pytest.raises(DeviceCheckUnavailable, match="judges on the host"):
            cpu.device_check("k", large, "normal", 1)
        with pytest.raises(DeviceCheckUnavailable, match="judges on the host"):
            cpu.bench_drawn(["k"], large, "normal", [1], min_samples=1, min_s=0, max_s=0, noise=1, warmup_s=0)
    finally:
        cpu.close()
    assert fake_session.device_check_unavailable(large, "normal") == "the device judge is off (Settings.device_judge)"
    with pytest.raises(DeviceCheckUnavailable, match="device judge is off"):
        fake_session.device_check("k", large, "normal", 1)


def test_fake_verify_judges_large_sets_on_the_device(fake_cuda, settings, tmp_path):
    """verify() with the device judge on: the large shape's checks are drawn, referenced and compared by the
    device (labelled device:DIST, two runs each), the small shapes' on the host; a kernel wrong only on large
    sets is rejected by the device's figures, and the host twin draws the failing row again from the seed."""
    from kfactory.judge import counter_rng
    problem = _small_problem(tmp_path)
    sess, _ = _judged_session(fake_cuda, settings, tmp_path, problem)
    large = {"rows": 1025, "cols": 1024}
    assert sess.device_check_unavailable(large, "masked") is None
    verdict = _verified(sess, problem)
    assert verdict.passed, verdict.message
    on_device = [c for c in verdict.checks if c.distribution.startswith(counter_rng.PREFIX)]
    assert len(on_device) == 2 * len(problem.spec.distributions) and all(c.shape == "1025x1024" for c in on_device)
    assert any(c.shape == "65x4099" and c.distribution == "normal" for c in verdict.checks)

    def wrong_when_large(raw):
        _softmax_kernel(raw)
        rows, cols = _as_i64(raw[2]), _as_i64(raw[3])
        if rows * cols > 1 << 20:
            y = np.ctypeslib.as_array((ctypes.c_float * (rows * cols)).from_address(raw[1]))
            y[777 * cols + 5] += 0.01
    fake_cuda.kernels["kernel"] = (4, wrong_when_large)
    verdict = _verified(sess, problem)
    assert not verdict.passed and verdict.reason == pb.WRONG_RESULT
    failing, first = verdict.checks[-1], next(iter(problem.spec.distributions))
    assert failing.distribution == counter_rng.PREFIX + first and failing.worst_index == 777 * 1024 + 5
    row = counter_rng.draw(problem, large, first, failing.seed, rows=slice(777, 778))["x"]
    assert row.shape == (1, 1024) and np.isfinite(row).all()

    def writes_its_input_when_large(raw):
        _softmax_kernel(raw)
        if _as_i64(raw[2]) * _as_i64(raw[3]) > 1 << 20:
            ctypes.c_float.from_address(raw[0] + 4 * 1000).value = 0.0
    calls = []

    def differs_between_runs_when_large(raw):
        _softmax_kernel(raw)
        if _as_i64(raw[2]) * _as_i64(raw[3]) > 1 << 20:
            calls.append(1)
            y = ctypes.c_float.from_address(raw[1] + 4 * 3)
            y.value = y.value * (1 + 1e-6 * len(calls))   # within tolerance, not the same twice
    for body, reason in ((writes_its_input_when_large, pb.INPUT_MUTATED),
                         (differs_between_runs_when_large, pb.NOT_DETERMINISTIC)):
        fake_cuda.kernels["kernel"] = (4, body)
        verdict = _verified(sess, problem)
        assert not verdict.passed and verdict.reason == reason, (body.__name__, verdict.message)
        assert "1025x1024" in verdict.message


@gpu
@needs_gpu
@pytest.mark.parametrize("name", ["softmax", "rmsnorm"])
def test_gpu_verify_judges_large_sets_on_the_device(settings, tmp_path, name):
    """The whole verification of the problem's cuda reference kernel on the GPU with the device judge on: the
    large shape's checks judged there (device:DIST, two runs each) and passed, the small shapes' on the host."""
    from kfactory.judge import counter_rng
    from kfactory.judge.checks import InputPool
    from kfactory.judge.verify import verify
    problem = _small_problem(tmp_path, name)
    target = get_target("cuda", settings.model_copy(update={"runner_timeout_s": 60.0, "device_judge": True}))
    sess = target.session(problem, 1)
    try:
        src, _ = problem.reference_source("cuda")
        sess.load_artifact("ref", _compile(target, src), "kernel", problem.spec.reference_kernel["cuda"].launch)
        verdict = verify(sess, "ref", problem, InputPool(problem, reuse=1))
    finally:
        sess.close()
    assert verdict.passed, verdict.message
    on_device = [c for c in verdict.checks if c.distribution.startswith(counter_rng.PREFIX)]
    assert len(on_device) == 2 * len(problem.spec.distributions) and all(c.seconds > 0 for c in on_device)


@gpu
@needs_gpu
def test_gpu_measure_draws_and_checks_large_timing_sets_on_the_device(settings, tmp_path):
    """The cuda reference kernel timed on sets the GPU drew, its timed outputs compared there: checked, timed."""
    from kfactory.judge.checks import InputPool
    from kfactory.judge.measure import measure
    problem = _small_problem(tmp_path)
    target = get_target("cuda", settings.model_copy(update={"runner_timeout_s": 60.0, "device_judge": True}))
    sess = target.session(problem, 1)
    try:
        src, _ = problem.reference_source("cuda")
        sess.load_artifact("ref", _compile(target, src), "kernel", problem.spec.reference_kernel["cuda"].launch)
        got = measure(sess, ["ref"], problem, {"rows": 1025, "cols": 1024}, InputPool(problem, reuse=1),
                      target.cache_bytes(), target.settings)
    finally:
        sess.close()
    assert not got.reason, got.message
    assert got.timings["ref"].output_checked and got.timings["ref"].median_s > 0


@gpu
@needs_gpu
def test_gpu_device_judge_matches_the_host_judge(tmp_path):
    """On the GPU itself (in this process): the device's draws equal the host twin's bit for bit, its float64
    reference and its comparison the host's (issue 23's device-side drawing and comparison)."""
    from kfactory.targets.cuda.arch import resolve_arch
    _judge_round_trip(resolve_arch(""), tmp_path)


def test_fake_device_and_ceilings(fake_cuda, monkeypatch):
    from kfactory.targets.cuda import child as cuda_child
    child = cuda_child.CudaChild(1)
    info = child.op_device(DeviceQuery()).info
    assert info["name"] == "Fake H200" and info["arch"] == "sm_90a" and info["sm_count"] == 4
    assert info["uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    fake_compile = types.SimpleNamespace(compile_cuda=lambda *a: types.SimpleNamespace(ok=True, artifact=b"x"))
    monkeypatch.setitem(sys.modules, "kfactory.targets.cuda.compile", fake_compile)
    got = child.op_ceilings(Ceilings(arch="sm_90a", copy_bytes=1 << 20)).info
    assert got["mem_bandwidth_gbps"] > 0 and got["peak_gflops"] > 0
    assert isinstance(got["peak_bf16_gflops"], float) and isinstance(got["notes"], list)


# -- on a GPU ----------------------------------------------------------------------------------------------

OOB_KERNEL = r"""
extern "C" __global__ void kernel(const float *x, float *y, long long rows, long long cols) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * cols) y[i + (1LL << 40)] = x[i];   // a terabyte past the end: an illegal address
}
"""


@pytest.fixture
def gpu_target(settings):
    # the test settings' 4 s runner timeout is too short for a first CUDA start and a torch import
    return get_target("cuda", settings.model_copy(update={"runner_timeout_s": 60.0}))


@pytest.fixture
def gpu_session(gpu_target):
    s = gpu_target.session(load_problem("softmax"), 1)
    yield s
    s.close()


def _compile(target, source, entry="kernel"):
    res = target.compile(source, "cuda", "", entry)
    assert res.ok, f"{res.message}\n{res.log[-3000:]}"
    return res.artifact


@gpu
@needs_gpu
def test_gpu_device_info(gpu_target):
    dev = gpu_target.device()
    assert dev.target == "cuda" and dev.uuid.startswith(("GPU-", "MIG-")) and dev.sm_count > 0
    assert dev.l2_bytes > 0 and dev.arch.startswith("sm_")
    assert dev.mem_bandwidth_gbps > 100 and dev.peak_gflops > 1000
    assert gpu_target.cache_bytes() == 2 * dev.l2_bytes


@gpu
@needs_gpu
def test_gpu_softmax_call_is_right(gpu_target, gpu_session):
    problem = load_problem("softmax")
    src, _ = problem.reference_source("cuda")
    gpu_session.load_artifact("ref", _compile(gpu_target, src), "kernel",
                              {"grid": "rows", "block": "256", "smem": "0", "params": {}})
    for rows, cols in [(3, 1000), (1, 1), (65, 4099)]:
        x = _x(rows, cols, rows)
        res = gpu_session.call("ref", {"rows": rows, "cols": cols}, x)
        np.testing.assert_allclose(res.outputs["y"], _ref(x), rtol=1e-4, atol=1e-7)
        assert res.mutated == [] and res.out_of_bounds == [] and 0 < res.seconds < 1


@gpu
@needs_gpu
def test_gpu_out_of_bounds_is_a_device_fault_and_the_next_kernel_runs(gpu_target, gpu_session):
    from kfactory.sandbox.parent import DeviceFault
    gpu_session.load_artifact("oob", _compile(gpu_target, OOB_KERNEL), "kernel",
                              {"grid": "cdiv(rows * cols, 256)", "block": "256", "params": {}})
    with pytest.raises(DeviceFault) as ei:
        gpu_session.call("oob", {"rows": 4, "cols": 256}, _x(4, 256))
    assert ei.value.reason == pb.DEVICE_FAULT
    src, _ = load_problem("softmax").reference_source("cuda")
    gpu_session.load_artifact("ref", _compile(gpu_target, src), "kernel", {"grid": "rows", "block": "256"})
    x = _x(4, 256)
    np.testing.assert_allclose(gpu_session.call("ref", {"rows": 4, "cols": 256}, x).outputs["y"], _ref(x),
                               rtol=1e-4, atol=1e-7)


@gpu
@needs_gpu
@pytest.mark.parametrize("mode", [None, "events", "graph"])
def test_gpu_bench_two_kernels_interleaved_with_telemetry(gpu_target, gpu_session, mode):
    src, _ = load_problem("softmax").reference_source("cuda")
    art = _compile(gpu_target, src)
    gpu_session.load_artifact("a", art, "kernel", {"grid": "rows", "block": "256"})
    gpu_session.load_artifact("b", art, "kernel", {"grid": "rows", "block": "256"})
    shape = {"rows": 64, "cols": 1000}
    sets = [_x(64, 1000, s) for s in range(4)]
    res = gpu_session.bench(["a", "b"], shape, sets, min_samples=10, min_s=0.05, max_s=1.0, noise=0.05,
                            warmup_s=0.02, mode=mode)
    assert len(res.samples["a"]) >= 10 and len(res.samples["b"]) == len(res.samples["a"])
    assert all(0 < s < 0.01 for s in res.samples["a"])
    for k in ("a", "b"):
        assert len(res.outputs[k]) == 4
        for s, outs in zip(sets, res.outputs[k]):
            np.testing.assert_allclose(outs["y"], _ref(s), rtol=1e-4, atol=1e-7)
        assert res.telemetry[k].uuid and res.telemetry[k].sm_clock_mhz_after > 0
    assert res.mode in ("events", "graph")


@gpu
@needs_gpu
def test_gpu_torch_baseline_call(gpu_session):
    pytest.importorskip("torch")
    problem = load_problem("softmax")
    if "torch" not in getattr(problem.reference, "cuda_baselines", dict)():
        pytest.skip("no torch cuda baseline")
    gpu_session.load_baseline("torch", "torch")
    x = _x(7, 33)
    res = gpu_session.call("torch", {"rows": 7, "cols": 33}, x)
    np.testing.assert_allclose(res.outputs["y"], _ref(x), rtol=1e-4, atol=1e-7)


FAKE_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from cuda_fake import _Fake
import kfactory.targets.cuda.child as c
import kfactory.targets.cuda.driver as d
d.cu = _Fake(d.cu)
c.main(c.CudaChild)
"""


def test_fake_fault_through_a_real_runner_replies_typed_and_the_runner_is_replaced(settings, tmp_path):
    """The child's fatal path for real: a typed reply written to the pipe, the process gone, DeviceFault in
    the parent, and a fresh runner for the next call."""
    from kfactory.sandbox.parent import DeviceFault
    from kfactory.targets.cuda import target as cuda
    (tmp_path / "fake_cuda_child.py").write_text(FAKE_CHILD.format(tests=os.path.dirname(os.path.abspath(__file__))))
    sess = _bare_session(cuda, settings)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sess.runner = Runner(1, 20.0, mem_mb=0, max_runs=100, child_module="fake_cuda_child",
                         env={"PYTHONPATH": os.pathsep.join([str(tmp_path), root])})
    try:
        sess.load_artifact("bad", b"cubin-oob", "oob", {"grid": "rows", "block": "256"})
        sess.load_artifact("ok", b"cubin-ok", "kernel", {"grid": "rows", "block": "256"})
        x = _x(3, 10)
        np.testing.assert_allclose(sess.call("ok", {"rows": 3, "cols": 10}, x).outputs["y"], _ref(x), rtol=1e-5)
        pid = sess.runner.proc.pid
        with pytest.raises(DeviceFault, match="ILLEGAL_ADDRESS"):
            sess.call("bad", {"rows": 3, "cols": 10}, x)
        assert sess.runner.proc is None  # reaped
        np.testing.assert_allclose(sess.call("ok", {"rows": 3, "cols": 10}, x).outputs["y"], _ref(x), rtol=1e-5)
        assert sess.runner.proc.pid != pid
    finally:
        sess.close()


def test_fake_bench_writes_every_set_even_when_the_loop_stops_early(fake_session):
    fake_session.load_artifact("a", b"cubin-a", "kernel", {"grid": "rows", "block": "256"})
    sets = [_x(2, 9, s) for s in range(12)]
    res = fake_session.bench(["a"], {"rows": 2, "cols": 9}, sets, min_samples=1, min_s=0.0, max_s=0.0,
                             noise=1.0, warmup_s=0.0, mode="events")
    assert len(res.samples["a"]) == 1
    for s, outs in zip(sets, res.outputs["a"]):
        np.testing.assert_allclose(outs["y"], _ref(s), rtol=1e-5)


@pytest.mark.parametrize("mode, launches", [("events", None), ("graph", None), ("graph", 5)])
def test_fake_bench_warms_every_set_before_the_first_timed_sample(fake_session, fake_cuda, monkeypatch, mode,
                                                                   launches):
    """A kernel that computes only when its output is fresh (first run on a set) must be timed by its repeat
    runs alone, or its honest first runs hide that its repeats do nothing (verification.md, too fast to be
    true): every set a timed sample runs has run before sample_interleaved starts timing. Events time the sets
    in turn, so all of them must have (the warm-up's min_rounds); a graph replays its own N launches, which
    cover min(N, sets) sets (N comes from a timed first guess: 11 of 12 on a loaded CI machine, 5 here), so
    those must have."""
    from kfactory.targets.cuda import child as cuda_child, sampling
    if launches:
        monkeypatch.setattr(sampling, "MAX_GRAPH_LAUNCHES", launches)
    computed: set[int] = set()
    timed: set[int] = set()
    at_start: list[set[int]] = []
    timing = [False]

    def lazy(raw):
        if timing[0]:
            timed.add(raw[1])
        if raw[1] not in computed:
            computed.add(raw[1])
            _softmax_kernel(raw)

    fake_cuda.kernels["lazy"] = (4, lazy)
    real = cuda_child.sample_interleaved

    def spy(samplers, cmd):
        at_start.append(set(computed))
        timing[0] = True
        samples = real(samplers, cmd)
        timing[0] = False  # the runs after timing (each set once more, for its output) are not timed
        return samples

    monkeypatch.setattr(cuda_child, "sample_interleaved", spy)
    fake_session.load_artifact("a", b"cubin-a", "lazy", {"grid": "rows", "block": "256"})
    sets = [_x(2, 9, s) for s in range(12)]
    res = fake_session.bench(["a"], {"rows": 2, "cols": 9}, sets, min_samples=3, min_s=0.0, max_s=0.05,
                             noise=1.0, warmup_s=0.5, mode=mode)
    first, = at_start
    assert timed and timed <= first  # no timed run was a set's first
    if mode == "events":
        assert len(first) == 12
    if launches:
        assert len(timed) == launches  # the graph's 5 launches, on 5 of the 12 sets
    for s, outs in zip(sets, res.outputs["a"]):
        np.testing.assert_allclose(outs["y"], _ref(s), rtol=1e-5)


def test_device_warm_up_runs_every_set_even_when_the_time_settles_sooner(monkeypatch):
    """On a clock that every sample advances by 1 ms, a 2 ms warm-up has settled after two rounds; with 12
    argument sets it still runs all 12 (and without them it stops at 2, so the count is what is tested)."""
    from types import SimpleNamespace

    from kfactory.sandbox import child as runner_child
    from kfactory.targets.cuda import child as cuda_child
    now = [0.0]
    monkeypatch.setattr(runner_child, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    ran: dict[str, list[int]] = {"a": [], "b": []}

    def sampler(key):
        def sample(i):
            ran[key].append(i % 12)
            now[0] += 0.0005
            return 0.0005
        return sample

    samplers = {k: sampler(k) for k in ran}
    assert cuda_child.CudaChild._warm_up_device(samplers, 0.002, 12) == 12
    assert ran == {"a": list(range(12)), "b": list(range(12))}
    assert cuda_child.CudaChild._warm_up_device(samplers, 0.002, 1) == 2

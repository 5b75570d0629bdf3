"""The judge's check after a timing (kfactory.judge.measure.probe_after_timing): a kernel that stops writing once it has
been called enough times is caught however few calls a loaded host let the timing make.

The timed calls' own outputs cannot show such a kernel: a timing set's buffers still hold the right answer of an
earlier honest call on the same inputs. measure therefore calls every measured kernel again, at least as many
times as its timing did (and never fewer than PROBE_MIN_CALLS) plus a random extra, and then checks one call at
the timed shape on fresh inputs with its outputs poisoned.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from kfactory.cli.check import check
from kfactory.judge.checks import InputPool
from kfactory.judge.measure import PROBE_MIN_CALLS, measure, probe_calls
from kfactory.problems import BUILTIN_DIR, load_problem
from kfactory.targets import get_target
from kfactory.v1 import events_pb2 as pb

# the speed-of-light floor and the runner's timeouts judge these kernels: `make test` runs them alone
pytestmark = pytest.mark.serial

ADVERSARIAL = Path(__file__).parent / "adversarial"
FLAGS = "-O2 -fopenmp"


def test_the_probe_makes_at_least_the_timings_calls_and_a_drawn_extra():
    for timed in (1, 2, 5, 31, 400):
        base = max(timed, PROBE_MIN_CALLS)
        drawn = {probe_calls(timed) for _ in range(200)}
        assert min(drawn) >= base and max(drawn) <= base + base // 2
        assert len(drawn) > 1  # drawn, not fixed: a kernel cannot count its way to the checked call


def _short_timing(settings, samples: int, max_s: float = 60.0):
    """Settings whose timing loop stops at exactly `samples` timed calls (no time floor, a noise bound any
    spread meets) unless `max_s` runs out first: with the default cap the count does not depend on the host."""
    return settings.model_copy(update={"measure_min_samples": samples, "measure_min_s": 0.0,
                                       "measure_max_s": max_s, "compare_max_s": max_s, "measure_noise": 1e9})


def test_check_rejects_a_call_counter_when_the_timing_is_short(settings, tmp_path):
    """The defect as CI met it: skip_repeated.c (honest for its first 64 calls, then it writes nothing) passed
    `kfactory check` when the timing made few calls. Here verification makes 33 (5 shapes x 5 distributions,
    a second run per shape, a 3-call memo probe), the one optimize shape 512x4096 (tens of milliseconds a call)
    is timed beside the reference only (no baselines: two orders) on two timing sets of 16 MB each (a 32 MiB
    last-level cache, whatever the host's: on one reporting 480 MiB each kernel took twenty sets, a warm-up
    round per set, and the timing itself went past the 64th call), each order a warm-up of a few rounds and a
    single timed round: every call of the timing is honest and its checks pass. The probe after it makes at
    least PROBE_MIN_CALLS calls (at the smallest shape) before its checked call, which is therefore far past the
    64th."""
    problem = tmp_path / "softmax_short"
    shutil.copytree(BUILTIN_DIR / "softmax", problem)
    spec = yaml.safe_load((problem / "problem.yaml").read_text())
    spec["shapes"]["optimize"] = [{"rows": 512, "cols": 4096}]
    spec["baselines"] = []
    (problem / "problem.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = check(str(problem), "cpu", (ADVERSARIAL / "skip_repeated.c").read_text(), FLAGS,
                _short_timing(settings, 1, max_s=0.01).model_copy(update={"cpu_cache_mb": 32}))
    verdict = out["verdict"]
    assert verdict["passed"] is False and verdict["reason"] == "WRONG_RESULT", verdict
    assert out["measurement"] is None


#: honest for its first 20 calls AT EACH SHAPE, then it returns at that shape without writing y: the calls at
#: other shapes that the probe makes in between do not set it off, only its calls at the timed shape do
PER_SHAPE_COUNTER = r"""
#include <math.h>
#include <stdint.h>
#define HONEST_CALLS 20
#define SEEN_MAX 64
static int64_t seen_rows[SEEN_MAX], seen_cols[SEEN_MAX], seen_calls[SEEN_MAX];
static int n_seen;

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int i = 0;
    while (i < n_seen && !(seen_rows[i] == rows && seen_cols[i] == cols)) i++;
    if (i == n_seen && n_seen < SEEN_MAX) { seen_rows[i] = rows; seen_cols[i] = cols; n_seen++; }
    if (i < SEEN_MAX && ++seen_calls[i] > HONEST_CALLS) return;
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / (float)s;
    }
}
"""


def _measure_cpu(settings, source: str, shape: dict[str, int]):
    target = get_target("cpu", settings)
    problem = load_problem("softmax")
    res = target.compile(source, "c", FLAGS, "kernel")
    assert res.ok, res.message
    session = target.session(problem, settings.threads)
    try:
        session.load_artifact("k", res.artifact, "kernel")
        # no device: no speed-of-light floor, so only the output checks can reject
        return measure(session, ["k"], problem, shape, InputPool(problem, 1), 1 << 20, settings)
    finally:
        session.close()


def test_a_kernel_that_skips_some_timed_calls_is_caught_after_the_timing(settings):
    """A per-shape counter that sets off inside the timing: at 512x4096 (tens of milliseconds a call) the
    warm-up makes 2 or 3 calls and the timing 31, of which the last dozen or so skip their work. Each of the
    two timing sets was computed by an early honest call and still holds that right answer, so the timing's
    checks pass (the judge before the probe accepted this kernel, at a median that was its honest calls'). The
    probe's checked call is the first at 512x4096 since the timing, and it writes nothing."""
    res = _measure_cpu(_short_timing(settings, 31), PER_SHAPE_COUNTER, {"rows": 512, "cols": 4096})
    assert res.reason == pb.WRONG_RESULT, (pb.RejectReason.Name(res.reason), res.message)
    assert res.failed_key == "k" and not res.timings
    assert res.failed_input is None  # the call count exposed it, not an input memory could replay


def test_an_honest_kernel_passes_the_probe(settings):
    res = _measure_cpu(_short_timing(settings, 31), (ADVERSARIAL / "honest/fast.c").read_text(),
                       {"rows": 64, "cols": 1000})
    assert res.reason == pb.REJECT_REASON_UNSPECIFIED, res.message
    assert res.timings["k"].samples == 31 and res.timings["k"].output_checked


# -- the same check over the cuda session's protocol, on the fake driver (tests/cuda_fake.py) ---------------

from cuda_fake import _softmax_kernel  # noqa: E402
from test_cuda_runtime import fake_cuda, fake_session  # noqa: E402,F401 (fixtures)


@pytest.mark.parametrize("mode", ["events", "graph"])
def test_the_probe_catches_a_gpu_kernel_that_stops_after_the_timing(
        fake_session, fake_cuda, settings, monkeypatch, mode):  # noqa: F811 (the fixtures imported above)
    """A kernel (launches counted on the device) that computes every launch of its timing and stops writing
    right after it: nothing the timing saw was wrong, the probe's checked launch is. Through CudaSession's
    bench and call, so the probe needs nothing of the cuda runner child that the cpu one lacks."""
    launches = {"n": 0, "honest": float("inf")}

    def counting(raw):
        launches["n"] += 1
        if launches["n"] <= launches["honest"]:
            _softmax_kernel(raw)

    fake_cuda.kernels["counting"] = (4, counting)
    real_bench = type(fake_session).bench
    benches = []

    def bench(self, keys, shape, input_sets, **kw):
        kw["mode"] = mode
        out = real_bench(self, keys, shape, input_sets, **kw)
        if not benches:  # the timing is over: from the next launch on, write nothing
            launches["honest"] = launches["n"]
        benches.append(len(out.samples[keys[0]]))
        return out

    monkeypatch.setattr(type(fake_session), "bench", bench)
    fake_session.load_artifact("k", b"cubin-k", "counting", {"grid": "rows", "block": "256"})
    problem = load_problem("softmax")
    res = measure(fake_session, ["k"], problem, {"rows": 4, "cols": 50}, InputPool(problem, 1), 1 << 12,
                  _short_timing(settings, 6))
    assert res.reason == pb.WRONG_RESULT, (pb.RejectReason.Name(res.reason), res.message)
    assert benches[0] == 6 and sum(benches[1:]) >= PROBE_MIN_CALLS  # the calls between timing and check


def test_an_honest_gpu_kernel_passes_the_probe(fake_session, settings):  # noqa: F811 (the fixture imported above)
    fake_session.load_artifact("k", b"cubin-k", "kernel", {"grid": "rows", "block": "256"})
    problem = load_problem("softmax")
    res = measure(fake_session, ["k"], problem, {"rows": 4, "cols": 50}, InputPool(problem, 1), 1 << 12,
                  _short_timing(settings, 6))
    assert res.reason == pb.REJECT_REASON_UNSPECIFIED, res.message
    assert res.timings["k"].output_checked

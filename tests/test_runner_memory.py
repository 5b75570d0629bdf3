"""The runner's address-space limit holds the kernel's own allocations, not the harness's buffers
(kfactory/sandbox/child.py Child.fit_limit): a timing whose shared buffers exceed KFACTORY_RUNNER_MEM_MB runs,
where a fixed limit failed its mapping (a harness error on a host whose large cache asks for many timing sets),
and a kernel that allocates past the limit is still refused while those buffers are mapped. Also how many timing
sets kernels timed together take each (checks.n_sets with `kernels`)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from kfactory.judge import inputs as inp
from kfactory.judge.checks import n_sets, set_bytes
from kfactory.problems import load_problem
from kfactory.targets import get_target

#: writes 1 into y[0] when a 1 GiB allocation is refused, 0 when it is granted; softmax's ABI. The source rules
#: refuse malloc in a candidate (targets/cpu/rules.py), so it is built here with cc: the limit is the runner's,
#: for whatever its process allocates (the OpenMP runtime, a baseline's Python)
GREEDY = """
#include <stdint.h>
#include <stdlib.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    void *p = malloc((size_t)1 << 30);
    y[0] = p == NULL ? 1.0f : 0.0f;
    free(p);
    for (int64_t i = 1; i < rows * cols; i++) y[i] = x[i];
}
"""
SHAPE = {"rows": 2048, "cols": 2048}   # 16 MiB in, 16 MiB out per set


def _greedy(tmp: Path) -> bytes:
    (tmp / "greedy.c").write_text(GREEDY)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp / "greedy.so"), str(tmp / "greedy.c")],
                   check=True)
    return (tmp / "greedy.so").read_bytes()


def _bench(settings, keys: list[str], sets: int, tmp: Path):
    problem = load_problem("softmax")
    target = get_target("cpu", settings)
    session = target.session(problem, 1)
    try:
        ref = target.compile((problem.directory / "reference_cpu.c").read_text(), "c", "-O2", "kernel")
        assert ref.ok, ref.message
        for k in keys:
            session.load_artifact(k, _greedy(tmp) if k == "greedy" else ref.artifact, "kernel")
        drawn = [inp.draw(problem, SHAPE, "normal", inp.fresh_seed()) for _ in range(sets)]
        return session.bench(keys, SHAPE, drawn, min_samples=2, min_s=0.0, max_s=5.0, noise=1e9, warmup_s=0.0)
    finally:
        session.close()


@pytest.mark.parametrize("arenas", [False, True])
def test_buffers_over_the_limit_are_mapped_and_a_greedy_kernel_is_still_refused(settings, tmp_path, arenas):
    # 3 kernels x 12 sets x 32 MiB = 1.1 GiB of buffers in one request, twice the runner's 512 MiB: in fresh
    # files, or in an arena the runner keeps mapped
    s = settings.model_copy(update={"runner_mem_mb": 512, "runner_arenas": arenas, "runner_timeout_s": 20.0})
    res = _bench(s, ["a", "b", "greedy"], 12, tmp_path)
    assert all(len(res.samples[k]) >= 2 for k in ("a", "b", "greedy"))
    # the buffers did not make room for the kernel: its 1 GiB is refused, in every set it reached
    assert [float(o["y"].flat[0]) for o in res.outputs["greedy"]] == [1.0] * len(res.outputs["greedy"])
    # and the reference's outputs are softmax rows (the buffers hold what was written)
    np.testing.assert_allclose(res.outputs["a"][0]["y"].sum(axis=1), 1.0, rtol=1e-4)


def test_a_kernel_under_the_limit_may_allocate(settings, tmp_path):
    s = settings.model_copy(update={"runner_mem_mb": 2048, "runner_timeout_s": 20.0})
    res = _bench(s, ["greedy"], 2, tmp_path)
    assert [float(o["y"].flat[0]) for o in res.outputs["greedy"]] == [0.0] * len(res.outputs["greedy"])


def test_kernels_timed_together_share_the_cache_s_sets():
    problem = load_problem("softmax")
    shape = {"rows": 4096, "cols": 4096}
    one = set_bytes(problem, shape)   # 128 MiB
    cache = 960 << 20                 # twice a 480 MiB last-level cache
    assert n_sets(problem, shape, cache) == 8
    assert n_sets(problem, shape, cache, kernels=2) == 4
    assert n_sets(problem, shape, cache, kernels=3) == 3
    assert n_sets(problem, shape, cache, kernels=5) == 2    # never fewer than two: the inputs still change
    for k in range(1, 8):   # together they pass at least the cache through it
        assert k * n_sets(problem, shape, cache, kernels=k) * one >= cache

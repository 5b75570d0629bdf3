"""Inputs drawn ahead (kfactory.judge.checks.InputPool.serving, verify.drawn_ahead, measure.drawn_ahead): a candidate's
input sets and their float64 references are made before its work takes the device, and the judge then draws
nothing of its own while it holds the device, yet every set is as fresh as before and used as often as before."""
from __future__ import annotations

import gc
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from kfactory.judge import checks, quiet
from kfactory.judge import measure as measure_mod
from kfactory.judge import verify as verify_mod
from kfactory.judge.checks import InputPool, RegressionInput
from kfactory.observability import stagetime
from kfactory.observability.stagetime import span
from kfactory.problems import load_problem
from kfactory.targets import get_target
from kfactory.sandbox.parent import Runner
from kfactory.sandbox.protocol import Bench
from conftest import until
from test_campaign import _campaign
from kfactory.v1 import events_pb2 as pb

SMALL = {"rows": 3, "cols": 1000}
LARGE = {"rows": 1025, "cols": 1024}   # over checks.LARGE_ELEMENTS: shared by `reuse` uses
ADVERSARIAL = Path(__file__).parent / "adversarial"


@pytest.fixture(scope="module")
def softmax():
    return load_problem("softmax")


def _drawing_in(fn):
    """fn's result and the seconds of drawing and references recorded while it ran (under a span of its own)."""
    before = stagetime.snapshot()
    with span("probe-of-ahead"):
        out = fn()
    got = stagetime.since(before)
    return out, {p.split("/")[-1] for p in got if p.startswith("probe-of-ahead/")}


def test_a_small_set_drawn_ahead_is_handed_out_once_and_only_by_its_view(softmax):
    pool = InputPool(softmax, reuse=8)
    ahead: dict = {}
    pool.ahead_check(ahead, SMALL, "normal")
    view = pool.serving(ahead)
    (x, ref, seed), drawn = _drawing_in(lambda: view.get(SMALL, "normal"))
    assert drawn == set()  # nothing drawn or referenced under the device
    assert np.array_equal(ref["y"], pool.drawn(SMALL, "normal", seed)[1]["y"])  # the set its seed draws
    (_, _, again), drawn = _drawing_in(lambda: view.get(SMALL, "normal"))
    assert again != seed and drawn == {"drawing", "references"}  # used once, as any small set: the next is new
    # the pool itself, and another candidate's view, never see this candidate's sets
    other: dict = {}
    pool.ahead_check(other, SMALL, "normal")
    assert pool.get(SMALL, "normal")[2] not in (seed, other[(softmax.shape_str(SMALL), "normal")][0][2])


def test_a_large_set_drawn_ahead_is_the_next_shared_draw(softmax, monkeypatch):
    monkeypatch.setattr(checks, "LARGE_ELEMENTS", 100)  # SMALL counts as large
    pool = InputPool(softmax, reuse=2)
    ahead: dict = {}
    pool.ahead_check(ahead, SMALL, "normal")
    assert ahead == {}  # shared, not the candidate's own
    view = pool.serving(ahead)
    (first, drawn) = _drawing_in(lambda: [view.get(SMALL, "normal")[2] for _ in range(2)])
    assert first[0] == first[1] and drawn == set()  # shared by `reuse` uses, drawn before
    pool.ahead_check(ahead, SMALL, "normal")  # used up: drawn again now
    seeds, drawn = _drawing_in(lambda: [pool.get(SMALL, "normal")[2] for _ in range(2)])
    assert seeds[0] == seeds[1] != first[0] and drawn == set()
    pool.ahead_check(ahead, SMALL, "normal")  # used up again; this time one use is left after one get
    pool.get(SMALL, "normal")
    _, drawn = _drawing_in(lambda: pool.ahead_check(ahead, SMALL, "normal"))
    assert drawn == set()  # a draw with a use left is not drawn again ahead


def test_own_sets_and_regressions_drawn_ahead(softmax):
    pool = InputPool(softmax, reuse=4)
    ahead: dict = {}
    calls = []

    def make():
        calls.append(1)
        return pool.drawn(SMALL, "normal", len(calls))

    for _ in range(2):
        pool.ahead_own(ahead, ("k",), make)
    reg = RegressionInput(softmax.shape_str(SMALL), "uniform", 12345)
    pool.ahead_regression(ahead, reg)
    view = pool.serving(ahead)
    got, drawn = _drawing_in(lambda: [view.own(("k",), make)[2], view.own(("k",), make)[2],
                                      view.regression_set(reg)])
    assert drawn == set() and sorted(got[:2]) == [1, 2] and len(calls) == 2
    x, _, seed = got[2]
    assert seed == 12345 and np.array_equal(x["x"], pool.regression_set(reg)[0]["x"])  # its seed's values
    assert view.own(("k",), make)[2] == 3  # the two made ahead are used: the third is made now


def test_threads_never_get_one_small_set_twice(softmax):
    pool = InputPool(softmax, reuse=8)
    seeds: list[int] = []
    lock = threading.Lock()

    def use():
        for _ in range(20):
            s = pool.get({"rows": 1, "cols": 8}, "normal")[2]
            with lock:
                seeds.append(s)

    threads = [threading.Thread(target=use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seeds) == 80 and len(set(seeds)) == 80


@pytest.fixture
def honest_session(settings, small_softmax):
    target = get_target("cpu", settings)
    res = target.compile((ADVERSARIAL / "honest/fast.c").read_text(), "c", "-O2 -fopenmp", "kernel")
    assert res.ok, res.message
    session = target.session(load_problem(small_softmax), settings.threads)
    session.load_artifact("k", res.artifact, "kernel")
    yield session
    session.close()


def test_a_verification_drawn_ahead_draws_nothing_and_checks_as_much(honest_session, small_softmax):
    softmax = load_problem(small_softmax)
    pool = InputPool(softmax, reuse=8, regressions=[RegressionInput("7x33", "large", 99)])
    plain = verify_mod.verify(honest_session, "k", softmax, pool)
    view = verify_mod.drawn_ahead(honest_session, softmax, pool)
    ahead, drawn = _drawing_in(lambda: verify_mod.verify(honest_session, "k", softmax, view))
    assert plain.passed and ahead.passed, (plain.message, ahead.message)
    assert "references" not in drawn and "drawing" not in drawn
    assert [(c.shape, c.distribution) for c in ahead.checks] == [(c.shape, c.distribution) for c in plain.checks]
    fresh = [c.seed for c in ahead.checks if not c.distribution.startswith(("regression", "memo:near"))]
    assert len(set(fresh)) == len(fresh)  # every check on a set of its own, and none shared with the first run
    assert not set(fresh) & {c.seed for c in plain.checks if not c.distribution.startswith("regression")}
    assert [c.seed for c in ahead.checks if c.distribution.startswith("regression")] == [99]


def test_a_measurement_drawn_ahead_computes_no_reference(honest_session, small_softmax, settings):
    softmax = load_problem(small_softmax)
    pool = InputPool(softmax, reuse=8)
    shape = {"rows": 64, "cols": 1000}
    view = measure_mod.drawn_ahead(honest_session, softmax, [shape], pool, 1 << 20)
    res, drawn = _drawing_in(lambda: measure_mod.measure(honest_session, ["k"], softmax, shape, view, 1 << 20,
                                                          settings))
    assert res.reason == pb.REJECT_REASON_UNSPECIFIED, res.message
    assert res.timings["k"].output_checked
    # the timing sets and the checked call's set came drawn with their references; only the probe's two unchecked
    # sets at the smallest shape (1x1, no reference) are drawn under the device
    assert "references" not in drawn


def test_drawing_ahead_waits_for_a_host_timing_to_end(softmax):
    """A set drawn ahead is host work (kfactory.judge.quiet): on the cpu target numpy beside a timed kernel would
    slow the kernel's timing, so it waits until the timing ends."""
    pool = InputPool(softmax, reuse=8)
    started, release = threading.Event(), threading.Event()

    def timed():
        with quiet.timing(on_host=True):
            started.set()
            release.wait(10)

    t = threading.Thread(target=timed)
    t.start()
    started.wait(10)
    ahead: dict = {}
    drawer = threading.Thread(target=pool.ahead_check, args=(ahead, SMALL, "normal"))
    drawer.start()
    drawer.join(0.3)
    assert drawer.is_alive() and ahead == {} and quiet.state() == (1, 0, 0, 0)  # waiting while the timing runs
    release.set()
    drawer.join(10)
    t.join(10)
    assert not drawer.is_alive() and len(ahead[(softmax.shape_str(SMALL), "normal")]) == 1
    assert quiet.state() == (0, 0, 0, 0)


def test_a_host_timing_waits_for_host_work_and_holds_new_work_off():
    order: list[str] = []
    working, release = threading.Event(), threading.Event()

    def work(name, hold=None):
        with quiet.host_work():
            order.append(f"{name} starts")
            if hold is not None:
                working.set()
                hold.wait(10)
            order.append(f"{name} ends")

    def timing():
        with quiet.timing(on_host=True):
            order.append("timing")

    first = threading.Thread(target=work, args=("draw 1", release))
    first.start()
    working.wait(10)
    timer = threading.Thread(target=timing)
    timer.start()
    timer.join(0.2)
    assert timer.is_alive() and quiet.state() == (0, 1, 1, 0)  # the timing waits for the draw running
    second = threading.Thread(target=work, args=("draw 2",))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # new host work waits behind the waiting timing
    release.set()
    for t in (first, timer, second):
        t.join(10)
    assert order == ["draw 1 starts", "draw 1 ends", "timing", "draw 2 starts", "draw 2 ends"]


def _state(pid: int) -> str:
    """A process's state letter (/proc/PID/stat: T stopped, R running, S sleeping)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _stop_pending(pid: int) -> bool:
    """Whether a SIGSTOP is pending for the process (/proc/PID/status ShdPnd or SigPnd): sent, and taken before
    the process runs any more of its own code."""
    masks = {k: int(v, 16) for k, v in (line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text()
                                        .splitlines() if line.startswith(("ShdPnd", "SigPnd")))}
    return any(m & (1 << (signal.SIGSTOP - 1)) for m in masks.values())


def _quiet_state(pid: int) -> str:
    """_state, with "T" for a process whose SIGSTOP is still pending: asleep (S, D) when the timing stopped it, or
    just woken (R) to take the signal, it stops before it runs any more of its own code (a process asleep when
    SIGSTOP came read R, then T, a moment later, here)."""
    # pending first: the kernel clears it and stops the process in one step, so a stop taken between the two
    # reads shows as T in the state read after
    return "T" if _stop_pending(pid) else _state(pid)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_a_compiler_and_the_programs_it_started_are_stopped_while_a_host_timing_runs():
    """A compile beside the device is never beside a timing: its process and those it started (a compiler driver's
    cc1, as, ld) are stopped for the timing and go on after it, so the device waits for no compile."""
    script = "sh -c 'while :; do :; done' & while :; do :; done"  # a busy parent with a busy child
    with subprocess.Popen(["sh", "-c", script]) as proc:
        try:
            with quiet.process(proc.pid):
                child = until(lambda: quiet._children(proc.pid), 10, "the shell's child", every_s=0.02)
                assert len(child) == 1
                with quiet.timing(on_host=True):
                    # stopped at once (a stop still pending is taken before either runs any more of its own code);
                    # their CPU ticks are read once the stops have taken effect
                    assert _quiet_state(proc.pid) == _quiet_state(child[0]) == "T"
                    until(lambda: _state(proc.pid) == _state(child[0]) == "T", 10, "both stopped", every_s=0.02)
                    ticks = (_cpu_ticks(proc.pid), _cpu_ticks(child[0]))
                    time.sleep(0.3)
                    assert (_cpu_ticks(proc.pid), _cpu_ticks(child[0])) == ticks  # no CPU while the timing runs
                    assert quiet.state() == (1, 0, 0, 2)
                until(lambda: _state(proc.pid) in "RS" and _state(child[0]) in "RS", 10, "both going on",
                      every_s=0.02)
                assert quiet.state() == (0, 0, 0, 0)
                with quiet.timing(on_host=False):  # a kernel timed elsewhere (a GPU) stops nothing
                    time.sleep(0.1)
                    assert _state(proc.pid) in "RS"
        finally:
            subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
            proc.kill()


def test_a_compiler_started_during_a_host_timing_is_stopped_at_once():
    with quiet.timing(on_host=True), subprocess.Popen(["sh", "-c", "while :; do :; done"]) as proc:
        try:
            with quiet.process(proc.pid):
                assert _quiet_state(proc.pid) == "T"
        finally:
            proc.kill()
    assert quiet.state() == (0, 0, 0, 0)


async def test_in_a_campaign_nothing_of_its_own_runs_beside_a_timing(bus_settings, small_softmax, monkeypatch):
    """In a real campaign (six services, a real nats-server, compiles running ahead of the device), every timing on
    the host's cores finds no draw of the judge's running and every compiler of the campaign stopped."""
    seen: list[tuple] = []
    real = Runner.request

    def request(self, req, *args, **kwargs):
        if isinstance(req, Bench):  # a timing, as the runner is about to be asked for it
            procs = sorted(quiet._procs)
            seen.append((quiet.state()[2], [_quiet_state(p) for p in procs if Path(f"/proc/{p}").exists()]))
        return real(self, req, *args, **kwargs)

    monkeypatch.setattr(Runner, "request", request)
    spec = pb.CampaignSpec(problem=small_softmax, target="cpu", budget_candidates=8, strategy="random", seed=5)
    # every kernel compiled here (not read from the session's compile cache): compilers run beside the timings
    st, _ = await _campaign(bus_settings.model_copy(update={"cpu_object_cache": None}), spec)
    assert st.finished.state == "completed"
    assert len(seen) >= 8
    assert all(host == 0 for host, _ in seen), seen
    assert all(state in ("T", "Z") for _, states in seen for state in states), \
        [s for s in seen if any(state not in ("T", "Z") for state in s[1])]  # the offending timings only


def test_a_timing_that_fails_while_stopping_leaves_nothing_stopped_or_shut(monkeypatch):
    """A Ctrl-C (or any error) while a timing stops the compilers: the timing never began, the gate is open and
    every process it had stopped goes on."""
    with subprocess.Popen(["sh", "-c", "while :; do :; done"]) as proc:
        try:
            with quiet.process(proc.pid):
                real = quiet._stop

                def stop_then_fail(pid):
                    real(pid)
                    raise KeyboardInterrupt

                monkeypatch.setattr(quiet, "_stop", stop_then_fail)
                with pytest.raises(KeyboardInterrupt), quiet.timing(on_host=True):
                    pass
                assert quiet.state() == (0, 0, 0, 0)
                time.sleep(0.1)
                assert _state(proc.pid) in "RS"
        finally:
            proc.kill()
    assert quiet._state(proc.pid) == ""  # reaped: no state, no error


def test_time_stopped_does_not_count_toward_a_compilers_limit():
    release = threading.Event()

    def hold():
        with quiet.timing(on_host=True):
            release.wait(10)

    got: list = []
    compiler = threading.Thread(target=lambda: got.append(quiet.run_compiler(["sh", "-c", "sleep 0.5"], 1.0)))
    compiler.start()
    time.sleep(0.1)
    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(1.5)  # past the compiler's 1 s limit, all but 0.1 s of it stopped
    release.set()
    holder.join(10)
    compiler.join(10)
    assert got == [(0, "")]  # finished once resumed, not killed as too slow


def test_compilers_stopped_by_a_process_that_dies_go_on(tmp_path):
    """The guard: kfactory killed (SIGKILL) in the middle of a timing leaves no compiler stopped for good."""
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "from kfactory.judge import quiet\n"
        "proc = subprocess.Popen(['sh', '-c', 'while :; do :; done'], stdout=subprocess.DEVNULL,\n"
        "                        stderr=subprocess.DEVNULL)\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(proc.pid))\n"
        "print(proc.pid, flush=True)\n"
        "with quiet.process(proc.pid), quiet.timing(on_host=True):\n"
        "    time.sleep(0.2)\n"
        "    print('stopped', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    try:
        # its stdout read line by line: the guard it starts outlives it by a moment and keeps stderr open
        with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as run:
            assert run.stdout is not None
            pid, said = int(run.stdout.readline()), run.stdout.readline().strip()
            returncode = run.wait(60)
        assert said == "stopped" and returncode == -9
        deadline = time.monotonic() + 5
        while _state(pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(pid) in ("R", "S")
    finally:  # the busy loop, whatever failed (its pid written before anything could)
        if (tmp_path / "pid").exists():
            subprocess.run(["kill", "-9", (tmp_path / "pid").read_text()], check=False)


def test_regression_sets_are_not_kept_in_the_pool(softmax):
    pool = InputPool(softmax, reuse=8)
    for seed in range(5):
        pool.regression_set(RegressionInput(softmax.shape_str(SMALL), "normal", seed))
    assert not any("regression" in key for key in pool._sets)


def test_a_timing_waits_for_half_a_set_drawn_ahead(softmax):
    """A set drawn ahead is two pieces of host work, its draw and its float64 reference: a timing that asks while the
    draw runs goes between them, and waits for no reference."""
    big = {"rows": 4096, "cols": 4096}   # a draw of 16M elements: a tenth of a second, long enough to ask inside
    pool = InputPool(softmax, reuse=8)
    inside: list = []

    def timed():
        with quiet.timing(on_host=True):
            inside.append(stagetime.snapshot().get("references", (0.0, 0))[1])

    refs_before = stagetime.snapshot().get("references", (0.0, 0))[1]
    drawer = threading.Thread(target=pool.ahead_check, args=({}, big, "normal"))
    drawer.start()
    deadline = time.monotonic() + 10
    while quiet.state()[2] == 0 and time.monotonic() < deadline:  # the draw's host work has begun
        time.sleep(0.001)
    t = threading.Thread(target=timed)
    t.start()
    while quiet.state()[1] == 0 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    t.join(20)
    drawer.join(20)
    assert inside == [refs_before]  # the timing ran after the draw and before its reference
    assert stagetime.snapshot()["references"][1] == refs_before + 1
    assert quiet.state() == (0, 0, 0, 0)


def test_a_small_shapes_timing_pool_is_shared_like_a_large_set(softmax):
    """A timing pool of many small sets (softmax 1x50257: a set per 400 KB of twice the cache) costs as much to draw
    and reference as one large set, and is shared by `reuse` uses as one; a single small set is not."""
    small = {"rows": 1, "cols": 50257}
    cache = 64 << 20  # the cpu target's: twice a 32 MiB last-level cache
    pool = InputPool(softmax, reuse=3)
    seeds = [tuple(pool.timing_sets(small, cache)[2]) for _ in range(4)]
    assert len(seeds[0]) == checks.n_sets(softmax, small, cache) > 100
    assert seeds[0] == seeds[1] == seeds[2] != seeds[3]  # three uses, then a fresh draw
    assert set(seeds[0]).isdisjoint(seeds[3])
    # a pool of two sets of a tiny shape stays under LARGE_ELEMENTS: drawn anew for every use
    tiny = {"rows": 3, "cols": 1000}
    assert pool.timing_sets(tiny, 1)[2] != pool.timing_sets(tiny, 1)[2]


def test_a_pinned_view_gives_one_draw_to_every_rotation_as_one_use(softmax):
    """InputPool.pinned_timing: a rotated timing's timings all get the pool's next draw, which counts as one use of
    a shared draw (so none of them draws under the device once the first has its sets)."""
    small = {"rows": 1, "cols": 50257}
    cache = 64 << 20
    pool = InputPool(softmax, reuse=2)
    view = pool.pinned_timing(small, cache, 3)
    seeds = [tuple(view.timing_sets(small, cache)[2]) for _ in range(3)]
    assert seeds[0] == seeds[1] == seeds[2]
    assert tuple(pool.timing_sets(small, cache)[2]) == seeds[0]  # the second use of two
    assert set(pool.timing_sets(small, cache)[2]).isdisjoint(seeds[0])  # used up: drawn again
    # a pool too small to share is drawn anew for every use, but once for a pinned view
    tiny = {"rows": 3, "cols": 1000}
    view = pool.pinned_timing(tiny, 1, 2)
    assert view.timing_sets(tiny, 1)[2] == view.timing_sets(tiny, 1)[2] != pool.timing_sets(tiny, 1)[2]


def test_a_pinned_view_takes_the_sets_drawn_ahead_and_keeps_the_others(softmax):
    """The pinned draw is the one drawn ahead where there is one; the view's other sets drawn ahead (the probe's)
    are the candidate's as before."""
    tiny = {"rows": 3, "cols": 1000}
    pool = InputPool(softmax, reuse=8)
    ahead: dict = {}
    pool.ahead_timing(ahead, tiny, 1)
    pool.ahead_probe(ahead, tiny)
    drawn, probe = ahead[("3x1000", "timing")][0][2], ahead[("3x1000", "probe")][0][2]
    view = pool.serving(ahead).pinned_timing(tiny, 1, 2)
    assert view.timing_sets(tiny, 1)[2] == view.timing_sets(tiny, 1)[2] == drawn
    assert view.probe_set(tiny)[2] == probe and not ahead[("3x1000", "probe")]


def test_screening_sets_drawn_ahead_are_every_screens_and_drawn_once(softmax, monkeypatch):
    """InputPool.ahead_screen draws the screening sets before the device is held (as host work); the screens then
    take them without drawing, and a second call draws nothing."""
    shape, cache = {"rows": 64, "cols": 4096}, 8 << 20
    pool = InputPool(softmax, reuse=8)
    before = stagetime.snapshot().get("drawing", (0.0, 0))[1]
    pool.ahead_screen(shape, cache)
    drawn = stagetime.snapshot()["drawing"][1] - before
    assert drawn == checks.n_sets(softmax, shape, cache) >= 2
    sets = pool.screen_sets(shape, cache)
    pool.ahead_screen(shape, cache)
    assert pool.screen_sets(shape, cache) is sets and len(sets) == drawn
    assert stagetime.snapshot()["drawing"][1] - before == drawn


def test_screening_sets_are_drawn_once_by_threads_at_once(softmax, monkeypatch):
    """A second ahead_screen, or a screen, while one ahead_screen draws waits for that draw instead of drawing its
    own (softmax 4096x4096: 2.7 s and 512 MiB a draw)."""
    shape, cache = {"rows": 64, "cols": 4096}, 8 << 20
    pool = InputPool(softmax, reuse=8)
    started, calls, real = threading.Event(), [], checks.inp.draw

    def slow(*a, **kw):
        calls.append(1)
        started.set()
        time.sleep(0.05)
        return real(*a, **kw)
    monkeypatch.setattr(checks.inp, "draw", slow)
    threads = [threading.Thread(target=pool.ahead_screen, args=(shape, cache)) for _ in range(2)]
    threads[0].start()
    assert started.wait(10)
    threads[1].start()
    sets = pool.screen_sets(shape, cache)
    for t in threads:
        t.join(20)
    assert len(calls) == len(sets) == checks.n_sets(softmax, shape, cache)
    assert pool.screen_sets(shape, cache) is sets



@pytest.mark.parametrize("reuse", [1, 3])
def test_a_used_up_set_goes_with_its_last_user(softmax, reuse):
    """A large set serves `reuse` checks, then the pool lets it go: `kfactory check` (reuse 1) held every set of
    its verification until the end of its measurement, 1 GB for softmax 4096x4096."""
    pool_get = InputPool(softmax, reuse=reuse).get
    first = pool_get(LARGE, "normal")
    held = weakref.ref(first[0]["x"])
    for _ in range(reuse - 1):
        assert pool_get(LARGE, "normal")[2] == first[2]   # the same draw, shared
    seed = first[2]
    del first
    gc.collect()
    assert held() is None
    assert pool_get(LARGE, "normal")[2] != seed   # drawn again


def test_a_small_set_is_never_held(softmax):
    pool = InputPool(softmax, reuse=8)
    x, _, seed = pool.get(SMALL, "normal")
    held = weakref.ref(x["x"])
    del x
    gc.collect()
    assert held() is None and pool.get(SMALL, "normal")[2] != seed

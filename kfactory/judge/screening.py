"""Multi-fidelity: cheap evidence first. The compiler's resource report prunes candidates that cannot launch
or will spill before they reach a GPU; a short screening timing keeps the full measurement for candidates
that might beat the campaign's best."""
from __future__ import annotations

from kfactory.judge.checks import fault_reason, n_sets, timed_on_device, timing_dist
from kfactory.judge.measure import NO_NOISE_BOUND, Timing
from kfactory.sandbox.parent import RunnerFault
from kfactory.judge.stats import summarize
from kfactory.v1 import events_pb2 as pb

#: per-block and per-multiprocessor limits shared by sm_80, sm_90a and sm_100a (the CUDA programming guide's
#: compute capability table): threads per block, 32-bit registers per multiprocessor, opt-in shared memory
MAX_THREADS = 1024
REGISTERS_PER_SM = 65536
MAX_SHARED_BYTES = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024, "sm_100a": 227 * 1024}


def prune(report: pb.CompileReport, launch: dict | None, problem) -> str:
    """Why a compiled cuda candidate should not be run (an empty string when it may): spills, or a block
    that cannot launch at one of the optimisation shapes (threads, registers, shared memory), every one of which
    its measurement times, whatever the objective weighs (kfactory/judge/objective.py)."""
    if not report.arch:  # not a GPU artifact: nothing to prune on
        return ""
    if report.spill_store_bytes or report.spill_load_bytes:
        return (f"spills {report.spill_store_bytes} B stored / {report.spill_load_bytes} B loaded per thread "
                "(would run from local memory)")
    if not launch:
        return ""
    shapes = problem.shapes("optimize")
    for shape in shapes:
        at = f" at {problem.shape_str(shape)}" if len(shapes) > 1 else ""
        if why := _unlaunchable(report, launch, shape):
            return why + at
    return ""


def _unlaunchable(report: pb.CompileReport, launch: dict, shape: dict[str, int]) -> str:
    """Why the block of `launch` at `shape` cannot launch with `report`'s resources ("" when it can)."""
    from kfactory.targets.cuda.launch import evaluate_launch

    try:
        rule = evaluate_launch(launch, shape)
    except ValueError as e:
        return f"the launch rule gives no valid launch: {e}"
    threads = rule.threads
    if report.registers * threads > REGISTERS_PER_SM:
        return (f"{report.registers} registers x {threads} threads = {report.registers * threads} exceeds the "
                f"{REGISTERS_PER_SM} registers of a multiprocessor: the block cannot launch")
    shared = report.shared_bytes + rule.smem
    limit = MAX_SHARED_BYTES.get(report.arch, min(MAX_SHARED_BYTES.values()))
    if shared > limit:
        return f"{shared} B of shared memory per block exceeds {limit} B on {report.arch}"
    return ""


def screened_out(screen_s: float, best_s: float | None, factor: float) -> bool:
    """True when a screen's score (its median, or where the package weighs its shapes the score's lower bound:
    kfactory/judge/objective.py score_bound) is more than `factor` times the campaign's best so far."""
    return best_s is not None and screen_s > factor * best_s


def screen_ahead(session, pool, problem, shape: dict[str, int], cache_bytes: int) -> None:
    """What a screen at `shape` on the host's sets needs, made before the device is held: the screening sets
    (InputPool.ahead_screen) and the session's buffers for them (Session.ready_buffers)."""
    pool.ahead_screen(shape, cache_bytes)
    session.ready_buffers([(shape, 1, n_sets(problem, shape, cache_bytes))])


def screen(session, key: str, problem, shape: dict[str, int], pool, cache_bytes: int, settings,
           bar_s: float):
    """A screening timing of kernel `key` at `shape` (a kfactory.judge.measure.Timing): a short warm-up over the pool's
    screening sets, then settings.screen_min_samples timed calls, or fewer when they take longer than
    screen_max_s and screen_min_samples x `bar_s` together (the median at `shape` over which it is screened out:
    screen_factor x the campaign's best where the score is that shape's median): by then the kernel is far slower
    than anything that can rank. Nothing is checked and nothing else is run, since the
    only use of a screen is to spare a candidate that cannot rank its verification and measurement: one that
    passes is verified and measured in full; one that does not is screened out, which is never a result. A
    fault of the kernel (a crash, a hang) is a typed failure, as in any measurement. Where the session's
    device judges the shape (checks.timed_on_device), the sets are drawn there from the pool's screening
    seeds and not compared."""
    sname, dist = problem.shape_str(shape), timing_dist(problem)
    max_s = max(settings.screen_max_s, settings.screen_min_samples * bar_s)
    timing = dict(min_samples=settings.screen_min_samples, min_s=0.0, max_s=max_s, noise=NO_NOISE_BOUND,
                  warmup_s=SCREEN_WARMUP_S)
    try:
        if timed_on_device(session, problem, shape):   # drawn where the kernel runs: nothing drawn or sent here
            res = session.bench_drawn([key], shape, dist, pool.screen_seeds(shape, cache_bytes), compare=False,
                                      **timing)
        else:
            res = session.bench([key], shape, pool.screen_sets(shape, cache_bytes), **timing)
    except RunnerFault as e:
        return Timing(reason=fault_reason(e), failed_key=key, message=f"{sname} screening: {e}")
    t = summarize(res.samples[key], sname, problem.cost(shape)[0])
    t.mode = res.mode
    return Timing(timings={key: t})


#: a screen's warm-up: every input set once (page faults, caches), within ten times this
SCREEN_WARMUP_S = 0.02

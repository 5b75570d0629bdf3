"""Multi-fidelity: cheap evidence first. The compiler's resource report prunes candidates that cannot launch
or will spill before they reach a GPU; a short screening timing keeps the full measurement for candidates
that might beat the campaign's best."""
from __future__ import annotations

from kfactory.v1 import events_pb2 as pb

#: per-block and per-multiprocessor limits shared by sm_80, sm_90a and sm_100a (the CUDA programming guide's
#: compute capability table): threads per block, 32-bit registers per multiprocessor, opt-in shared memory
MAX_THREADS = 1024
REGISTERS_PER_SM = 65536
MAX_SHARED_BYTES = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024, "sm_100a": 227 * 1024}


def prune(report: pb.CompileReport, launch: dict | None, problem) -> str:
    """Why a compiled cuda candidate should not be run (an empty string when it may): spills, or a block
    that cannot launch at the first optimisation shape (threads, registers, shared memory)."""
    if not report.arch:  # not a GPU artifact: nothing to prune on
        return ""
    if report.spill_store_bytes or report.spill_load_bytes:
        return (f"spills {report.spill_store_bytes} B stored / {report.spill_load_bytes} B loaded per thread "
                "(would run from local memory)")
    if not launch:
        return ""
    from kfactory.targets.launch import evaluate_launch

    try:
        rule = evaluate_launch(launch, problem.shapes("optimize")[0])
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
    """True when a screening median is more than `factor` times the campaign's best so far."""
    return best_s is not None and screen_s > factor * best_s

"""Kernels the kernel pipeline searched for an engine's ops, linked into the engine in place of its own.

The matvec over quantised blocks is a decode step's main cost, and it is also a problem of its own
(`matvec_q4_1`, `matvec_q8_0` in kfactory/problems/): campaigns search, verify and measure kernels for it on the
model's shapes, and memory keeps them. An engine design whose `matvec_q4_1` / `matvec_q8_0` field names one of
those candidates (design.py) links that kernel in: its verified source, its entry renamed to the symbol the
engine calls (`kf_op_matvec_q4_1`, ...), compiled as its own translation unit with the flags it was verified with
(re-checked against the cpu target's whitelist: they come from an archive, and a flag can run a program), its
source re-checked against the cpu target's sandbox rules, and every global symbol but its entry made local.
The whole engine is then verified token for token like any other design: a kernel that passed its op's judge
but breaks the engine still fails there.

`OpKernel` carries everything needed to rebuild the engine later (source and flags, not only the id), so a
campaign's record and best.json are enough for `kfactory generate`, the bench and an export.
"""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kfactory.engines.build import BuildResult, Unit, build
from kfactory.engines.codegen import generate
from kfactory.engines.design import EngineDesign
from kfactory.models.gguf_model import LlamaConfig

#: the design field (= the op's problem name) and the symbol the engine calls it by
SYMBOLS = {"matvec_q4_1": "kf_op_matvec_q4_1", "matvec_q8_0": "kf_op_matvec_q8_0"}


class OpKernelError(ValueError):
    """A kernel cannot be linked into an engine (not verified, wrong problem or target, flags refused); the
    message says which and why."""


@dataclass(frozen=True)
class OpKernel:
    """One verified kernel of an op problem: `problem` (a key of SYMBOLS), `candidate_id`, its C `source` with
    the entry `entry`, and the compile `flags` it was verified with."""
    problem: str
    candidate_id: str
    source: str
    flags: str
    entry: str = "kernel"

    def unit(self) -> Unit:
        """The kernel as a translation unit of the engine: entry renamed, flags checked."""
        from kfactory.export.errors import ExportError
        from kfactory.export.rename import rename_symbols
        from kfactory.targets.cpu.rules import check_source
        from kfactory.targets.flags import FlagRefused, check_flags

        if self.problem not in SYMBOLS:
            raise OpKernelError(f"{self.problem!r} is not an op an engine links in; ops: {', '.join(SYMBOLS)}")
        try:
            words = check_flags("cpu", self.flags)
        except FlagRefused as exc:
            raise OpKernelError(f"{self.problem} kernel {self.candidate_id[:12]}: {exc}") from exc
        broken = check_source(self.source)
        if broken:   # it passed these rules to be verified; an archive edited since then is refused here
            raise OpKernelError(f"{self.problem} kernel {self.candidate_id[:12]} breaks a sandbox rule: {broken[0]}")
        try:
            source = rename_symbols(self.source, {self.entry: SYMBOLS[self.problem]})
        except ExportError as exc:
            raise OpKernelError(f"{self.problem} kernel {self.candidate_id[:12]}: {exc}") from exc
        # the entry hidden: linked into the engine, never exported by it (a program that loads two engines, or
        # an engine and the kernel's own export, gets no clash); the problems' ABI, so a kernel whose entry has
        # another signature fails to compile (a typed build failure)
        hidden = ('#include <stdint.h>\n__attribute__((visibility("hidden"))) void '
                  f"{SYMBOLS[self.problem]}(const uint8_t *w, const float *x, float *y, int64_t rows, "
                  "int64_t blocks);\n")
        return Unit(hidden + source, tuple(words), (SYMBOLS[self.problem],))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OpKernel":
        return cls(**data)


def units_for(design: EngineDesign, kernels: dict[str, OpKernel]) -> tuple[Unit, ...]:
    """The translation units a design links in: one per searched kernel it names, found in `kernels` (by
    problem) with the same candidate id. Raises OpKernelError when one is missing."""
    out = []
    for problem, cid in sorted(design.searched_kernels().items()):
        k = kernels.get(problem)
        if k is None or k.candidate_id != cid:
            raise OpKernelError(f"design {design.design_id()} names {problem} kernel {cid[:12]}, which is not "
                                "among the kernels given to build it")
        out.append(k.unit())
    return tuple(out)


def build_engine(design: EngineDesign, config: LlamaConfig, kernels: dict[str, OpKernel] | None = None,
                 cache_dir: Path | None = None, extra_flags: tuple[str, ...] = ()) -> BuildResult:
    """A design's engine library: generated, its searched kernels linked in, built (cached by content);
    extra_flags go to the engine's own source (-DKF_PROFILE: bench/engine_ops.py's per-op timers)."""
    return build(generate(design, config), cache_dir, extra_flags, units=units_for(design, kernels or {}))


def kernels_of(record: dict[str, Any]) -> dict[str, OpKernel]:
    """The searched kernels a campaign record or best.json keeps ({} for a record without any)."""
    return {p: OpKernel.from_dict(k) for p, k in (record.get("kernels") or {}).items()}


def from_memory(settings, problem: str, max_threads: int, shape: str = "") -> OpKernel:
    """The fastest verified cpu kernel memory holds for an op problem (at `shape`; "" takes the archive's
    default) that runs at most `max_threads` threads (a kernel that starts more would hold cores the engine's
    design does not have), from the memory service when one is configured, else the local workspace. Raises
    OpKernelError saying how to get one when there is none."""
    from kfactory.cli.client import ClientError, best_entry

    if problem not in SYMBOLS:
        raise OpKernelError(f"{problem!r} is not an op an engine links in; ops: {', '.join(SYMBOLS)}")
    search = (f"search one with `kfactory run {problem} --target cpu --threads {max_threads}`")
    try:
        best = best_entry(settings, problem, shape, "cpu").candidate_id
        found = _usable(settings, best, max_threads)
        # the fastest runs more threads: the fastest of memory's measured points that fits (its priors query)
        for cid in ([] if found else _by_speed(settings, problem)):
            if found := _usable(settings, cid, max_threads):
                break
    except ClientError as exc:
        raise OpKernelError(f"no measured {problem} kernel in memory ({exc}); {search}") from exc
    if found is None:
        raise OpKernelError(f"no verified c kernel of {problem} in memory runs on at most {max_threads} "
                            f"thread{'s' if max_threads != 1 else ''}; {search}")
    cand = found.candidate
    return OpKernel(problem, cand.id, found.source, cand.compile_flags, cand.entry or "kernel")


def by_id(settings, problem: str, candidate_id: str) -> OpKernel:
    """The verified c kernel of op `problem` that memory holds as candidate `candidate_id` (the services' coder
    takes a design's kernels this way: the design names them by id), from the memory service when one is
    configured, else the local workspace. Raises OpKernelError naming what is wrong: no such candidate, another
    problem's, not verified, not c."""
    from kfactory.cli.client import ClientError, candidate_evidence
    from kfactory.export.evidence import NotVerified, judged

    if problem not in SYMBOLS:
        raise OpKernelError(f"{problem!r} is not an op an engine links in; ops: {', '.join(SYMBOLS)}")
    try:
        found = judged(candidate_evidence(settings, candidate_id))
    except ClientError as exc:
        raise OpKernelError(f"{problem} kernel {candidate_id[:12]} is not in memory: {exc}") from exc
    except NotVerified as exc:
        raise OpKernelError(f"{problem} kernel {candidate_id[:12]} is not a verified kernel: {exc}") from exc
    cand = found.candidate
    if Path(cand.problem.rstrip("/")).name != problem:   # a built-in name or a package directory named so
        raise OpKernelError(f"candidate {candidate_id[:12]} is a kernel of {cand.problem!r}, not of {problem}")
    if cand.language != "c":
        raise OpKernelError(f"{problem} kernel {candidate_id[:12]} is {cand.language!r}, not c: an engine links "
                            "c kernels only")
    return OpKernel(problem, cand.id, found.source, cand.compile_flags, cand.entry or "kernel")


def _usable(settings, candidate_id: str, max_threads: int):
    """The judged evidence (kfactory.export.evidence.Judged) of a verified c kernel of at most max_threads
    threads, or None."""
    from kfactory.cli.client import candidate_evidence
    from kfactory.export.evidence import NotVerified, judged

    try:
        found = judged(candidate_evidence(settings, candidate_id))
    except NotVerified:
        return None
    cand = found.candidate
    return found if cand.language == "c" and max(cand.threads, 1) <= max_threads else None


def _by_speed(settings, problem: str) -> list[str]:
    """Candidate ids of memory's measured points of the problem, fastest first."""
    import asyncio

    from kfactory.cli.client import _evidence
    from kfactory.platform.spec_ranges import PRIORS_LIMIT
    from kfactory.v1 import services_pb2 as spb

    request = spb.PriorsRequest(problem=problem, limit=int(PRIORS_LIMIT.high), every_source=True)
    priors = asyncio.run(_evidence(settings, "Priors", request)).priors
    return list(dict.fromkeys(p.candidate_id for p in sorted(priors, key=lambda p: p.score_s) if p.candidate_id))


def describe(kernels: dict[str, OpKernel]) -> str:
    """One line naming the kernels (for progress output)."""
    if not kernels:
        return "engine's own matvec kernels only"
    return ", ".join(f"{p} {k.candidate_id[:12]} ({shlex.join(k.flags.split())})" for p, k in sorted(kernels.items()))

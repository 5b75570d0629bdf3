"""What a candidate's evidence says, as an export needs it: whether it may be exported at all (it passed
verification and nothing turned it down), and the figures its files quote (device, times, speedups, checks)."""
from __future__ import annotations

import importlib.metadata
import json
from dataclasses import dataclass, field

from kfactory.bus import events as ev
from kfactory.evidence.verdicts import found_wrong
from kfactory.export.errors import ExportError
from kfactory.v1 import events_pb2 as pb
from kfactory.v1 import services_pb2 as spb

#: a rejection that says nothing about the kernel: the same content was already scheduled in its campaign
NOT_A_VERDICT = frozenset({pb.DUPLICATE})


class NotVerified(ExportError):
    """The evidence does not show a kernel that passed verification; the message says why, in one line."""


@dataclass
class Judged:
    """A candidate whose evidence shows it passed verification, with the results it quotes."""
    candidate: pb.Candidate
    source: str
    verified: list[pb.Verified]
    compiled: list[pb.Compiled] = field(default_factory=list)
    measured: list[pb.Measured] = field(default_factory=list)
    comparisons: list[pb.Comparison] = field(default_factory=list)

    @property
    def params(self) -> dict:
        return json.loads(self.candidate.params_json) if self.candidate.params_json else {}

    @property
    def launch(self) -> dict | None:
        return ev.launch_of(self.candidate)

    @property
    def target_kind(self) -> str:
        return self.candidate.target.split(":", 1)[0]

    def best_measurement(self) -> pb.Measured | None:
        """The full measurement (not a screening timing) with the lowest score, else any."""
        full = [m for m in self.measured if not m.screened_out] or self.measured
        return min(full, key=lambda m: m.score_s) if full else None

    def arch(self) -> str:
        """The cuda architecture it was compiled and measured for ('' on the cpu)."""
        for c in self.compiled:
            if c.report.arch:
                return c.report.arch
        target = self.candidate.target
        return target.split(":", 1)[1] if ":" in target else ""

    def compiler(self) -> str:
        """The compiler command the compile report names ('' when there is no report)."""
        return next((c.report.compiler for c in self.compiled if c.report.compiler), "")


def judged(evidence: spb.CandidateEvidence, problem: str = "") -> Judged:
    """The candidate's results as a kernel of `problem` (a problem's name; default: the problem of the campaign
    that made it first), or NotVerified when the evidence shows no pass: no `verified` event, a rejection at any
    stage (a duplicate is no verdict), a compile failure, a failed check inside a verdict, a comparison that found
    it wrong (a showdown's or its final one: evidence.verdicts.found_wrong), or a source that is not the one the
    candidate's id was made from. The campaigns known to be of another problem say nothing of it: one source may
    be a kernel of several problems (a package copied under another name, with other math, rejects the kernels
    its original verified). A campaign whose problem does not load here (imported evidence of a package on
    another host, a package since deleted) counts: its verdicts are not set aside unread."""
    if not evidence.candidate.id:
        raise NotVerified("the evidence names no candidate")
    name_of = _problem_names(evidence)
    own = problem or name_of.get(evidence.candidate.problem) or evidence.candidate.problem
    # (the candidate as a campaign of that problem made it: its problem field names that problem)
    cand = next((c for e in evidence.events if (c := ev.candidate_of(e)) is not None
                 and name_of.get(c.problem) == own), evidence.candidate)
    short = cand.id[:12]
    problem_of: dict[str, str | None] = {}   # campaign -> its problem's name (None: not known here)
    for event in evidence.events:
        if (c := ev.candidate_of(event)) is not None:
            problem_of.setdefault(event.campaign_id, name_of.get(c.problem))
    by_kind: dict[str, list] = {}
    failures: list[tuple[str, pb.CompileFailed | pb.Rejected]] = []   # (campaign, the failure)
    for event in evidence.events:
        if problem_of.get(event.campaign_id) not in (None, own):
            continue   # a campaign known to be of another problem
        kind = ev.kind_of(event)
        other = ev.candidate_of(event)
        if kind == "comparison":
            c = event.comparison
            if found_wrong(c) == cand.id:
                raise NotVerified(f"candidate {short} was found wrong by "
                                  f"{'a showdown' if c.showdown else 'its final comparison'} at {c.shape} in "
                                  f"campaign {event.campaign_id} ({_one_line(c.error)}): it is not exported")
            if c.candidate_id == cand.id and not (c.error or c.showdown):  # a showdown is not the final comparison
                by_kind.setdefault(kind, []).append(event.comparison)
            continue
        if other is None or other.id != cand.id:
            continue   # another candidate's event (a parent's, say), or none's: it says nothing about this one
        by_kind.setdefault(kind, []).append(getattr(event, kind))
        if kind in ("compile_failed", "rejected"):
            failures.append((event.campaign_id, getattr(event, kind)))
    _refuse_failures(short, own, failures)
    verified = by_kind.get("verified", [])
    if not verified:
        raise NotVerified(f"candidate {short} has no verified event: it was never shown correct, so it is "
                          "not exported")
    failed = [c for v in verified for c in v.checks if not c.passed]
    if failed or not any(v.checks for v in verified):
        raise NotVerified(f"candidate {short}: its verified event holds "
                          + (f"{len(failed)} failed checks" if failed else "no checks"))
    _check_source(cand, evidence.source)
    return Judged(cand, evidence.source, verified, by_kind.get("compiled", []), by_kind.get("measured", []),
                  by_kind.get("comparison", []))


def _problem_names(evidence: spb.CandidateEvidence) -> dict[str, str | None]:
    """locator -> problem name, for the problems the evidence's candidates name; None for a locator that loads
    no problem here (its name is not known)."""
    from kfactory.problems.loader import ProblemError, load_problem

    def name(locator: str) -> str | None:
        try:
            return load_problem(locator).name
        except ProblemError:
            return None

    locators = {c.problem for e in evidence.events if (c := ev.candidate_of(e)) is not None}
    return {loc: name(loc) for loc in locators | {evidence.candidate.problem}}


def _refuse_failures(short: str, problem: str, failures: list[tuple[str, pb.CompileFailed | pb.Rejected]]) -> None:
    """NotVerified for the first failure that is a verdict, naming the campaign (of `problem`) that gave it."""
    for campaign, failed in failures:
        if isinstance(failed, pb.CompileFailed):
            raise NotVerified(f"candidate {short} failed to compile in campaign {campaign} of {problem} "
                              f"({pb.RejectReason.Name(failed.reason)}: {_one_line(failed.message)})")
        if failed.reason in NOT_A_VERDICT:
            continue
        assert isinstance(failed, pb.Rejected)
        raise NotVerified(f"candidate {short} was rejected by the {failed.stage or 'pipeline'} in campaign "
                          f"{campaign} of {problem} ({pb.RejectReason.Name(failed.reason)}: "
                          f"{_one_line(failed.message)})")


def _check_source(cand: pb.Candidate, source: str) -> None:
    """The source must be the one the id was made from: an id names its content, so a mismatch means the
    evidence belongs to other code than the file that would be exported."""
    if not source:
        raise NotVerified(f"candidate {cand.id[:12]}: the evidence carries no source")
    made = ev.candidate_id(source, cand.language, cand.compile_flags, cand.entry, cand.threads, cand.target,
                           cand.launch_json)
    if made != cand.id:
        raise NotVerified(f"candidate {cand.id[:12]}: its source, flags and launch rule hash to {made[:12]}, not "
                          "to its id; the evidence is of other code")


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def kfactory_version() -> str:
    try:
        return importlib.metadata.version("kfactory")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} us"


def verification_summary(j: Judged) -> list[str]:
    """Lines: how many checks passed, over which shapes and distributions, and the worst errors."""
    checks = [c for v in j.verified for c in v.checks]
    shapes = sorted({c.shape for c in checks if c.shape})
    dists = sorted({c.distribution for c in checks if c.distribution})
    worst_norm = max((c.norm_rel_err for c in checks), default=0.0)
    worst_abs = max((c.max_abs_err for c in checks), default=0.0)
    campaigns = sorted({v.candidate.campaign_id for v in j.verified if v.candidate.campaign_id})
    return [f"verified: {len(checks)} checks passed, {len(j.verified)} verification(s)"
            + (f" (campaign {', '.join(campaigns)})" if campaigns else ""),
            f"  shapes: {', '.join(shapes)}",
            f"  distributions: {', '.join(dists)}",
            f"  worst norm-relative error {worst_norm:.3g}, worst max abs error {worst_abs:.3g}"]


def measurement_summary(j: Judged) -> list[str]:
    """Lines: the device, the median time per shape, and the interleaved speedups per shape."""
    m = j.best_measurement()
    lines = []
    if m is None:
        lines.append("measured: no measurement in the evidence")
    else:
        dev = m.device
        lines.append(f"device: {dev.model or dev.target}" + (f" ({dev.arch})" if dev.arch else ""))
        if m.screened_out:
            lines.append("  (a screening timing only: the full measurement was skipped)")
        for t in m.timings:
            lines.append(f"  {t.shape}: median {_time(t.median_s)} (q1 {_time(t.q1_s)}, q3 {_time(t.q3_s)}, "
                         f"{t.samples} samples)" + (f", {t.gbps:.3g} GB/s" if t.gbps else ""))
    # the final comparisons on the measurement's device, one per shape (the last: a kernel compared in several
    # campaigns has several)
    same = {c.shape: c for c in j.comparisons if c.speedups and m is not None and c.device.model == m.device.model}
    for c in same.values():
        # over each other kernel timed beside it (the candidate's own 1.00x says nothing)
        if pairs := ", ".join(f"{v:.2f}x {k}" for k, v in sorted(c.speedups.items()) if k != "candidate"):
            lines.append(f"  speedup at {c.shape}: {pairs} (interleaved)")
    return lines


def summary_lines(j: Judged, problem, name: str) -> list[str]:
    """The evidence block every exported file carries, as plain lines (the caller makes them comments)."""
    c = j.candidate
    lines = [f"{name}: kernel for problem {problem.name} on target {c.target}, exported by kfactory "
             f"{kfactory_version()}",
             f"candidate {c.id}",
             f"origin {c.origin or '?'}" + (f", family {c.family}" if c.family else "")
             + (f", params {c.params_json}" if c.params_json else ""),
             f"language {c.language}, flags '{c.compile_flags}'"
             + (f", measured with OMP_NUM_THREADS={c.runner_threads}" if c.runner_threads and
                j.target_kind == "cpu" else "")]
    if j.launch:
        rule = {k: v for k, v in j.launch.items() if k != "params"}
        lines.append(f"launch rule {json.dumps(rule, sort_keys=True)}")
    if j.compiler():
        lines.append(f"compiled by: {j.compiler()}")
    if problem.spec.params:
        # the evidence does not record them: these are problem.yaml's values when the export was made
        lines.append("problem params (problem.yaml at export): "
                     + ", ".join(f"{n}={p.value!r}" for n, p in problem.spec.params.items()))
    return lines + verification_summary(j) + measurement_summary(j)


def _flat(line: str) -> str:
    """One line of comment text: any line break or other control character in it (a flag string, a device
    name) becomes a space, so that it cannot end the comment and start code."""
    return "".join(ch if ch.isprintable() else " " for ch in line)


def c_comment(lines: list[str]) -> str:
    """A C block comment holding the lines (any '*/' in them broken, so the comment cannot end early)."""
    body = "\n".join(f" * {_flat(line).replace('*/', '* /')}".rstrip() for line in lines)
    return f"/*\n{body}\n */\n"


def hash_comment(lines: list[str]) -> str:
    """The lines as '#' comments (for shell and Python files)."""
    return "".join(f"# {_flat(line)}".rstrip() + "\n" for line in lines)

"""An engine campaign through the services: the spec the planner gets, and the campaign's record read back from
its events, so `kfactory engine run MODEL --services` writes the same record and best.json as the local
campaign (kfactory/engines/campaign.py) and `kfactory generate` / `kfactory export` work after either.

The problem is `engine:<model>` (kfactory/engines/problem.py): its one family's points are the designs of
`space()`, the default first; the descent strategy takes them (engines/order.STRATEGY) as the local campaign
does, so a budget of N evaluates the same N designs wherever the timings rank them alike. Each candidate goes
coder -> compiler -> verifier -> benchmarker (kfactory/engines/stages) and every outcome is an event;
`results_of` folds them into one DesignResult per proposed design:

    point_proposed                       the design (verdict "unfinished" until an outcome arrives)
    rejected by the coder                codegen_failed (or duplicate)
    compile_failed                       build_failed, with the compiler's log
    rejected by the verifier             rejected, the first failing check named
    rejected by the benchmarker          bench_failed
    measured                             verified: decode and prefill tok/s from its two timings
    measured, round 2..R                 a later timing round: the figures become the medians of the rounds
    rejected by the benchmarker, round r bench_failed (as a local retime's fault); after round R: no noise figure
    dead_letter                          harness_error (the harness failed, not the design)

Timing rounds (`--rounds R`) and the showdown (`--showdown S`) are the planner's last requests to the
benchmarker, after the search and before the campaign's end (kfactory/engines/finale.py): each verified
candidate timed again (`Verified.round` = 2..R, all designs in turn per round, as the local campaign's
`retime`), each timing its own Measured event (`Measured.round`) archived by memory; then the first verified
design once more (round R + 1) when two or more verified: its ratio to its first timing is the noise figure, as
the local campaign's `noise()`. Then the showdown's contenders (kfactory/engines/showdown.py), chosen from the
figures of rounds 1..R and the noise figure as the local campaign chooses them, in rounds R + 2 .. R + 1 + S;
those timings join their designs' rounds, a fault in one makes its design bench_failed, and the showdown's
ratios decide the winner, which the planner's CampaignFinished names too.
"""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

from kfactory.bus import events as ev
from kfactory.engines.campaign import (CONTEXT, DECODE_TOKENS, REPEATS, VERIFIED, DesignResult, write_record)
from kfactory.engines.design import EngineDesign
from kfactory.engines.ops import OpKernel
from kfactory.engines.order import STRATEGY, STRATEGY_OPTIONS
from kfactory.engines.problem import locator
from kfactory.engines.showdown import Rule, Showdown, spins_of
from kfactory.v1 import events_pb2 as pb

#: a design's verdict while no outcome of it has arrived (the campaign ended first: cancelled, expired)
UNFINISHED = "unfinished"
#: the rejecting stage -> the verdict a design gets (the local campaign's words)
STAGE_VERDICTS = {"coder": "codegen_failed", "verifier": "rejected", "benchmarker": "bench_failed"}


def campaign_spec(model: str, budget: int, max_threads: int, parallel: int = 0, seed: int = 0,
                  kernel_ids: dict[str, str] | None = None, rounds: int = 1,
                  showdown: Rule | None = None) -> pb.CampaignSpec:
    """The planner's spec of an engine campaign over `budget` designs of `model` with 1..max_threads threads,
    with the searched kernels `kernel_ids` ({op problem: candidate id}) tried first: the descent strategy from
    the default design (engines/order.STRATEGY, moving on at once from a clear win: JUMP), a cold start (another
    campaign's timings of the same designs would be re-proposed first, not new designs); then `rounds` timing
    rounds and the showdown by its rule `showdown` (default: none), which the planner asks for after the search
    (kfactory/engines/finale.py)."""
    rule = showdown or Rule()
    return pb.CampaignSpec(problem=locator(model, kernel_ids), target="cpu", budget_candidates=budget,
                           strategy=STRATEGY, strategy_options=STRATEGY_OPTIONS,
                           threads=max_threads, parallel=parallel, seed=seed or secrets.randbits(32),
                           warm_start=0, timing_rounds=rounds, showdown_rounds=rule.rounds,
                           showdown_margin=rule.margin)


def results_of(events: list[pb.Event], data_dir: Path | None, rounds: int = 1,
               showdown: bool = True) -> list[DesignResult]:
    """One DesignResult per proposed design, in proposal order, from a campaign's events (see the module
    docstring): timings of rounds 1..`rounds` kept, and with `showdown` those of the showdown's rounds (R + 2 on),
    their medians the figures. `library` is the verified object as the verifier ran it
    (<data_dir>/engines/artifacts/; None without a data_dir)."""
    by_point: dict[str, DesignResult] = {}
    point_of: dict[str, str] = {}     # candidate id -> point id
    for e in events:
        kind = e.WhichOneof("body")
        if kind == "point_proposed":
            pp = e.point_proposed
            if not pp.HasField("manual") and pp.point_id not in by_point:
                d = EngineDesign.from_dict(json.loads(pp.params_json))
                by_point[pp.point_id] = DesignResult(d.as_dict(), d.design_id(), UNFINISHED,
                                                     reason="no outcome before the campaign ended")
            continue
        if kind == "dead_letter":
            _dead_letter(e.dead_letter, by_point, point_of)
            continue
        cand = ev.candidate_of(e)
        if cand is not None and cand.id and cand.point_id:
            point_of[cand.id] = cand.point_id
        res = by_point.get(cand.point_id if cand is not None and cand.point_id else
                           e.rejected.point_id if kind == "rejected" else "")
        if res is not None:
            _fold(kind, e, res, data_dir, rounds, showdown)
    return list(by_point.values())


def _counts(round_: int, rounds: int, showdown: bool) -> bool:
    """Whether a timing of round `round_` (0: the first measurement) joins its design's figures: rounds 1..R,
    and with `showdown` the showdown's (R + 2 on); never the noise timing (R + 1)."""
    return round_ <= rounds or (showdown and round_ >= rounds + 2)


def _fold(kind: str | None, e: pb.Event, res: DesignResult, data_dir: Path | None, rounds: int,
          showdown: bool) -> None:
    """One event's outcome into its design's result."""
    if kind == "compiled":
        res.build_s = e.compiled.report.seconds
    elif kind == "compile_failed":
        res.verdict, res.reason, res.build_s = "build_failed", e.compile_failed.message, \
            e.compile_failed.report.seconds
    elif kind == "verified":
        res.verify_s = e.verified.seconds
        if data_dir is not None:
            res.library = str(Path(data_dir) / "engines" / "artifacts" / f"{e.verified.artifact_digest}.so")
    elif kind == "rejected":
        rej = e.rejected
        if not _counts(ev.timing_round(rej), rounds, showdown):   # the noise timing: no verdict
            return
        res.verdict = "duplicate" if rej.reason == pb.DUPLICATE else STAGE_VERDICTS.get(rej.stage, rej.stage)
        res.reason = rej.message
        res.failed_check = next((c.shape for c in rej.checks if not c.passed), None) \
            if rej.stage == "verifier" else None
        res.verify_s = rej.figures.get("verify_seconds", res.verify_s)
        res.decode_tok_s = res.prefill_tok_s = None   # a fault in a later round undoes the earlier figures
    elif kind == "measured" and not e.measured.screened_out and _counts(e.measured.round, rounds, showdown):
        if res.verdict not in (UNFINISHED, VERIFIED):   # a later round after a fault: the design stays failed
            return
        res.verdict, res.reason, res.bench_s = VERIFIED, "", res.bench_s + e.measured.seconds
        res.add_timing(*tok_s(e.measured))


def tok_s(m: pb.Measured) -> tuple[float, float]:
    """(decode tok/s, prefill tok/s) of an engine's measurement (its two timings, seconds per token)."""
    return 1.0 / m.timings[0].median_s, 1.0 / m.timings[1].median_s


def noise_of(events: list[pb.Event], results: list[DesignResult], rounds: int) -> dict[str, Any] | None:
    """The first verified design's timing after every round (Measured.round == rounds + 1) as a ratio to its
    first timing, as the local campaign's noise(); None when it was not timed so (fewer than two verified, or
    it faulted)."""
    first = next((r for r in results if r.verified and r.timings), None)
    if first is None:
        return None
    for e in events:
        m = e.measured if e.HasField("measured") else None
        if m is None or m.round != rounds + 1 or m.screened_out:
            continue
        if design_id_of(m.candidate) == first.design_id:
            return first.noise(*tok_s(m))
    return None


def design_id_of(cand: pb.Candidate) -> str:
    """The id of the engine design a candidate is (its params_json)."""
    return EngineDesign.from_dict(json.loads(cand.params_json)).design_id()


def showdown_ids(before: list[DesignResult], events: list[pb.Event], rounds: int, rule: Rule) -> list[str]:
    """The showdown's contenders (design ids, the fastest first), chosen by `rule` from `before` (the results of
    rounds 1..R: results_of(..., showdown=False)) and the noise figure, as the local campaign chooses them."""
    return [r.design_id for r in rule.contenders(before, noise_of(events, before, rounds))]


def showdown_of(events: list[pb.Event], before: list[DesignResult], rounds: int, rule: Rule) -> dict[str, Any] | None:
    """The showdown's record from the answers to its requests (rounds R + 2 .. R + 1 + rule.rounds): a
    contender whose request was rejected or dead-lettered is out (as the planner's finale takes it); None when
    it had no contenders or no rounds."""
    ids = showdown_ids(before, events, rounds, rule)
    if not ids:
        return None
    sd = Showdown(ids, rule.rounds)
    # a cut dead letter's answer names its candidate by id only: the design is its first measurement's
    known = {e.measured.candidate.id: e.measured.candidate for e in events if e.HasField("measured")}
    for e in events:
        answer = retiming_answer(e)
        if answer is None or answer[1] < rounds + 2:
            continue
        cand, round_, measured = answer
        if not (cand := known.get(cand.id, cand)).params_json:   # a cut letter's, of a candidate never measured here
            continue
        design_id = design_id_of(cand)
        if design_id not in sd.timings:
            continue
        if measured is None:
            sd.fault(design_id)
        elif round_ - rounds - 2 < rule.rounds:
            sd.add(design_id, round_ - rounds - 2, *tok_s(measured))
    return sd.as_dict(spins_of(before))


def retiming_answer(e: pb.Event) -> tuple[pb.Candidate, int, pb.Measured | None] | None:
    """What event `e` answers of a re-timing request (Verified.round >= 2): (the candidate, the round, its
    Measured, or None for a fault: the benchmarker's Rejected, or the request's own dead letter); None for an
    event that answers none."""
    kind = e.WhichOneof("body")
    if kind == "measured" and (r := ev.timing_round(e.measured)) >= 2 and not e.measured.screened_out:
        return e.measured.candidate, r, e.measured
    if kind == "rejected" and (r := ev.timing_round(e.rejected)) >= 2:
        return e.rejected.candidate, r, None
    if kind == "dead_letter":
        dl = e.dead_letter
        if ev.payload_cut(dl):   # the letter names the work itself (its ids only)
            cand = pb.Candidate(id=dl.candidate_id, point_id=dl.point_id)
            return (cand, dl.round, None) if dl.round >= 2 and dl.candidate_id else None
        work = ev.decoded(dl.payload)
        if work is not None and work.HasField("verified") and work.verified.round >= 2:
            return work.verified.candidate, work.verified.round, None
    return None


def _dead_letter(dl: pb.DeadLetter, by_point: dict[str, DesignResult], point_of: dict[str, str]) -> None:
    """Work the harness could not do (its candidate names the design; a payload cut to fit the dead letter names
    it in the letter's own fields, ev.dead_work): harness_error, not a verdict."""
    work = ev.dead_work(dl)
    cand = work[1] if work is not None else None
    res = by_point.get(point_of.get(cand.id, cand.point_id) if cand is not None else "")
    if res is not None and res.verdict == UNFINISHED:
        res.verdict, res.reason = "harness_error", f"{dl.stage}: {dl.reason}"


def verified_sources(events: list[pb.Event]) -> dict[str, str]:
    """design id -> the source artifact's digest of each verified candidate (what its library is built from)."""
    digests = {e.candidate_created.candidate.id: e.candidate_created.candidate.source_digest
               for e in events if e.HasField("candidate_created")}
    return {design_id_of(e.verified.candidate): digests[e.verified.candidate.id]
            for e in events if e.HasField("verified") and e.verified.candidate.id in digests}


def write(events: list[pb.Event], model_name: str, out_dir: Path, data_dir: Path, spec: pb.CampaignSpec,
          tolerance: float, started: str | None = None, libraries: dict[str, str] | None = None,
          rounds: int = 1, kernels: dict[str, OpKernel] | None = None,
          showdown: Rule | None = None) -> dict[str, Any]:
    """The campaign's record and best.json under out_dir (kfactory.engines.campaign.write_record), from its
    events; returns the record. `libraries` (design id -> path) names each verified design's object in the build
    cache, where its source is kept beside it (`kfactory export` takes the verified source from there); `rounds`
    the timing rounds asked for (a round R + 1 of the first design is the noise timing); `kernels` the searched
    kernels the designs link (from their source bundles), kept in the record and best.json to rebuild them;
    `showdown` the showdown's rule (default: none)."""
    rule = showdown or Rule()
    before = results_of(events, data_dir, rounds, showdown=False)
    noise = noise_of(events, before, rounds)
    sd = showdown_of(events, before, rounds, rule)
    results = results_of(events, data_dir, rounds) if sd else before
    for r in results:
        if r.design_id in (libraries or {}):
            r.library = (libraries or {})[r.design_id]
    head = {"model": model_name, "target": spec.target, "started": started or time.strftime("%Y%m%dT%H%M%SZ",
                                                                                             time.gmtime()),
            "budget": spec.budget_candidates, "max_threads": spec.threads, "rounds": rounds,
            "showdown_rule": rule.as_dict(),
            "bench": {"context": CONTEXT, "decode_tokens": DECODE_TOKENS, "repeats": REPEATS},
            "tolerance": tolerance, "campaign_id": events[0].campaign_id if events else "", "services": True}
    return write_record(out_dir, head, results, kernels or {}, noise, sd)

"""A candidate's whole evidence chain as the services publish it (created, compiled, verified, measured): the
planner and memory believe a measurement only at the end of one (kfactory/evidence/trust.py)."""
from __future__ import annotations

from kfactory.bus import events as ev
from kfactory.v1 import events_pb2 as pb


def timing(score: float, shape: str = "4x4") -> pb.ShapeTiming:
    """A plausible timing whose median is `score`."""
    return pb.ShapeTiming(shape=shape, median_s=score, q1_s=score, q3_s=score, samples=5)


def measured(campaign: str, cand: pb.Candidate, score: float, **fields) -> pb.Event:
    """The benchmarker's Measured event for `cand`, with one shape timed at `score` s."""
    return ev.make_event(campaign, "benchmarker", cand.id, measured=pb.Measured(
        candidate=cand, score_s=score, timings=[timing(score)], **fields))


def links(campaign: str, cand: pb.Candidate) -> list[pb.Event]:
    """The events before a measurement: created by the coder, compiled, verified."""
    return [ev.make_event(campaign, "coder", cand.id, candidate_created=pb.CandidateCreated(candidate=cand)),
            ev.make_event(campaign, "compiler", cand.id, compiled=pb.Compiled(candidate=cand,
                                                                               artifact_digest="a" * 64)),
            ev.make_event(campaign, "verifier", cand.id, verified=pb.Verified(candidate=cand,
                                                                               artifact_digest="a" * 64))]


def chain(campaign: str, cand: pb.Candidate, score: float, **fields) -> list[pb.Event]:
    """The whole chain, ending in a measurement at `score` s."""
    return links(campaign, cand) + [measured(campaign, cand, score, **fields)]

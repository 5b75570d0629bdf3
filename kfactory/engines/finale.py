"""An engine campaign's timings after its search, asked for by the planner (kfactory/services/planner/driver.py
`_finale`), and the winner they decide.

Round 1 is the measurement each design got after its verification. When the search has ended, the planner sends
each design verified and measured in round 1 to the benchmarker again, rounds 2..R (CampaignSpec.timing_rounds),
all designs in proposal order within a round (a pair of designs is then also timed close together: on a shared
host the load drifts within minutes), less those whose timing faulted in an earlier round; then, when two or
more designs are still verified, the first of them once more (round R + 1): its ratio to its first timing is
the noise figure. Then the showdown (kfactory/engines/showdown.py):
its contenders, chosen from the figures of rounds 1..R and the noise figure, are sent again in rounds
R + 2 .. R + 1 + S (CampaignSpec.showdown_rounds) in showdown.schedule's order; a contender whose timing is
rejected (a fault) is sent no more. A request is the design's Verified event again with `round` set; each answer
is the benchmarker's own Measured (or Rejected) event with that round, archived by memory like any other. One
request at a time: the benchmarker holds the device lease for each anyway, and the order is the local
campaign's. The campaign's result is the showdown's winner where there was one, else the engine's rule over the
first timings (EngineProblem.winner).

Everything here is a function of the campaign's events (`fold` keeps the ones it needs): a planner restarted
mid-finale folds them again from the stream and asks for the first request still unanswered.
kfactory/engines/pipeline.py folds the same events into the campaign's record.
"""
from __future__ import annotations

from kfactory.bus import events as ev
from kfactory.engines import pipeline
from kfactory.engines.showdown import Rule, schedule
from kfactory.v1 import events_pb2 as pb

#: the kinds of event the finale reads
KEPT = ("point_proposed", "verified", "measured", "rejected", "dead_letter")


def requests(events: list[pb.Event], rounds: int) -> list[pb.Verified]:
    """The re-timing requests, in order: rounds 2..`rounds` over the designs verified and measured in round 1
    (proposal order), each round without those whose timing faulted in an earlier one (the benchmarker's
    Rejected: bench_failed, as the local campaign's retime leaves them; a dead letter is the harness's failure
    and leaves the design in), then the noise timing of the first design still verified when two or more are.
    The requests are answered one at a time in this order, so a round's designs are known once the round
    before it is answered."""
    order = {e.point_proposed.point_id: i for i, e in enumerate(events) if e.HasField("point_proposed")}
    verified = sorted(_measured(events), key=lambda v: order.get(v.candidate.point_id, len(order)))
    faulted = _faulted(events, rounds)
    plan = [(r, v) for r in range(2, rounds + 1) for v in verified if faulted.get(v.candidate.id, r) >= r]
    left = [v for v in verified if v.candidate.id not in faulted]
    if len(left) >= 2:
        plan.append((rounds + 1, left[0]))
    return [_request(v, r) for r, v in plan]


def _faulted(events: list[pb.Event], rounds: int) -> dict[str, int]:
    """Per candidate whose timing in a round 2..`rounds` the benchmarker rejected, the first such round."""
    out: dict[str, int] = {}
    for e in events:
        if e.HasField("rejected") and 2 <= (r := ev.timing_round(e.rejected)) <= rounds:
            out[e.rejected.candidate.id] = min(r, out.get(e.rejected.candidate.id, r))
    return out


def showdown_requests(events: list[pb.Event], rounds: int, rule: Rule) -> list[tuple[str, pb.Verified]]:
    """The showdown's requests in timing order, each with its design id: `rule.rounds` rounds (R + 2 on) over
    the contenders `rule` chooses from the events of rounds 1..R and the noise timing; [] when there are none."""
    before = pipeline.results_of(events, None, rounds, showdown=False)
    ids = pipeline.showdown_ids(before, events, rounds, rule)
    verified = {pipeline.design_id_of(v.candidate): v for v in _measured(events)}
    return [(i, _request(verified[i], rounds + 2 + k)) for k, i in schedule(ids, rule.rounds) if i in verified]


def _measured(events: list[pb.Event]) -> list[pb.Verified]:
    """The Verified events of the candidates measured in round 1, in event order."""
    measured = {e.measured.candidate.id for e in events
                if e.HasField("measured") and e.measured.round == 0 and not e.measured.screened_out}
    return [e.verified for e in events if e.HasField("verified") and e.verified.candidate.id in measured]


def _request(v: pb.Verified, round_: int) -> pb.Verified:
    req = pb.Verified()
    req.CopyFrom(v)
    req.round = round_
    return req


class EngineFinale:
    """The finale of one engine campaign: `rounds` timing rounds (at least 1: the first measurement), then the
    showdown by `rule`. `fold` every event of the campaign in; `next` is the request to send, `winner` the
    candidate the showdown decided."""

    def __init__(self, rounds: int, rule: Rule):
        self.rounds, self.rule = max(1, rounds), rule
        self.events: list[pb.Event] = []
        #: (candidate id, round) of every request answered: measured, rejected, or dead-lettered
        self.answered: set[tuple[str, int]] = set()
        #: candidates whose showdown timing was rejected (sent no more)
        self.faulted: set[str] = set()

    def fold(self, event: pb.Event) -> None:
        """Keep what the finale reads of one event of the campaign."""
        if ev.kind_of(event) not in KEPT:
            return
        self.events.append(event)
        if (answer := pipeline.retiming_answer(event)) is not None:
            cand, round_, measured = answer
            self.answered.add((cand.id, round_))
            if measured is None and round_ >= self.rounds + 2:
                self.faulted.add(cand.id)

    def next(self) -> pb.Verified | None:
        """The first request not answered yet: the timing rounds and the noise timing, then the showdown's (a
        contender that faulted in it is skipped); None when every one is."""
        for req in requests(self.events, self.rounds):
            if (req.candidate.id, req.round) not in self.answered:
                return req
        for _, req in showdown_requests(self.events, self.rounds, self.rule):
            if req.candidate.id not in self.faulted and (req.candidate.id, req.round) not in self.answered:
                return req
        return None

    def winner(self) -> str | None:
        """The candidate id of the showdown's winner, once a showdown timing is in; else None."""
        before = pipeline.results_of(self.events, None, self.rounds, showdown=False)
        sd = pipeline.showdown_of(self.events, before, self.rounds, self.rule)
        if sd is None or not sd["winner"] or not sd["ratios"]:
            return None
        by_design = {pipeline.design_id_of(v.candidate): v.candidate.id for v in _measured(self.events)}
        return by_design.get(sd["winner"])


def finale_of(spec: pb.CampaignSpec) -> EngineFinale:
    """The finale an engine campaign's spec asks for (CampaignSpec.timing_rounds, showdown_rounds and
    showdown_margin; a margin of 0 is the default)."""
    margin = spec.showdown_margin or Rule().margin
    return EngineFinale(spec.timing_rounds, Rule(rounds=spec.showdown_rounds, margin=margin))

"""What campaigns decided about their kernels beyond each one's own measurement, folded from their events: the
kernels a showdown or a final comparison found wrong, and the kernel each finished campaign finished with.
Memory's best, priors and lessons (kfactory/services/memory/archive.py), its leaderboard, and a campaign's
report all answer with these, so no kernel a campaign judged against is shown or exported as its result."""
from __future__ import annotations

from dataclasses import dataclass, field

from kfactory.v1 import events_pb2 as pb

#: failures that mean "this kernel computes the wrong thing": the input that showed it is worth keeping (memory's
#: regression inputs, kfactory/services/memory/archive.py)
WRONGNESS = frozenset({pb.WRONG_RESULT, pb.NOT_DETERMINISTIC, pb.MEMOISED, pb.OUT_OF_BOUNDS})
#: a comparison's failures that say its kernel computes the wrong thing or cheats the harness; others (a timeout,
#: a crash, a resource limit) may be the host's, and leave the result as it was
WRONG_REASONS = WRONGNESS | {pb.INPUT_MUTATED, pb.TOO_FAST_TO_BE_TRUE}


def found_wrong(comp: pb.Comparison) -> str:
    """The candidate a comparison found wrong ("" when none): for a wrongness reason (WRONG_REASONS), any kernel
    of a showdown (its contenders are candidates only), or the compared result itself in its final comparison
    (the reference kernel or a baseline failing there says nothing against the candidate). Such a kernel is no
    result anywhere, and is never exported. The planner also takes a kernel that failed a showdown otherwise
    (a crash, a timeout) out of that one campaign's result (CampaignState.disqualified)."""
    if not comp.failed_candidate or comp.failed_reason not in WRONG_REASONS:
        return ""
    return comp.failed_candidate if comp.showdown or comp.failed_candidate == comp.candidate_id else ""


#: how a leaderboard says that a kernel is its campaign's result, or is none
NOTES = {"result": "the campaign's result", "found_wrong": "found wrong by a comparison: no result",
         "screened_out": "screened out: too slow in a short timing, never measured in full"}


@dataclass
class Verdicts:
    """`wrong`: the candidates a showdown or a final comparison found wrong (found_wrong: no result, whatever
    their measurement), each with the first campaign that did and why; `results`: each finished campaign's result
    (CampaignFinished.best_candidate_id, "" when it finished with none)."""
    wrong: dict[str, pb.KnownWrong] = field(default_factory=dict)
    results: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, events) -> Verdicts:
        out = cls()
        for e in events:
            out.fold(e)
        return out

    def fold(self, event: pb.Event) -> None:
        """Take in one event (any kind; only comparisons, and campaigns' starts and ends, say anything here)."""
        if event.HasField("campaign_finished"):
            self.results[event.campaign_id] = event.campaign_finished.best_candidate_id
        elif event.HasField("campaign_started"):   # what memory knew other campaigns had found wrong
            for k in event.campaign_started.known_wrong:
                self.wrong.setdefault(k.candidate_id, k)
        elif event.HasField("comparison") and (cid := found_wrong(event.comparison)) and cid not in self.wrong:
            self.wrong[cid] = pb.KnownWrong(candidate_id=cid, campaign_id=event.campaign_id,
                                            reason=event.comparison.failed_reason)

    def add_wrong(self, known: dict[str, pb.KnownWrong]) -> None:
        """Take in kernels other campaigns found wrong (a kernel already here keeps its own first finder)."""
        for candidate, k in known.items():
            self.wrong.setdefault(candidate, k)

    def counts(self, campaign: str, candidate: str) -> bool:
        """Whether a kernel of this campaign can be a problem's best: the one it finished with, or, while it
        runs, any not found wrong."""
        return candidate not in self.wrong and self.results.get(campaign, candidate) == candidate

    def notes(self, campaign: str, m: pb.Measured) -> list[str]:
        """What a leaderboard adds to a measured kernel's own figures (NOTES' keys): its campaign's result, or no
        result at all."""
        cid = m.candidate.id
        return [k for k, flag in (("result", self.results.get(campaign) == cid), ("found_wrong", cid in self.wrong),
                                  ("screened_out", m.screened_out)) if flag]

"""What a campaign's state refuses to fold in: events that cannot be believed (kfactory/evidence/trust.py), results
whose evidence chain the planner has not seen in order, and an end of a campaign it drives that it did not publish.
A refused event changes nothing, and its id stays free for the real event."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kfactory.bus import events as ev
from kfactory.evidence import trust
from kfactory.v1 import events_pb2 as pb

if TYPE_CHECKING:  # the state calls these at every event; it is imported for its type only
    from kfactory.services.planner.campaign import CampaignState


def refusal(st: CampaignState, event: pb.Event, kind: str, own: bool = False) -> str:
    """Why `event` cannot be folded into campaign `st` ("" when it can): a body that cannot be believed, a result
    whose evidence chain this planner has not seen in order, or an end of a campaign this planner drives that it
    did not publish itself (it applies its own before publishing them)."""
    if flaw := trust.body_flaw(event):
        return flaw
    cand = ev.candidate_of(event)
    cid = cand.id if cand is not None else ""  # compiled, verified and measured always name one
    if kind == "compiled" and cid not in st.candidates:
        return f"compiled: candidate {cid[:16]} was never created in campaign {st.id}"
    if kind == "verified" and cid not in st.artifacts:
        return f"verified: candidate {cid[:16]} was never compiled in campaign {st.id}"
    if kind == "measured" and (missing := trust.missing_links(_links(st, cid), event.measured.screened_out)):
        return f"measured: candidate {cid[:16]} was never {missing[-1]} in campaign {st.id}"
    if kind == "comparison" and not _full(st, event.comparison.candidate_id):
        return f"comparison: candidate {event.comparison.candidate_id[:16]} was never measured in full in {st.id}"
    if kind == "campaign_finished" and st.driven and not own and st.finished is None:
        return f"campaign_finished: campaign {st.id} is driven by this planner, which did not end it"
    return ""


def _links(st: CampaignState, cand_id: str) -> list[str]:
    """The links of a candidate's evidence chain this planner has folded (kfactory/evidence/trust.py CHAIN)."""
    have = {"candidate_created": cand_id in st.candidates, "compiled": cand_id in st.artifacts,
            "verified": cand_id in st.verified}
    return [k for k, there in have.items() if there]


def _full(st: CampaignState, cand_id: str) -> bool:
    """True when the candidate was measured in full (verified first), not only screened out."""
    m = st.measured.get(cand_id)
    return m is not None and not m.screened_out

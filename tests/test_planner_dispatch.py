"""The planner's event dispatch fails loudly: every kind of the Event body is handled or declared ignored, and
any other kind raises UnknownEventKind instead of being dropped in silence."""
from __future__ import annotations

import pytest

from kfactory.bus import events as ev
from kfactory.services.planner import campaign
from kfactory.services.planner.campaign import HANDLERS, IGNORED, CampaignState, UnknownEventKind, handler_of
from kfactory.v1 import events_pb2 as pb

BODY_KINDS = [f.name for f in pb.Event.DESCRIPTOR.oneofs_by_name["body"].fields]


def _state() -> CampaignState:
    return CampaignState("c1", pb.CampaignSpec(problem="softmax", target="cpu"), pb.DeviceInfo(), None)


@pytest.mark.parametrize("kind", BODY_KINDS)
def test_every_kind_of_the_event_body_is_handled_or_declared_ignored(kind):
    assert (kind in HANDLERS) != (kind in IGNORED), f"{kind}: in neither table, or in both"
    handler_of(kind)  # does not raise


def test_the_tables_name_only_kinds_the_event_body_has():
    assert set(HANDLERS) | IGNORED <= set(BODY_KINDS)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_an_event_of_a_newer_schema_raises_and_changes_nothing():
    # a body field this build does not know (field number 999, length-delimited): it parses, with no body kind
    known = pb.Event(id="c1:someday:x", campaign_id="c1", producer="planner").SerializeToString()
    newer = pb.Event.FromString(known + _varint(999 << 3 | 2) + _varint(3) + b"abc")
    assert ev.kind_of(newer) == ""
    st = _state()
    with pytest.raises(UnknownEventKind, match="no body"):
        st.apply(newer)
    assert not st.seen_events and not st.changed.is_set()


def test_a_kind_the_planner_forgot_raises(monkeypatch):
    monkeypatch.setattr(campaign, "HANDLERS", {k: v for k, v in HANDLERS.items() if k != "comparison"})
    st = _state()
    event = ev.make_event("c1", "benchmarker", "x", comparison=pb.Comparison(shape="64x1000"))
    with pytest.raises(UnknownEventKind, match="'comparison'") as e:
        st.apply(event)
    assert e.value.kind == "comparison" and not st.comparisons and event.id not in st.seen_events

"""Event envelopes, subjects and deterministic ids (the contract in proto/kfactory/v1/events.proto)."""
from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from google.protobuf.message import DecodeError

from kfactory.v1 import events_pb2 as pb

WORK_PREFIX = "kf.v1.work"
#: the largest event a service decodes (NATS itself refuses payloads over its max_payload, 1 MiB by default)
MAX_EVENT_BYTES = 1 << 20
#: campaign ids are one subject token: letters, digits, '_' and '-' (the planner makes c + 12 hex digits)
CAMPAIGN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class BadEvent(ValueError):
    """An event that can never be handled; the message says what is wrong and what to send instead."""
EVT_PREFIX = "kf.v1.evt"
DLQ_PREFIX = "kf.v1.dlq"
STAGES = ("coder", "compiler", "verifier", "benchmarker")


def work_subject(stage: str, campaign_id: str) -> str:
    """Input subject of a stage for one campaign."""
    return f"{WORK_PREFIX}.{stage}.{campaign_id}"


def event_subject(kind: str, campaign_id: str) -> str:
    """Subject on the events stream for one kind of result (the oneof field name)."""
    return f"{EVT_PREFIX}.{kind}.{campaign_id}"


def kind_of(event: pb.Event) -> str:
    """The event's body kind, e.g. 'measured'."""
    return event.WhichOneof("body") or ""


#: the kinds of event a campaign's Counts count, each to its field
COUNTED_KINDS = {"point_proposed": "proposed", "compiled": "compiled", "compile_failed": "compile_failed",
                 "verified": "verified", "rejected": "rejected", "measured": "measured"}


def count_in(counts: pb.Counts, kind: str, n: int = 1) -> None:
    """Add n events of `kind` to `counts` (nothing for a kind COUNTED_KINDS does not count)."""
    if field := COUNTED_KINDS.get(kind):
        setattr(counts, field, getattr(counts, field) + n)


def late_counts(now: pb.Counts, finished: pb.Counts) -> pb.Counts:
    """Each count of `now` beyond what a campaign `finished` with (never below zero): CampaignStatus.after_finish."""
    out = pb.Counts()
    for fd in pb.Counts.DESCRIPTOR.fields:
        setattr(out, fd.name, max(0, getattr(now, fd.name) - getattr(finished, fd.name)))
    return out


def candidate_of(event: pb.Event) -> pb.Candidate | None:
    """The candidate an event is about, for the kinds that carry one; None otherwise."""
    kind = kind_of(event)
    body = getattr(event, kind) if kind else None
    return body.candidate if body is not None and "candidate" in body.DESCRIPTOR.fields_by_name else None


def outcome_point(body) -> str:
    """The point an outcome (Measured, Rejected, CompileFailed) ended: a rejection names it itself when it came
    before any candidate (or for a duplicate of another point's candidate), else the candidate's."""
    return getattr(body, "point_id", "") or body.candidate.point_id


def timing_round(body) -> int:
    """The timing round an outcome reports: a Measured's `round`, or the round a benchmarker's Rejected of a
    re-timing carries in figures["round"] (the benchmarker sets it); 0 for a first timing and any other outcome.
    Rounds 2 and on are re-timings (Verified.round)."""
    if isinstance(body, pb.Measured):
        return body.round
    if isinstance(body, pb.Rejected) and body.stage == "benchmarker":
        return int(body.figures.get("round", 0))
    return 0


def payload_cut(letter: pb.DeadLetter) -> bool:
    """Whether a dead letter kept only the first part of its work message (cut to fit: it no longer decodes)."""
    return letter.payload_bytes > len(letter.payload)


def dead_work(letter: pb.DeadLetter) -> tuple[str, pb.Candidate | None] | None:
    """(point id, candidate or None) of the work a dead letter gave up on; None when its payload is no event
    (it was dead-lettered for that) or is about no point. A letter whose payload was cut to fit names its point
    and candidate itself (work_of_message, when it was dead-lettered); the candidate is then only its ids."""
    if letter.point_id and payload_cut(letter):
        cand = pb.Candidate(id=letter.candidate_id, point_id=letter.point_id) if letter.candidate_id else None
        return letter.point_id, cand
    return work_of_message(letter.payload)


def decoded(data: bytes) -> pb.Event | None:
    """The event a message's bytes hold; None when they hold none (a payload cut to fit a dead letter, say)."""
    try:
        return pb.Event.FromString(data)
    except DecodeError:
        return None


def work_of_message(data: bytes) -> tuple[str, pb.Candidate | None] | None:
    """(point id, candidate or None) of a work message's bytes; None when they are no event or about no point."""
    inner = decoded(data)
    return None if inner is None else work_of(inner)


def work_of(inner: pb.Event) -> tuple[str, pb.Candidate | None] | None:
    """(point id, candidate or None) of a work message's event; None when it is about no point."""
    cand = candidate_of(inner)
    if inner.HasField("point_proposed"):
        return inner.point_proposed.point_id, cand
    return (cand.point_id, cand) if cand is not None else None


def showdown_key(req: pb.CompareRequest) -> str:
    """The event key of a showdown's request and of its answer: the search's best and its contenders, so that a
    later showdown of the same best with another contender is not taken for a duplicate of the first."""
    rivals = hashlib.sha256(",".join(sorted(c.id for c in req.contenders)).encode()).hexdigest()[:12]
    return f"showdown:{req.candidate.id}:{rivals}"


def make_event(campaign_id: str, producer: str, key: str, **body: Any) -> pb.Event:
    """An envelope whose id is `<campaign>:<kind>:<key>`: a retried publish carries the same id and is deduplicated."""
    (kind, msg), = body.items()
    ev = pb.Event(id=f"{campaign_id}:{kind}:{key}", campaign_id=campaign_id, producer=producer,
                  time_unix_ns=time.time_ns())
    getattr(ev, kind).CopyFrom(msg)
    return ev


def canonical_json(obj: Any) -> str:
    """Sorted, compact JSON: the canonical form that ids are hashed from."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


def point_id(family: str, params: dict) -> str:
    """A design point's id: the hash of its family and canonical parameters."""
    return sha256_hex(canonical_json({"family": family, "params": params}))[:24]


def candidate_id(source: str, language: str, flags: str, entry: str, threads: int, target: str,
                 launch_json: str = "") -> str:
    """A candidate's id: sha256 of everything that determines what runs. Same content, same id, anywhere."""
    content = {"source": source, "language": language, "flags": flags, "entry": entry, "threads": threads,
               "target": target}
    if launch_json:  # only where there is one, so ids of kernels without a launch rule never change
        content["launch"] = launch_json
    return sha256_hex(canonical_json(content))


def launch_of(cand: pb.Candidate) -> dict | None:
    """A candidate's launch rule (cuda), or None."""
    return json.loads(cand.launch_json) if cand.launch_json else None


def decode_event(data: bytes, subject: str = "", max_bytes: int = MAX_EVENT_BYTES) -> pb.Event:
    """Parse and check an event from the wire; raises BadEvent (with what to fix) for anything that could never
    be handled: too large, not protobuf, no body, a campaign id that is no subject token or differs from the
    subject's, a launch rule that is not JSON."""
    if len(data) > max_bytes:
        raise BadEvent(f"event of {len(data)} bytes is over the {max_bytes}-byte limit (KFACTORY_MAX_EVENT_BYTES): "
                       "put large payloads in the artifact store and send their digest")
    try:
        event = pb.Event.FromString(data)
    except DecodeError as e:
        raise BadEvent(f"malformed protobuf: {e}; send a serialized kfactory.v1.Event") from e
    kind = kind_of(event)
    if not kind:
        raise BadEvent("the event has no body: set one of the fields of Event.body")
    if not CAMPAIGN_ID.match(event.campaign_id):
        raise BadEvent(f"campaign id {event.campaign_id[:80]!r} is not 1-64 letters, digits, '_' or '-'")
    if subject and subject.rsplit(".", 1)[-1] != event.campaign_id:
        raise BadEvent(f"the subject {subject!r} names another campaign than the event's {event.campaign_id!r}")
    if subject.startswith(EVT_PREFIX + ".") and subject.split(".")[-2] != kind:
        # permissions are granted per subject: a body of another kind would pass for the subject's kind (a
        # compiler's `compiled` subject carrying a campaign_finished)
        raise BadEvent(f"the subject {subject!r} is for {subject.split('.')[-2]!r} events, but the event's body is "
                       f"{kind!r}: publish it on {event_subject(kind, event.campaign_id)}")
    cand = candidate_of(event)
    if cand is not None and cand.launch_json:
        try:
            json.loads(cand.launch_json)
        except ValueError as e:  # JSONDecodeError, and UnicodeDecodeError never: protobuf strings are UTF-8
            raise BadEvent(f"candidate {cand.id[:16]}: launch_json is not JSON ({e})") from e
    return event

"""A dead letter's cause (the proto's DeadLetterCause) as the listing and `kfactory dead-letters --cause` spell it.

Kept apart from kfactory/bus/deadletters.py, which needs the NATS client: the CLI's parser names the causes on
every start.
"""
from __future__ import annotations

from kfactory.v1 import events_pb2 as pb


def cause_name(cause: pb.DeadLetterCause) -> str:
    """A cause as the listing and `--cause` spell it: harness_failed, input_missing, ... ("unspecified" for a
    dead letter written before causes were recorded)."""
    if cause == pb.DEAD_LETTER_CAUSE_UNSPECIFIED:
        return "unspecified"
    return pb.DeadLetterCause.Name(cause).lower()


def cause_of(name: str) -> pb.DeadLetterCause:
    """The cause `name` spells (cause_name's inverse); ValueError naming the valid ones."""
    for value in pb.DeadLetterCause.values():
        if cause_name(value) == name:
            return value
    raise ValueError(f"no dead-letter cause {name!r}; the causes are {', '.join(CAUSES)}")


#: every cause's name, in the proto's order
CAUSES = tuple(cause_name(v) for v in pb.DeadLetterCause.values())

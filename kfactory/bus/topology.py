"""THE topology: the streams, the stages, and one table of roles saying who consumes which work subject, who
queues work for which stage and who publishes which event kinds.

Two things read it: the wiring (Bus.send_work refuses work for a stage the sending services do not queue, so a
new arrow in the pipeline is added here first) and the permissions (kfactory/platform/security.py turns each role
into its NATS user's grants; deploy/k8s/nats_auth.py writes those into the cluster's auth.conf).

    planner --coder/agent_*--> coder --compiler--> compiler --verifier|benchmarker--> verifier --benchmarker-->
    benchmarker --verifier--> (a screened candidate goes on to be verified, kfactory/judge/order.py)
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from kfactory.agents.personas import PERSONAS, persona_stage
from kfactory.bus.events import DLQ_PREFIX, EVT_PREFIX, WORK_PREFIX

WORK_STREAM = "KF_WORK"
EVENTS_STREAM = "KF_EVENTS"
DLQ_STREAM = "KF_DLQ"
ARTIFACT_BUCKET = "kf-artifacts"
#: the stream nats-py's object store keeps the artifact bucket in
OBJ_STREAM = f"OBJ_{ARTIFACT_BUCKET}"
#: which subjects each stream holds (the in-memory bus routes by the same prefixes)
STREAM_PREFIX = {WORK_STREAM: WORK_PREFIX, EVENTS_STREAM: EVT_PREFIX, DLQ_STREAM: DLQ_PREFIX}


class Stage(StrEnum):
    """The pipeline's work stages: each is a work subject segment and the durable consumer's name."""
    CODER = "coder"
    COMPILER = "compiler"
    VERIFIER = "verifier"
    BENCHMARKER = "benchmarker"


#: one work stage per agent persona (agent_<name>), consumed by the coder service
AGENT_STAGES = tuple(persona_stage(p) for p in PERSONAS)
#: every stage a work message can be queued for
STAGES: tuple[str, ...] = (*Stage, *AGENT_STAGES)


@dataclass(frozen=True)
class Role:
    """What one service does on the bus (and so what its NATS user may do)."""
    publishes: tuple[str, ...] = ()   # event kinds (the Event body's field names) it publishes
    queues: tuple[str, ...] = ()      # stages it sends work to
    consumes: tuple[str, ...] = ()    # stages whose work it takes (durable consumer = stage name)
    follows_events: bool = False      # reads the events stream (the planner's fold, memory's archive)
    writes_artifacts: bool = False    # puts sources, objects and logs into the object store
    extra: tuple[str, ...] = field(default=())  # further subjects, each with the reason in a comment where set


#: THE roles table. A service may publish only these; everything else is refused (by the server, and by
#: send_work before it reaches one).
ROLES: dict[str, Role] = {
    "planner": Role(publishes=("campaign_started", "point_proposed", "compare_request", "campaign_finished",
                              "resend_answered"),
                    # every stage: it sends a dead letter's work back to the stage it came from (deadletters.py)
                    queues=STAGES, follows_events=True,
                    # it reads every stage's consumer lag for its metrics, and reads and removes the dead letters
                    # it sends back
                    extra=(f"$JS.API.CONSUMER.INFO.{WORK_STREAM}.*", f"$JS.API.STREAM.MSG.GET.{DLQ_STREAM}",
                           f"$JS.API.STREAM.MSG.DELETE.{DLQ_STREAM}")),
    "coder": Role(publishes=("candidate_created", "rejected"), queues=(Stage.COMPILER,),
                  consumes=(Stage.CODER, *AGENT_STAGES), writes_artifacts=True),
    # a compiled search candidate goes to the benchmarker's screen first, and on to the verifier if it can still
    # rank (kfactory/judge/order.py)
    "compiler": Role(publishes=("compiled", "compile_failed"), queues=(Stage.VERIFIER, Stage.BENCHMARKER),
                     consumes=(Stage.COMPILER,), writes_artifacts=True),
    "verifier": Role(publishes=("verified", "rejected"), queues=(Stage.BENCHMARKER,), consumes=(Stage.VERIFIER,)),
    "benchmarker": Role(publishes=("measured", "rejected", "comparison"), queues=(Stage.VERIFIER,),
                        consumes=(Stage.BENCHMARKER,)),
    "memory": Role(follows_events=True),
}


def may_queue(roles: Iterable[str], stage: str) -> bool:
    """Whether any of the named roles sends work to `stage` (a name that is no role queues nothing)."""
    return any(stage in ROLES[r].queues for r in roles if r in ROLES)


def consumer_of(stage: str) -> str:
    """The role whose service consumes `stage`'s work; KeyError for a stage nobody consumes."""
    for name, role in ROLES.items():
        if stage in role.consumes:
            return name
    raise KeyError(f"no role consumes stage {stage!r}: add it to kfactory/bus/topology.py ROLES")


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether a NATS subject matches a subscription-style pattern: `*` is one token, a final `>` one or more."""
    pt, st = pattern.split("."), subject.split(".")
    for i, tok in enumerate(pt):
        if tok == ">":
            return i == len(pt) - 1 and len(st) > i
        if i >= len(st) or (tok != "*" and tok != st[i]):
            return False
    return len(pt) == len(st)


def stream_of(subject: str) -> str | None:
    """The stream holding `subject`, or None."""
    return next((s for s, prefix in STREAM_PREFIX.items() if subject.startswith(prefix + ".")), None)

"""Agent personas: each is a separate consumer of its own work subject, with its own prompt and parent rule."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Persona:
    """A specialised agent. `parents` says which candidates the planner hands it: the best measured ones
    ("best"), or a candidate that failed to compile or computed wrong results plus the best one ("failed")."""
    name: str
    parents: str
    prompt: str
    summary: str


PERSONAS: dict[str, Persona] = {p.name: p for p in (
    Persona("memory_bound", "best", "persona_memory_bound.md",
            "memory-bound specialist: fewer passes over memory, wide loads and stores, prefetch, cache reuse"),
    Persona("compute_bound", "best", "persona_compute_bound.md",
            "compute-bound specialist: vectorised arithmetic, cheaper transcendental functions, instruction-level "
            "parallelism"),
    Persona("repairer", "failed", "persona_repairer.md",
            "repairer: fixes kernels that did not compile or computed wrong results"),
)}


def persona_stage(name: str) -> str:
    """The work stage (subject segment and durable consumer name) of a persona: agent_<name>."""
    return f"agent_{name}"

"""Agent coders: LLMs as variation operators.

An agent gets a prompt built from the problem, the family's ABI and launch rule, the target's facts, one to three
parent candidates with their full evidence and memory's lessons (kfactory.agents.prompt), calls a model through
one backend (kfactory.agents.backends: the OpenAI-compatible chat API or Anthropic's messages API), and returns a
kernel source that passed the static checks (kfactory.agents.extract), or a typed failure
(kfactory.agents.errors). Agents only write source: nothing they return runs in the process that called them.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kfactory.agents.agent import Agent, AgentWork
    from kfactory.agents.errors import AgentFailure
    from kfactory.agents.personas import PERSONAS, Persona, persona_stage

#: where each public name lives. Imported when first asked for, not with the package: the bus's topology needs
#: only the personas, and every command and service imports the topology, while the agent itself pulls in the
#: prompt builder and the judge (0.4 s of a command's start)
_HOME = {"Agent": "agent", "AgentWork": "agent", "AgentFailure": "errors", "PERSONAS": "personas",
         "Persona": "personas", "persona_stage": "personas"}

__all__ = ["Agent", "AgentWork", "AgentFailure", "PERSONAS", "Persona", "persona_stage"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)

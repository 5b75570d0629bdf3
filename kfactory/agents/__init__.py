"""Agent coders: LLMs as variation operators.

An agent gets a prompt built from the problem, the family's ABI and launch rule, the target's facts, one to three
parent candidates with their full evidence and memory's lessons (kfactory.agents.prompt), calls a model through
one backend (kfactory.agents.backends: the OpenAI-compatible chat API or Anthropic's messages API), and returns a
kernel source that passed the static checks (kfactory.agents.extract), or a typed failure
(kfactory.agents.errors). Agents only write source: nothing they return runs in the process that called them.
"""
from kfactory.agents.agent import Agent, AgentWork
from kfactory.agents.errors import AgentFailure
from kfactory.agents.personas import PERSONAS, Persona, persona_stage

__all__ = ["Agent", "AgentWork", "AgentFailure", "PERSONAS", "Persona", "persona_stage"]

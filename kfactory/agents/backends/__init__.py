"""Model backends, one module each, chosen by name: `openai` (the OpenAI-compatible chat API spoken by vLLM,
SGLang, Ollama and hosted providers) and `anthropic` (Anthropic's messages API)."""
from __future__ import annotations

import importlib

from kfactory.agents.backends.base import Backend, Reply

KNOWN = ("openai", "anthropic")


def get_backend(name: str, settings, client) -> Backend:
    """The backend called `name`, speaking through the httpx.AsyncClient `client`."""
    if name not in KNOWN:
        raise ValueError(f"unknown LLM provider {name!r}; one of: {', '.join(KNOWN)}")
    mod = importlib.import_module(f"kfactory.agents.backends.{name}")
    return mod.BACKEND(settings, client)


__all__ = ["Backend", "Reply", "get_backend", "KNOWN"]

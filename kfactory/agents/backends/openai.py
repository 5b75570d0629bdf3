"""The OpenAI-compatible chat completions API (vLLM, SGLang, Ollama, hosted providers): POST {base}/chat/completions."""
from __future__ import annotations

from kfactory.agents.backends.base import Backend, Reply, field, usage


class OpenAIBackend(Backend):
    name = "openai"

    async def complete(self, system: str, messages: list[dict[str, str]]) -> Reply:
        body = {"model": self.model, "messages": [{"role": "system", "content": system}, *messages],
                "max_tokens": self.settings.llm_max_tokens, "temperature": self.settings.llm_temperature}
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        data = await self.post(f"{self.base_url}/chat/completions", headers, body)
        choice = field(data, "choices", 0, kind=dict)
        msg = field(choice, "message", kind=dict)
        tokens_in, tokens_out = usage(data, "prompt_tokens", "completion_tokens")
        finish = str(choice.get("finish_reason") or "")
        refused = bool(msg.get("refusal")) or finish == "content_filter"
        text = msg.get("content") or ""
        if not isinstance(text, str):
            text = ""
        return Reply(text=text, tokens_in=tokens_in, tokens_out=tokens_out, finish=finish,
                     model=str(data.get("model") or self.model), refused=refused)


BACKEND = OpenAIBackend

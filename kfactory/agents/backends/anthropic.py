"""Anthropic's messages API: POST {base}/v1/messages with x-api-key and anthropic-version headers."""
from __future__ import annotations

from kfactory.agents.backends.base import Backend, Reply, field, usage

API_VERSION = "2023-06-01"


class AnthropicBackend(Backend):
    name = "anthropic"

    def _url(self) -> str:
        # accept both https://api.anthropic.com and https://api.anthropic.com/v1 as the base URL
        return f"{self.base_url}/messages" if self.base_url.endswith("/v1") else f"{self.base_url}/v1/messages"

    async def complete(self, system: str, messages: list[dict[str, str]]) -> Reply:
        body = {"model": self.model, "system": system, "messages": messages,
                "max_tokens": self.settings.llm_max_tokens, "temperature": min(1.0, self.settings.llm_temperature)}
        headers = {"anthropic-version": API_VERSION}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        data = await self.post(self._url(), headers, body)
        blocks = field(data, "content", kind=list)
        text = "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        tokens_in, tokens_out = usage(data, "input_tokens", "output_tokens")
        stop = str(data.get("stop_reason") or "")
        return Reply(text=text, tokens_in=tokens_in, tokens_out=tokens_out, finish=stop,
                     model=str(data.get("model") or self.model), refused=stop == "refusal")


BACKEND = AnthropicBackend

"""ScriptedModelServer: a TEST DOUBLE of an LLM endpoint. It is not a model.

It speaks the OpenAI-compatible chat API (POST /v1/chat/completions) and Anthropic's messages API
(POST /v1/messages) over real HTTP on a free local port, and answers each request from a script: per persona
(read from the system prompt's "(persona NAME)"), a list of actions taken in order, the last one repeating.
Actions: Reply(text) (usage counted as characters/4), Hang() (never answers), Status(code, headers) (e.g. 429
with Retry-After), Refuse(), Raw(body) (a 200 with that JSON as it is). Every request and the usage it was billed
is recorded, so tests compare the factory's token accounting with what the double served.

Standalone (for `kfactory run ... --coders template,agent` against a working endpoint):
    python tests/scripted_model.py --port 8765      # then KFACTORY_LLM_BASE_URL=http://127.0.0.1:8765/v1
"""
from __future__ import annotations

import argparse
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

KERNELS = Path(__file__).parent / "kernels"
_PERSONA = re.compile(r"\(persona (\w+)\)")


@dataclass
class Reply:
    text: str


@dataclass
class Hang:
    """Accept the request and never answer (until the server stops)."""


@dataclass
class Status:
    code: int
    headers: dict = field(default_factory=dict)


@dataclass
class Raw:
    """Answer 200 with this JSON body as it is (a malformed reply, for one API or the other)."""
    body: dict


@dataclass
class Refuse:
    text: str = "I can't help with that."


def fenced(source: str, note: str = "Here is the kernel.", flags: str | None = None) -> str:
    """A reply as a model would write it: a sentence, the kernel in a ```c block, optional ```flags block."""
    out = f"{note}\n\n```c\n{source}```\n"
    return out + (f"\n```flags\n{flags}\n```\n" if flags else "")


GARBAGE = "Softmax is a function that turns logits into probabilities. I hope this helps!"


def softmax_script() -> dict[str, list]:
    """The standalone double's script for the softmax problem on the cpu target."""
    fast = (KERNELS / "softmax_two_pass.c").read_text()
    repaired = (KERNELS / "softmax_repaired.c").read_text()
    return {"memory_bound": [Reply(fenced(fast, "Two passes instead of three: one expf per element.",
                                          "-O3 -march=native -fopenmp"))],
            "compute_bound": [Reply(GARBAGE), Reply(fenced(fast, "Fewer expf calls.", "-O2 -fopenmp"))],
            "repairer": [Reply(fenced(repaired, "Fixed: the sum variable is s.", "-O3 -fopenmp"))]}


class ScriptedModelServer:
    """The double. Use as a context manager; `url` is its base (append /v1 for the OpenAI-compatible API)."""

    def __init__(self, script: dict[str, list], port: int = 0, dump: Path | None = None):
        self.script = {k: list(v) for k, v in script.items()}
        self.dump = dump  # a directory where each request's prompt is written (standalone runs), or None
        self.served: list[dict] = []      # {persona, api, tokens_in, tokens_out, action}
        self.requests: list[dict] = []    # {persona, api, body}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "ScriptedModelServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def next_action(self, persona: str):
        with self.lock:
            actions = self.script.get(persona) or self.script.get("*") or [Reply(GARBAGE)]
            return actions.pop(0) if len(actions) > 1 else actions[0]

    def record(self, **entry) -> None:
        with self.lock:
            self.served.append(entry)

    def tokens(self) -> tuple[int, int]:
        with self.lock:
            return sum(s["tokens_in"] for s in self.served), sum(s["tokens_out"] for s in self.served)

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                api = "anthropic" if self.path.endswith("/messages") else "openai"
                system = body.get("system") if api == "anthropic" else body["messages"][0]["content"]
                m = _PERSONA.search(system or "")
                persona = m.group(1) if m else "?"
                with server.lock:
                    server.requests.append({"persona": persona, "api": api, "body": body})
                    n = len(server.requests)
                if server.dump is not None:
                    text = f"# system\n{system}\n" + "".join(f"\n# {m['role']}\n{m['content']}\n"
                                                               for m in body["messages"] if m["role"] != "system")
                    (server.dump / f"{n:03d}-{persona}.md").write_text(text)
                action = server.next_action(persona)
                if isinstance(action, Hang):
                    server.stopping.wait(600)
                    return
                if isinstance(action, Status):
                    self._send(action.code, {"error": {"message": "scripted status"}}, action.headers)
                    return
                if isinstance(action, Raw):
                    self._send(200, action.body)
                    return
                prompt_chars = len(json.dumps(body["messages"])) + len(system or "")
                tin, tout = prompt_chars // 4, len(action.text) // 4
                server.record(persona=persona, api=api, tokens_in=tin, tokens_out=tout, action=type(action).__name__)
                refused = isinstance(action, Refuse)
                self._send(200, _anthropic(action.text, tin, tout, refused) if api == "anthropic"
                           else _openai(action.text, tin, tout, refused))

            def _send(self, code: int, payload: dict, headers: dict | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _openai(text: str, tin: int, tout: int, refused: bool) -> dict:
    msg = {"role": "assistant", "content": None if refused else text, "refusal": text if refused else None}
    return {"id": f"chatcmpl-double-{time.time_ns()}", "object": "chat.completion", "model": "scripted-double",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": tin, "completion_tokens": tout, "total_tokens": tin + tout}}


def _anthropic(text: str, tin: int, tout: int, refused: bool) -> dict:
    return {"id": f"msg_double_{time.time_ns()}", "type": "message", "role": "assistant", "model": "scripted-double",
            "content": [{"type": "text", "text": text}], "stop_reason": "refusal" if refused else "end_turn",
            "usage": {"input_tokens": tin, "output_tokens": tout}}


def main() -> None:
    ap = argparse.ArgumentParser(description="A scripted TEST DOUBLE of an LLM endpoint (not a model).")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--dump", type=Path, help="write each request's prompt into this directory")
    args = ap.parse_args()
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
    with ScriptedModelServer(softmax_script(), args.port, args.dump) as s:
        print(f"scripted model double (not a model) at {s.url}/v1 (OpenAI-compatible) and {s.url}/v1/messages "
              "(Anthropic); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(5)
                tin, tout = s.tokens()
                print(f"served {len(s.served)} replies, {tin} tokens in, {tout} out", flush=True)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

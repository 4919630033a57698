"""A tiny OpenAI-compatible HTTP server (stdlib) that MISBEHAVES ON PURPOSE, for the failure cases the real server
(LlamaFactory's `api`, tests/integration/test_eval_api.py) cannot be made to show: an answer that is no chat
completion, an answer slower than the client's timeout, a refusal. Its normal answer echoes the last user turn.

    srv = OpenAIDouble(mode="echo" | "malformed" | "slow" | "refuse-odd", delay=2.0)
    srv.url       # http://127.0.0.1:PORT/v1
    srv.requests  # the bodies it received
    srv.stop()

Modes: ``echo`` answers the last user message; ``malformed`` answers 200 with JSON that has no choices;
``slow`` sleeps ``delay`` seconds before answering; ``refuse-odd`` answers HTTP 500 to every other request.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OpenAIDouble:
    def __init__(self, mode: str = "echo", delay: float = 0.0, model: str = "double") -> None:
        self.mode, self.delay, self.model = mode, delay, model
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                if self.path.endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [{"id": outer.model}]}).encode())
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                with outer._lock:
                    outer.requests.append(body)
                    count = len(outer.requests)
                if not self.path.endswith("/chat/completions"):
                    self._send(404, b'{"detail":"Not Found"}')
                    return
                if outer.mode == "malformed":
                    self._send(200, b'{"id": "x", "object": "chat.completion", "choices": []}')
                    return
                if outer.mode == "refuse-odd" and count % 2 == 1:
                    self._send(500, b'{"detail":"refused on purpose"}')
                    return
                if outer.mode == "slow":
                    time.sleep(outer.delay)
                users = [m["content"] for m in body.get("messages", []) if m.get("role") == "user"]
                text = users[-1] if users else ""
                if body.get("stream"):
                    chunks = [text[: len(text) // 2], text[len(text) // 2:]]
                    out = b"".join(b"data: " + json.dumps({"choices": [{"delta": {"content": c}}]}).encode() + b"\n\n"
                                   for c in chunks) + b"data: [DONE]\n\n"
                    self._send(200, out, "text/event-stream")
                    return
                self._send(200, json.dumps({"id": "x", "object": "chat.completion", "model": body.get("model"),
                                            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                         "finish_reason": "stop"}],
                                            "usage": {"prompt_tokens": 3, "completion_tokens": max(1, len(text.split())),
                                                      "total_tokens": 3}}).encode())

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self._srv.daemon_threads = True
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._srv.server_address[1]}/v1"

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()

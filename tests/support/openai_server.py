"""An OpenAI-compatible HTTP server on 127.0.0.1 (stdlib ``ThreadingHTTPServer``, port 0) that answers with the
tiny target's real greedy generations (transformers ``generate`` on CPU), with faults injected on demand.

``faults[prompt_id]`` is a list of actions taken by that prompt's successive requests (then ``ok``):
``500``, ``400``, ``sleep`` (no reply until the server stops: the client's timeout fires), ``drop`` (the
socket closed with no reply), ``cut`` (half a reply, then closed), ``garbage`` / ``nested`` / ``huge`` (a 200 whose body is
not the API's: a number as content, JSON nested too deeply, 4 MB), ``surrogate`` (a content holding an escaped lone
surrogate), ``redirect`` (a 302 to ``redirect_to``), ``trickle`` (headers one byte every 0.2 s, never ending). A prompt's id is its last message's content (chat) or its text (completion). ``always[prompt_id]`` is
an action for every request. ``serve_limit``: after that many answers, requests wait for ``gate``.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class TinyTarget:
    """The tiny target's greedy generation, as a server runs it (template, generate, decode)."""

    def __init__(self, target_dir: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        self.lock = threading.Lock()

    def prompt_ids(self, body: dict) -> list[int]:
        if "messages" in body:
            kwargs = body.get("chat_template_kwargs") or {}
            text = self.tok.apply_chat_template(
                body["messages"], tokenize=False, add_generation_prompt=True, **kwargs
            )
            return list(self.tok(text, add_special_tokens=False)["input_ids"])
        return list(self.tok(body["prompt"], add_special_tokens=True)["input_ids"])

    def generate(self, ids: list[int], max_tokens: int) -> tuple[list[int], bool]:
        eos = self.model.generation_config.eos_token_id
        with self.lock, self.torch.no_grad():
            x = self.torch.tensor([ids])
            y = self.model.generate(
                input_ids=x, attention_mask=self.torch.ones_like(x), max_new_tokens=max_tokens,
                do_sample=False, eos_token_id=eos, pad_token_id=eos,
            )[0, len(ids) :].tolist()  # fmt: skip
        stopped = eos in y
        return (y[: y.index(eos)] if stopped else y), stopped

    def answer(self, body: dict) -> tuple[str, str, int]:
        """(text, finish_reason, completion tokens: the end-of-sequence token counted, as vLLM does)."""
        new, stopped = self.generate(self.prompt_ids(body), int(body.get("max_tokens") or 16))
        text = self.tok.decode(new, skip_special_tokens=True)
        return text, ("stop" if stopped else "length"), len(new) + stopped


def prompt_id(body: dict) -> str:
    return body["messages"][-1]["content"] if "messages" in body else body["prompt"]


class FaultyServer:
    def __init__(self, target: TinyTarget):
        self.target = target
        self.faults: dict[str, list[str]] = {}
        self.always: dict[str, str] = {}
        self.attempts: dict[str, int] = defaultdict(int)
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []  # the Authorization header of every request
        self.served = 0
        self.redirect_to = ""  # where the "redirect" action points
        self.serve_limit: int | None = None
        self.gate = threading.Event()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(30)

    def action(self, body: dict) -> str:
        pid = prompt_id(body)
        with self.lock:
            self.bodies.append(body)
            n = self.attempts[pid]
            self.attempts[pid] += 1
            if pid in self.always:
                return self.always[pid]
            plan = self.faults.get(pid, [])
            return plan[n] if n < len(plan) else "ok"

    def wait_turn(self) -> None:
        with self.lock:
            self.served += 1
            over = self.serve_limit is not None and self.served > self.serve_limit
        if over:
            self.gate.wait(120)


BAD_REPLIES = {
    "garbage": b'{"choices": [{"message": {"content": 7}}]}',
    "nested": b"[" * 200_000,
    "huge": b'{"choices": [{"message": {"content": "' + b"x" * 4_000_000 + b'"}}]}',
    "surrogate": b'{"choices": [{"message": {"content": "ok \\ud800 then"}, "finish_reason": "stop"}]}',
}


def _reply(body: dict, text: str, finish: str, tokens: int) -> dict:
    choice = {"index": 0, "finish_reason": finish}
    if "messages" in body:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    usage = {"completion_tokens": tokens}
    return {
        "id": "x",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [choice],
        "usage": usage,
    }


def _handler(server: FaultyServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code: int, payload: bytes, cut: bool = False) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload[: len(payload) // 2] if cut else payload)
            if cut:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                self._send(404, b'{"error": "no such route"}')
                return
            server.auth.append(self.headers.get("Authorization"))
            act = server.action(body)
            if act == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            if act == "sleep":
                server.stopping.wait(60)
                self.close_connection = True
                return
            if act in ("500", "400"):
                self._send(int(act), b'{"error": "injected"}')
                return
            if act == "redirect":  # to server.redirect_to (another origin), as a hostile server may
                self.send_response(302)
                self.send_header("Location", server.redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if act == "trickle":  # the status line and headers one byte at a time, never ending
                for b in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" * 1000:
                    if server.stopping.wait(0.2):
                        break
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                self.close_connection = True
                return
            if act in BAD_REPLIES:
                self._send(200, BAD_REPLIES[act])
                return
            server.wait_turn()
            text, finish, tokens = server.target.answer(body)
            self._send(200, json.dumps(_reply(body, text, finish, tokens)).encode(), cut=act == "cut")

    return Handler

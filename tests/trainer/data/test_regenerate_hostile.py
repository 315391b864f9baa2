"""``trainer.regenerate`` against a hostile server (a real HTTP server on 127.0.0.1): a redirect to another origin
is not followed (and the key never goes there), ``--timeout`` is a deadline for the whole reply however slowly
it trickles, and a reply whose text no UTF-8 file can hold is a rejected prompt, not the end of the run."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trainer.regeneration import client, command, store
from trainer.regeneration.prompt_file import Prompt

KEY = "sk-secret-key"


class _Elsewhere:
    """Another origin: records every request it gets (method, Authorization) and answers a valid reply."""

    def __init__(self):
        self.got: list[tuple[str, str | None]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _any(self):
                outer.got.append((self.command, self.headers.get("Authorization")))
                body = json.dumps({"choices": [{"message": {"content": "planted"}, "finish_reason": "stop"}]})
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/chat/completions"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _prompt(text: str) -> Prompt:
    return Prompt(0, "k", [{"role": "user", "content": text}], None, None)


def test_a_redirect_to_another_origin_is_not_followed_nor_given_the_key(server):
    other = _Elsewhere()
    try:
        server.redirect_to, server.always = other.url, {"hi": "redirect"}
        cfg = client.ServerConfig(server.url, "tiny", timeout=30, retries=2, backoff=0.01, api_key=KEY)
        with pytest.raises(client.Permanent, match=r"HTTP 302: a redirect .* is not followed"):
            client.generate(cfg, _prompt("hi"))
        assert server.attempts["hi"] == 1  # refused at once, not retried
        assert server.auth == [f"Bearer {KEY}"]  # the key went to the endpoint given, and only there
        assert other.got == []
    finally:
        other.close()


def test_the_timeout_is_a_deadline_for_a_trickled_reply(server):
    server.always = {"hi": "trickle"}  # one byte every 0.2 s: each read is quick, the reply never ends
    cfg = client.ServerConfig(server.url, "tiny", timeout=1.0, retries=0)
    t0 = time.monotonic()
    with pytest.raises(client.Transient, match=r"no whole reply within 1 s"):
        client.generate(cfg, _prompt("hi"))
    assert time.monotonic() - t0 < 10  # the deadline (1 s) and the close, not the trickle's 10 minutes


def test_a_lone_surrogate_is_a_rejected_reply_and_the_run_goes_on(server, tmp_path, capsys):
    recs = [
        {"messages": [{"role": "user", "content": f"count {i}"}, {"role": "assistant", "content": "x"}]}
        for i in range(3)
    ]
    server.always = {"count 1": "surrogate"}
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--input", str(inp), "--output", str(out), "--endpoint", server.url, "--model", "tiny",
            "--max-tokens", "4", "--retries", "1", "--backoff", "0.01", "--timeout", "30",
            "--thinking", "off", "--progress-every", "0"]  # fmt: skip
    assert command.main(argv) == 1  # some failed: the run ended normally and says so
    fails = [json.loads(x) for x in (out / store.FAILURES).read_text().splitlines()]
    assert [f["index"] for f in fails] == [1] and "not UTF-8 text" in fails[0]["error"]
    assert len((out / store.OUTPUT).read_text(encoding="utf-8").splitlines()) == 2
    assert server.attempts["count 1"] == 1  # permanent: not retried
    assert "1 prompt(s) failed (input indices [1])" in capsys.readouterr().err

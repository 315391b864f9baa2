"""An OpenAI-compatible server (vLLM, SGLang) as the generator: ``/v1/chat/completions`` for chats,
``/v1/completions`` for completion prompts (stdlib ``http.client``, one blocking request per thread).

Retried with exponential backoff (``backoff * 2**attempt`` seconds, capped at 30, with jitter): HTTP 5xx, 408
and 429, timeouts, refused or dropped connections, a reply cut short. Any other 4xx or a reply that is not
what the API promises fails at once (``Permanent``). The reply is untrusted: at most ``MAX_REPLY`` bytes are
read, every field used is type-checked, and text that is not UTF-8 (a lone surrogate escaped in the JSON) is a
rejected reply. ``timeout`` is a deadline for the whole request (headers and body, however slowly they come).
Requests go to the endpoint as given (``http_proxy`` is not used) and a redirect is never followed (it could
take the ``Authorization`` key to another origin): a 3xx is a ``Permanent`` failure naming where it pointed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass

from trainer.regeneration.prompt_file import Prompt, Reply

MAX_REPLY = 16 * 2**20
RETRY_STATUS = {408, 429}


class Permanent(Exception):
    """A failure that retrying cannot fix."""


class Transient(Exception):
    pass


@dataclass(frozen=True)
class ServerConfig:
    endpoint: str  # e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 1024
    thinking: str | None = None  # "on" / "off" / None (the server's default)
    timeout: float = 600.0
    retries: int = 5
    backoff: float = 1.0
    api_key: str | None = None  # sent as ``Authorization: Bearer`` (vLLM / SGLang ``--api-key``)


def _url(cfg: ServerConfig, chat: bool) -> str:
    base = cfg.endpoint.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    return base + ("/chat/completions" if chat else "/completions")


def request_body(cfg: ServerConfig, p: Prompt) -> dict:
    body = {"model": cfg.model, "temperature": cfg.temperature, "top_p": cfg.top_p}
    body["max_tokens"] = cfg.max_tokens
    if p.messages is not None:
        body["messages"] = p.messages
        if p.tools:
            body["tools"] = p.tools
        if cfg.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": cfg.thinking == "on"}
    else:
        body["prompt"] = p.text
    return body


def _str_or_none(d: dict, name: str) -> str | None:
    v = d.get(name)
    if v is not None and not isinstance(v, str):
        raise Permanent(f"reply: {name} is {type(v).__name__}, not a string")
    if v is not None:
        _utf8(v, name)
    return v


def _utf8(text: str, name: str) -> None:
    """JSON can escape a lone surrogate (``"\\ud800"``), which no UTF-8 file can hold: such a reply is refused."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Permanent(f"reply: {name} is not UTF-8 text ({e.reason} at character {e.start})") from None


def _completion_tokens(rep: dict) -> int | None:
    usage = rep.get("usage")
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 else None


def parse_reply(raw: bytes, chat: bool) -> Reply:
    """(the response text, finish_reason, tool_calls, the usage's completion_tokens). A chat reply's separate reasoning (vLLM's
    ``reasoning_content``, ``reasoning``) goes back in front of the content as ``<think>...</think>``, as the
    template renders it; its ``tool_calls`` (a list of objects) are kept as they came."""
    try:
        rep = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise Permanent(f"reply is not JSON: {raw[:200]!r}") from None
    choices = rep.get("choices") if isinstance(rep, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Permanent(f"reply has no choices: {raw[:200]!r}")
    c = choices[0]
    finish = _str_or_none(c, "finish_reason")
    if not chat:
        text = _str_or_none(c, "text")
        if text is None:
            raise Permanent("reply: choices[0].text missing")
        return Reply(text, finish, None, _completion_tokens(rep))
    msg = c.get("message")
    if not isinstance(msg, dict):
        raise Permanent("reply: choices[0].message missing")
    content = _str_or_none(msg, "content") or ""
    reasoning = _str_or_none(msg, "reasoning_content") or _str_or_none(msg, "reasoning")
    if reasoning:
        content = f"<think>\n{reasoning.strip()}\n</think>\n\n{content.lstrip()}"
    calls = msg.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(isinstance(x, dict) for x in calls)):
        raise Permanent("reply: tool_calls is not a list of objects")
    if calls:
        _utf8(json.dumps(calls, ensure_ascii=False), "tool_calls")
    return Reply(content, finish, calls or None, _completion_tokens(rep))


def _post(url: str, body: dict, timeout: float, api_key: str | None = None) -> bytes:
    """POST ``body``; the reply's bytes. ``timeout`` is a deadline for the whole exchange (connect, headers and
    body): a server that trickles its reply is cut off when it passes. No redirect is followed."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise Permanent(f"{url}: not an http(s) URL")
    conn_cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(u.hostname, u.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    expired = threading.Event()
    watchdog = threading.Timer(timeout, _expire, (conn, expired))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", u.path + (f"?{u.query}" if u.query else ""), json.dumps(body).encode(), headers)
        resp = conn.getresponse()
        return _reply(resp, url)
    except (http.client.HTTPException, OSError) as e:
        if expired.is_set():
            raise Transient(f"no whole reply within {timeout:g} s") from None
        raise Transient(f"{type(e).__name__}: {e}") from None
    finally:
        watchdog.cancel()
        conn.close()


def _expire(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """The deadline passed: the blocked read (headers or body) returns at once."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _reply(resp: http.client.HTTPResponse, url: str) -> bytes:
    if 300 <= resp.status < 400:  # never followed: it could take the request (and the key) to another origin
        where = " ".join(str(resp.getheader("Location", "")).split())[:200]
        raise Permanent(
            f"HTTP {resp.status}: a redirect (to {where!r}) is not followed; give the final endpoint"
        )
    if resp.status >= 400:
        detail = resp.read(500).decode("utf-8", "replace")
        err = f"HTTP {resp.status}: {detail}"
        raise Transient(err) if resp.status >= 500 or resp.status in RETRY_STATUS else Permanent(err)
    raw = resp.read(MAX_REPLY + 1)
    length = resp.getheader("Content-Length", "") or ""
    if len(raw) > MAX_REPLY:
        raise Permanent(f"reply larger than {MAX_REPLY} bytes")
    if length.isdigit() and len(raw) < int(length) <= MAX_REPLY:  # read() returns what came before a close
        raise Transient(f"reply cut short: {len(raw)} of {length} bytes")
    return raw


def generate(cfg: ServerConfig, p: Prompt, sleep=time.sleep) -> Reply:
    """The server's response to ``p``, retried on transient failures; raises ``Permanent`` or the last
    ``Transient`` when the retries are spent."""
    chat = p.messages is not None
    url, body = _url(cfg, chat), request_body(cfg, p)
    for attempt in range(cfg.retries + 1):
        try:
            return parse_reply(_post(url, body, cfg.timeout, cfg.api_key), chat)
        except Transient as e:
            if attempt == cfg.retries:
                raise Transient(f"{e} (after {cfg.retries + 1} attempts)") from None
            delay = min(30.0, cfg.backoff * 2**attempt)
            sleep(delay * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")

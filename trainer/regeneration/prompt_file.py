"""The prompts to regenerate and their keys.

One JSON object a line: ``{"messages": [...]}`` / ``{"conversations": [...]}`` (a chat: the turns before the
last assistant turn are the prompt; an existing last assistant turn is the data's response and is replaced) or
``{"prompt": "..."}`` (a completion prompt). ``Prompt.key`` is the SHA-256 of the canonical JSON of the
prompt, the generation settings and the prompt's occurrence number (the same prompt twice in a file is two
results), so a resumed run recognises what it already wrote.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import NamedTuple

from trainer.data.chat import record_tools
from trainer.data.tokenizing import PrepareError, _messages


class PromptError(ValueError):
    """A malformed input line (named by file and line): exit status 2."""


@dataclass(frozen=True)
class Prompt:
    index: int  # 0-based position among the input's prompts
    key: str
    messages: list[dict] | None  # chat mode: the conversation up to the reply
    text: str | None  # completion mode
    tools: list | None = None  # a chat record's tool definitions (sent to the template, kept in the output)


class Reply(NamedTuple):
    """What a generator made of one prompt: the text, why it stopped, the tool calls a server parsed, and how
    many tokens the target wrote (None when the server does not say)."""

    text: str
    finish_reason: str | None
    tool_calls: list | None = None
    tokens: int | None = None


def canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _parse(rec, mode: str) -> tuple[list[dict] | None, str | None, list | None]:
    if not isinstance(rec, dict):
        raise PromptError(f"expected a JSON object, got {type(rec).__name__}")
    if mode == "chat":
        try:
            msgs, tools = _messages(rec), record_tools(rec)
        except PrepareError as e:
            raise PromptError(str(e)) from None
        if msgs is None:
            raise PromptError('chat mode needs "messages" or "conversations"')
        while msgs and msgs[-1]["role"] == "assistant":
            msgs = msgs[:-1]
        if not msgs:
            raise PromptError("the conversation has no turn before its assistant turn")
        return msgs, None, tools
    if not isinstance(rec.get("prompt"), str) or not rec["prompt"]:
        raise PromptError('completion mode needs a non-empty string "prompt"')
    return None, rec["prompt"], None


def read_prompts(path: str, mode: str, settings: dict) -> list[Prompt]:
    """Every prompt of ``path`` in file order (``mode``: ``chat`` or ``completion``)."""
    out: list[Prompt] = []
    seen: dict[bytes, int] = {}  # prompt digest -> occurrences so far
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                msgs, text, tools = _parse(json.loads(line), mode)
            except json.JSONDecodeError as e:
                raise PromptError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            except RecursionError:
                raise PromptError(f"{path}:{lineno}: JSON nested too deeply") from None
            except PromptError as e:
                raise PromptError(f"{path}:{lineno}: {e}") from None
            body = canonical({"messages": msgs, "tools": tools} if msgs is not None else {"prompt": text})
            digest = hashlib.sha256(body.encode("utf-8")).digest()
            n = seen.get(digest, 0)
            seen[digest] = n + 1
            key = hashlib.sha256(canonical([body, settings, n]).encode("utf-8")).hexdigest()
            out.append(Prompt(len(out), key, msgs, text, tools))
    return out


def output_record(
    p: Prompt,
    response: str,
    finish_reason: str | None,
    tool_calls: list | None = None,
    tokens: int | None = None,
) -> dict:
    """What ``trainer.prepare`` reads: the conversation with the target's reply appended (with its
    ``tool_calls`` when the server parsed some; the record's ``tools``), or ``prompt``/``completion``; plus
    the key, why generation stopped and the tokens written (``completion_tokens``, when known)."""
    if p.messages is not None:
        reply = {"role": "assistant", "content": response}
        if tool_calls:
            reply["tool_calls"] = tool_calls
        rec = {"messages": [*p.messages, reply]}
        if p.tools:
            rec["tools"] = p.tools
    else:
        rec = {"prompt": p.text, "completion": response}
    out = {"key": p.key, **rec, "finish_reason": finish_reason}
    if tokens is not None:
        out["completion_tokens"] = tokens
    return out

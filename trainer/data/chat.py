"""Chat conversations for ``trainer.prepare``: messages, thinking blocks, the rendered text and its parts.

A conversation is rendered once with the tokenizer's chat template (``apply_chat_template`` with the run's
``--chat-template-kwargs`` and the record's ``tools``). Each assistant turn's span is what the template
renders for that turn after its generation prompt (its thinking, content, tool calls and end-of-turn
tokens); the other characters belong to the system / user / tool message whose content they are, or to the
template (headers, tool listings). ``--thinking``: ``keep`` leaves ``<think>...</think>`` blocks and
``reasoning_content`` to the template, ``drop`` removes them from the messages, ``mask`` keeps them in the
text but out of the loss.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}
# roles a chat template renders; any other (a typo: "assistent") is refused, naming it: a template drops a
# message of a role it does not know, and its text would vanish from the data unsaid
ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
THINK_RE = re.compile(re.escape(THINK_OPEN) + r".*?" + re.escape(THINK_CLOSE), re.DOTALL)
THINKING_MODES = ("keep", "drop", "mask")
RESERVED_KWARGS = ("conversation", "tools", "tokenize", "add_generation_prompt", "continue_final_message")
PASSED_KEYS = ("tool_calls", "reasoning_content", "name", "tool_call_id")


class PrepareError(ValueError):
    pass


def _message(m, key_role: str, key_content: str, i: int = 1) -> dict:
    if not isinstance(m, dict) or not isinstance(m.get(key_role), str):
        raise PrepareError(f"each message needs string {key_role!r} and {key_content!r}")
    content = m.get(key_content)
    if content is None and m.get("tool_calls"):
        content = ""  # an assistant turn that only calls tools
    if not isinstance(content, str):
        raise PrepareError(f"each message needs string {key_role!r} and {key_content!r}")
    role = ROLE_ALIASES.get(m[key_role], m[key_role])
    if role not in ROLES:
        known = ", ".join((*ROLES, *ROLE_ALIASES))
        raise PrepareError(f"message {i}: unknown {key_role} {m[key_role][:40]!r} (known: {known})")
    out = {"role": role, "content": content}
    for k in PASSED_KEYS:
        if m.get(k) is not None:
            out[k] = m[k]
    if "tool_calls" in out and not isinstance(out["tool_calls"], list):
        raise PrepareError('"tool_calls" must be a list')
    return out


def _messages(rec: dict) -> list[dict] | None:
    """The record's messages (role, content, and tool_calls / reasoning_content / name / tool_call_id when
    given), or None when it is no chat."""
    if "messages" in rec:
        msgs, key_role, key_content = rec["messages"], "role", "content"
    elif "conversations" in rec:
        msgs, key_role, key_content = rec["conversations"], "from", "value"
    else:
        return None
    if not isinstance(msgs, list) or not msgs:
        raise PrepareError("messages must be a non-empty list")
    return [_message(m, key_role, key_content, i) for i, m in enumerate(msgs, 1)]


def record_tools(rec: dict) -> list | None:
    tools = rec.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise PrepareError('"tools" must be a list of tool definitions')
    return tools or None


def drop_thinking(msgs: list[dict]) -> list[dict]:
    """The messages without thinking: no ``reasoning_content``, no ``<think>...</think>`` in assistant turns."""
    out = []
    for m in msgs:
        if m["role"] == "assistant":
            m = {k: v for k, v in m.items() if k != "reasoning_content"}
            m["content"] = THINK_RE.sub("", m["content"]).lstrip("\n")
        out.append(m)
    return out


@dataclass(frozen=True)
class Render:
    """How conversations are rendered: the template kwargs and the record's tools."""

    kwargs: dict = field(default_factory=dict)
    tools: list | None = None

    def __call__(self, tok, msgs: list[dict], add_generation_prompt: bool = False) -> str:
        if getattr(tok, "chat_template", None):
            extra = {"tools": self.tools} if self.tools else {}
            try:
                return tok.apply_chat_template(
                    msgs, tokenize=False, add_generation_prompt=add_generation_prompt, **extra, **self.kwargs
                )
            except Exception as e:  # a template's own error (jinja2's raise_exception, a missing field)
                raise PrepareError(f"the chat template failed: {type(e).__name__}: {e}") from None
        text = "".join(f"{m['role']}: {m['content']}\n" for m in msgs)
        return text + ("assistant: " if add_generation_prompt else "")


def _render(tok, msgs: list[dict], add_generation_prompt: bool = False) -> str:
    return Render()(tok, msgs, add_generation_prompt)


def _turn_span(tok, render: Render, msgs, i: int, full: str, cursor: int) -> tuple[int, int]:
    head = render(tok, msgs[:i], add_generation_prompt=True)
    upto = render(tok, msgs[: i + 1])
    if full.startswith(head) and full.startswith(upto) and len(upto) > len(head):
        return len(head), len(upto)
    # a template that renders earlier turns otherwise (e.g. without their thinking): find the turn itself
    turn = upto[len(head) :] if upto.startswith(head) else msgs[i]["content"]
    for cand in (turn, THINK_RE.sub("", turn).lstrip("\n"), msgs[i]["content"]):
        start = full.find(cand, cursor) if cand else -1
        if start >= 0:
            return start, start + len(cand)
    raise PrepareError(f"cannot locate assistant turn {i} in the rendered conversation")


@dataclass
class Rendered:
    text: str
    trained: list[tuple[int, int]]  # character spans in the loss
    roles: list[tuple[int, int, str]]  # character spans of each role (the rest: "template")


def render_chat(tok, msgs: list[dict], render: Render, thinking: str = "keep", last_only=False) -> Rendered:
    """The rendered conversation, its trained character spans (every assistant turn's, or with
    ``last_only`` the last turn's) and its role spans. ``msgs`` are as trained (``drop_thinking`` applied)."""
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
    full = render(tok, msgs)
    trained: list[tuple[int, int]] = []
    roles: list[tuple[int, int, str]] = []
    cursor = 0
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            start = full.find(m["content"], cursor) if m["content"] else -1
            if start >= 0:
                roles.append((start, start + len(m["content"]), m["role"]))
                cursor = start + len(m["content"])
            continue
        a, b = _turn_span(tok, render, msgs, i, full, cursor)
        thoughts = [(t.start(), t.end()) for t in THINK_RE.finditer(full, a, b)]
        roles += [(s, e, "thinking") for s, e in thoughts]
        roles.append((a, b, "assistant"))
        if not last_only or i == last:
            trained += _minus(a, b, thoughts) if thinking == "mask" else [(a, b)]
        cursor = b
    return Rendered(full, trained, roles)


def _minus(a: int, b: int, holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, pos = [], a
    for s, e in holes:
        if s > pos:
            out.append((pos, s))
        pos = max(pos, e)
    return out + ([(pos, b)] if b > pos else [])

"""``DATA_DIR/prepare.json``: how ``trainer.prepare`` rendered the data, for ``trainer.export --check --data``.

``{"format": 1, "chat_template_sha256", "chat_template_kwargs", "thinking", "prompt_thinking",
"trained_tokens", "trained_thinking_tokens"}``: the hash of the chat template applied (None: the tokenizer
has none, chats were rendered as ``role: content`` lines), the ``--chat-template-kwargs`` and ``--thinking``
used, whether the template's generation prompt had thinking on or off with those kwargs (``"on"`` /
``"off"``: it renders as with ``enable_thinking`` true / false; None: the template has no such switch), and
how many trained tokens there were and how many of them were inside ``<think>`` blocks. Written last, once
the data is complete; ``--overwrite`` removes it with the rest (``output_dir``).
"""

from __future__ import annotations

import json
import os

from trainer.data.chat import PrepareError, Render
from trainer.exporting.templates import template_sha256, template_text

NAME = "prepare.json"
FORMAT = 1
_PROBE = [{"role": "user", "content": "Hello"}]


def prompt_thinking(tok, kwargs: dict) -> str | None:
    """``"on"``/``"off"``: the generation prompt rendered with ``kwargs`` equals the one with
    ``enable_thinking`` true / false (and those two differ); None otherwise."""
    if not template_text(getattr(tok, "chat_template", None)):
        return None
    try:
        got = Render(kwargs)(tok, _PROBE, add_generation_prompt=True)
        on = Render({**kwargs, "enable_thinking": True})(tok, _PROBE, add_generation_prompt=True)
        off = Render({**kwargs, "enable_thinking": False})(tok, _PROBE, add_generation_prompt=True)
    except PrepareError:
        return None
    if on == off:
        return None
    return "on" if got == on else "off" if got == off else None


def thinking_tokens(mask: list[int], roles: list[list]) -> int:
    """Trained tokens (``mask`` 1) in ``thinking`` runs of ``roles``."""
    n, pos = 0, 0
    for role, k in roles:
        if role == "thinking":
            n += sum(mask[pos : pos + k])
        pos += k
    return n


def record(tok, kwargs: dict, thinking: str, trained: int, trained_thinking: int) -> dict:
    return {
        "format": FORMAT,
        "chat_template_sha256": template_sha256(template_text(getattr(tok, "chat_template", None))),
        "chat_template_kwargs": kwargs,
        "thinking": thinking,
        "prompt_thinking": prompt_thinking(tok, kwargs),
        "trained_tokens": trained,
        "trained_thinking_tokens": trained_thinking,
    }


def write(out_dir: str, meta: dict) -> None:
    tmp = os.path.join(out_dir, f".{NAME}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, NAME))

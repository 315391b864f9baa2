"""The served-text check of ``trainer.prepare``: is the trained text what the server will render?

For each assistant turn ``i`` of a conversation the server renders the turns before it with the generation
prompt (``apply_chat_template(..., add_generation_prompt=True)`` with the server's template kwargs), and the
target continues from there; when turn ``i`` is the newest one the template renders it as
``apply_chat_template(turns[: i + 1])``. The trained text must start with both, or the drafter learns
continuations of a text the server never shows it (thinking on in training and off in serving; a template
that drops earlier turns' thinking, so the trained text of an earlier turn lacks the thinking the target
writes when that turn is the newest).
"""

from __future__ import annotations

from trainer.data.chat import PrepareError, Render

CONTEXT = 30


class ServedMismatch(PrepareError):
    """The trained text differs from the served one (exit status 2)."""


def first_difference(text: str, want: str) -> int | None:
    """The first position where ``text`` does not continue as ``want`` does; None when it starts with it."""
    if text.startswith(want):
        return None
    n = min(len(text), len(want))
    return next((p for p in range(n) if text[p] != want[p]), n)


def _excerpt(s: str, p: int) -> str:
    return repr(s[max(0, p - CONTEXT) : p]) + " | " + repr(s[p : p + CONTEXT])


def check_served(tok, msgs: list[dict], trained_text: str, served: Render, turns: list[int]) -> None:
    """Raise ServedMismatch at the first assistant turn of ``turns`` (message indices, the trained turns)
    whose served rendering ``trained_text`` lacks."""
    for i in turns:
        if i == 0:
            continue
        for what, upto, gen in (
            ("prompt for it", i, True),
            ("rendering of it as the newest turn", i + 1, False),
        ):
            want = served(tok, msgs[:upto], add_generation_prompt=gen)
            p = first_difference(trained_text, want)
            if p is None:
                continue
            raise ServedMismatch(
                f"assistant turn (message {i}): the trained text differs from the server's {what} "
                f"at character {p}:\n  trained: {_excerpt(trained_text, p)}\n"
                f"  served:  {_excerpt(want, p)}\n"
                "  (train with the server's --chat-template-kwargs / --thinking, or --turns split (each "
                "assistant turn its own sequence) / last (only the last one trained); --served-check 0 skips this check)"
            )

"""Toasts (``app.notify``) at a width that holds a path, and a long path broken at its slashes rather
than mid-name: a word longer than the toast's line is split before a ``/`` (Rich would fold it at the
edge, wherever that falls)."""

from __future__ import annotations

TOAST_CSS = "Toast { width: 90; max-width: 75%; }"  # Textual's 60 columns cut a code directory's path
TOAST_WIDTH, TOAST_SHARE, TOAST_FRAME = 90, 0.75, 3  # its width, its share of the screen, padding + border


def toast_columns(screen_width: int) -> int:
    """The columns of text in a toast on a screen ``screen_width`` wide."""
    return max(10, min(TOAST_WIDTH, int(screen_width * TOAST_SHARE)) - TOAST_FRAME)


def break_paths(message: str, columns: int) -> str:
    """``message`` with each word longer than ``columns`` split into lines before its slashes."""
    return "\n".join(
        " ".join(_split(word, columns) for word in line.split(" ")) for line in message.split("\n")
    )


def _split(word: str, columns: int) -> str:
    if len(word) <= columns or "/" not in word:
        return word
    pieces: list[str] = []
    for part in word.replace("/", "\n/").split("\n"):
        if pieces and len(pieces[-1]) + len(part) <= columns:
            pieces[-1] += part
        else:
            pieces.append(part)
    return "\n".join(p for p in pieces if p)

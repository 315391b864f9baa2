"""Numbers from untrusted JSON (records, events, the helper's answers)."""

from __future__ import annotations


def number(v: object) -> float | None:
    """``v`` as a float when it is a JSON number (an int or a float; never a bool, which is an int to
    Python), else None: a string, null, a list... is no number, whatever it spells."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

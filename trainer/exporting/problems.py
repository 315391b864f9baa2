"""What a check finds: ``Problem(severity, key, message)``, ``error`` / ``warning`` builders, and ``shown``.

``severity`` is ``"error"`` (the server refuses the directory, or loads it into a drafter that computes
something other than what was trained: the check fails) or ``"warning"`` (it loads and serves as trained, with
a caveat the operator should know). ``key`` names the config key (``dflash_config.mask_token_id``), tensor
(``layers.0.mlp.up_proj.weight``) or file. Everything taken from the checked files goes through ``shown``
(JSON-escaped ASCII, cut to 60 characters), so a hostile config cannot send a terminal control sequence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

ERROR = "error"
WARNING = "warning"
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,160}")


@dataclass(frozen=True)
class Problem:
    severity: str
    key: str
    message: str

    def line(self, server: str) -> str:
        return f"{server}: {self.severity}: {self.key}: {self.message}"

    def to_dict(self) -> dict:
        return {"severity": self.severity, "key": self.key, "message": self.message}


def shown(value: object, limit: int = 60) -> str:
    """A value from a checked file as safe text: JSON, ASCII only, at most ``limit`` characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = ascii(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def key_of(name: str) -> str:
    """A key or tensor name from a checked file, as is when plain, else ``shown``."""
    return name if isinstance(name, str) and _PLAIN_KEY.fullmatch(name) else shown(name)


def error(key: str, message: str) -> Problem:
    return Problem(ERROR, key, message)


def warning(key: str, message: str) -> Problem:
    return Problem(WARNING, key, message)


def failed(problems: list[Problem]) -> bool:
    return any(p.severity == ERROR for p in problems)

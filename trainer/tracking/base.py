"""What every tracker gets (``Context``) and does (``Tracker``): open, log points in order, close.

A tracker runs in its own thread (trainer/tracking/dispatcher.py) or, for ``python -m trainer.report``, in the
caller's; it imports its library in ``open`` (an absent library fails there, as any other error would) and may
raise from any method: the caller turns that into the tracker being off, never into a stopped run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.tracking.records import Point
from trainer.tracking.state import State


@dataclass
class Context:
    run_dir: str
    settings: dict[str, Any]  # the run's settings (hyper-parameters), JSON values
    resumed: bool = False  # the trainer resumed a checkpoint: continue the tracker's stored run
    state: State | None = None  # tracking.json (None: an export, which records no run to continue)
    log: Callable[[str], None] = print
    notes: dict[str, str] = field(default_factory=dict)  # tags of the run: {"dflash.source": "export"}

    @property
    def run_name(self) -> str:
        return os.path.basename(os.path.normpath(self.run_dir)) or "run"

    def stored(self, tracker: str) -> dict[str, Any] | None:
        """The tracker's stored run, when this start continues one."""
        if not self.resumed or self.state is None:
            return None
        return self.state.get(tracker)

    def store(self, tracker: str, entry: dict[str, Any]) -> None:
        if self.state is not None:
            self.state.put(tracker, entry)


class Tracker:
    name = "tracker"
    where = ""  # what open() wrote to, for the log line ("RUN_DIR/tensorboard")

    def prepare(self) -> None:
        """Before any thread or process starts (the caller's thread): the library's environment defaults."""

    def open(self, ctx: Context) -> None:
        raise NotImplementedError

    def log(self, points: list[Point]) -> None:
        raise NotImplementedError

    def close(self, status: str | None) -> None:
        """``status``: finished, killed or failed (records.status_of), None when the run did not say."""


def hparams(settings: dict[str, Any]) -> dict[str, str | float | bool]:
    """Settings as flat hyper-parameters: numbers and booleans as they are, None as "none", the rest as text."""
    out: dict[str, str | float | bool] = {}
    for k, v in sorted(settings.items()):
        if isinstance(v, bool) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            out[k] = v
        elif v is None:
            out[k] = "none"
        elif isinstance(v, (list, tuple)):
            out[k] = ",".join(map(str, v))
        else:
            out[k] = str(v)
    return out

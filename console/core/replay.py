"""The time cursor of a replay (``dflash-console replay``): where in the record the screen is,
moving at ``speed`` x real time from the record's start, pausable, and jumpable both ways. The
screen folds the record's events up to ``now()`` (console/tui/replay_app.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Cursor:
    def __init__(
        self, start: float, end: float, speed: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.start, self.end = start, end
        self.speed = speed
        self.clock = clock
        self._at = start  # record time at ...
        self._since = clock()  # ... this clock reading
        self.paused = False

    def now(self) -> float:
        """Record time under the cursor (stops at the end)."""
        if self.paused:
            return self._at
        return min(self.end, self._at + (self.clock() - self._since) * self.speed)

    def _rebase(self, at: float) -> None:
        self._at = max(self.start, min(self.end, at))
        self._since = self.clock()

    def toggle_pause(self) -> None:
        self._rebase(self.now())
        self.paused = not self.paused

    def jump(self, seconds: float) -> None:
        self._rebase(self.now() + seconds)

    def seek(self, t: float) -> None:
        self._rebase(t)

    def set_speed(self, speed: float) -> None:
        self._rebase(self.now())
        self.speed = max(0.125, min(1024.0, speed))

    @property
    def at_end(self) -> bool:
        return self.now() >= self.end

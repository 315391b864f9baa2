"""``ControlError``: a trainer action (find, deploy, launch, stop, restart) could not be done."""

from __future__ import annotations

from console.core.events import Outcome


class ControlError(Exception):
    """An operation could not be done; ``outcome`` says how it ended (the CLI's exit code follows)."""

    def __init__(self, message: str, outcome: Outcome = Outcome.ERROR) -> None:
        super().__init__(message)
        self.outcome = outcome

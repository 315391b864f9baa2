"""The phases of a stop (and of the launch a restart does after it): what ``ActionPhase.phase`` says.

One list for stop.py (which emits them), the session, the CLI's countdown, the health rules and the
stop dialog (which read them). A ``StopPhase`` is a ``str``: it compares equal to its value, so a phase
read back from a recording (a plain string) is the same phase (:meth:`StopPhase.of`).
"""

from __future__ import annotations

import enum


class StopPhase(str, enum.Enum):
    VERIFYING = "verifying"  # /proc/PID checked: still the trainer?
    SIGNAL_SENT = "signal_sent"  # SIGINT sent (again when the trainer's stop_requested arrives)
    SAVING = "saving"  # checkpoint_saving (expected_s), or an open-ended save of a trainer without events
    SAVED = "saved"  # checkpoint_saved
    EXITED = "exited"  # the process is gone
    TIMEOUT = "timeout"  # still running at the timeout: left running
    REFUSED = "refused"  # the PID is no longer the trainer, or it ignores the signal: nothing was signalled
    ERROR = "error"  # the trainer reported an error, or the link did not come back
    RECONNECTING = "reconnecting"  # the link dropped during the stop
    RECONNECTED = "reconnected"  # ... and came back
    LAUNCHING = "launching"  # a restart's launch, after the stop
    STARTED = "started"  # ... the new trainer wrote its started event

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, name: object) -> StopPhase | None:
        """The phase named ``name`` (a StopPhase or its string), None for a name it does not know."""
        try:
            return cls(name)
        except (ValueError, TypeError):
            return None


# a stop's steps, in the order they happen (the dialog's checklist)
STOP_STEPS: tuple[StopPhase, ...] = (
    StopPhase.VERIFYING,
    StopPhase.SIGNAL_SENT,
    StopPhase.SAVING,
    StopPhase.SAVED,
    StopPhase.EXITED,
)
# how a stop fails
FAILED: frozenset[StopPhase] = frozenset({StopPhase.TIMEOUT, StopPhase.REFUSED, StopPhase.ERROR})
# the signal went out: a stop was requested (the health rules then expect the exit)
SIGNALLED: frozenset[StopPhase] = frozenset(
    {StopPhase.SIGNAL_SENT, StopPhase.SAVING, StopPhase.SAVED, StopPhase.EXITED}
)

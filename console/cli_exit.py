"""The exit codes of ``dflash-console`` (docs/cli.md) and how an error is said."""

from __future__ import annotations

import sys

from console.core.events import Outcome

# --- exit codes (docs/cli.md) -------------------------------------------------------------------------

EXIT_OK = 0
EXIT_ERROR = 1  # other errors, a declined confirmation
EXIT_USAGE = 2  # bad usage (argparse's code too)
EXIT_STILL_RUNNING = 3  # still running at the timeout
EXIT_NO_TRAINER = 4
EXIT_REFUSED = 5  # the PID is no longer that trainer, or it ignores SIGINT
EXIT_NO_CHECKPOINT = 6  # the trainer exited without a checkpoint_saved
EXIT_READONLY = 7  # refused: the target is `readonly = true` in the config
EXIT_INTERRUPTED = 130  # Ctrl-C

EXIT_CODES = {
    Outcome.OK: EXIT_OK,
    Outcome.ERROR: EXIT_ERROR,
    Outcome.USAGE: EXIT_USAGE,
    Outcome.STILL_RUNNING: EXIT_STILL_RUNNING,
    Outcome.NO_TRAINER: EXIT_NO_TRAINER,
    Outcome.REFUSED: EXIT_REFUSED,
    Outcome.NO_CHECKPOINT: EXIT_NO_CHECKPOINT,
}


def exit_code(outcome: Outcome) -> int:
    """The exit code for how an action ended."""
    return EXIT_CODES[outcome]


# --- arguments --------------------------------------------------------------------------------------


def err(msg: str) -> None:
    print(f"dflash-console: {msg}", file=sys.stderr)

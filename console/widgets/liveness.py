"""Whether the figures on screen are live: a run that is not running shows its last known figures,
dimmed with their age, and no rates (tok/s, queue, ETA), which would otherwise look current."""

from __future__ import annotations

from rich.text import Text

from console.core.formatting import fmt_duration
from console.core.state import ConsoleState

STALE = "dim"


def running(state: ConsoleState) -> bool:
    """False once the session said there is no trainer (it exited, or none was found)."""
    return not (state.trainer_known and state.trainer is None)


def rates_live(state: ConsoleState) -> bool:
    """tok/s, the queue and the ETA are the running trainer's: not after it exited, and not during a
    new start-up (until its first step they are the previous run's)."""
    if not running(state):
        return False
    su = state.startup_view()
    return not (su is not None and su.active)


def stale_note(state: ConsoleState) -> Text:
    """``-   last known figures, 40s old`` (the throughput row when nothing runs: the bar says so)."""
    t = Text("-", style="bold")
    age = state.data_age_s()
    if not running(state):
        t.append("   last known figures" + (f", {fmt_duration(age)} old" if age is not None else ""))
        t.stylize("yellow", 1)
    else:
        t.append("   starting: no rate yet", style="dim")
    return t

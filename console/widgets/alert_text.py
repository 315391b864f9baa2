"""How alerts read in the connection bar and the training panel: the worst one, with since-when.
Levels and rules: console/core/health.py; the full list: console/screens/alerts.py."""

from __future__ import annotations

from rich.text import Text

from console.core.formatting import fmt_duration
from console.core.health import CRITICAL, NOTE, OK, WARNING, Health

STYLE = {CRITICAL: "bold white on red", WARNING: "bold black on yellow", NOTE: "cyan", OK: "green"}
MARK = {CRITICAL: "✖", WARNING: "▲", NOTE: "i", OK: "✓"}


def summary(health: Health | None, now: float, ok_text: str = "") -> Text:
    """The worst unacknowledged alert with since-when, and how many more (``ok_text`` when none)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if health is None:
        return t
    alerts = health.alerts()
    loud = [a for a in alerts if not a.acked and a.level != NOTE]
    if not loud:
        if ok_text:
            t.append(ok_text, style="green")
        quiet = len(alerts)
        if quiet:
            t.append(f" ({quiet} acknowledged or noted: a)", style="dim")
        return t
    a = loud[0]
    t.append(f" {MARK[a.level]} {a.level.upper()} ", style=STYLE[a.level])
    t.append(f" {fmt_duration(max(0.0, now - a.since))}", style="bold")
    if len(loud) > 1:
        t.append(f" +{len(loud) - 1} (a)", style="bold")
    t.append(f" {a.message}", style="bold red" if a.level == CRITICAL else "bold yellow")
    return t

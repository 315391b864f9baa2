"""Alerts (``a``): active alerts (worst first) and past ones (newest first). Enter acknowledges the
selected active alert: it stops ringing and leaves the bar and panel until it clears (or gets worse)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from console.core.formatting import fmt_duration
from console.core.health import CRITICAL, NOTE, OK, WARNING, Alert, Health

STYLE = {CRITICAL: "bold white on red", WARNING: "bold black on yellow", NOTE: "cyan", OK: "green"}
MARK = {CRITICAL: "✖", WARNING: "▲", NOTE: "i", OK: "✓"}


def alert_line(a: Alert, now: float) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{MARK[a.level]} {a.level.upper():<8}", style=STYLE[a.level])
    if a.cleared is not None:
        t.append(f" cleared {fmt_duration(max(0.0, now - a.cleared))} ago", style="dim")
        t.append(f", lasted {fmt_duration(a.cleared - a.since)}  ", style="dim")
    else:
        t.append(f" for {fmt_duration(max(0.0, now - a.since))}", style="bold")
        t.append("  acknowledged  " if a.acked else "  ", style="dim")
    t.append(a.message)
    return t


class AlertsScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,a", "dismiss", "Close"),
        Binding("enter,space", "ack", "Acknowledge"),
    ]
    DEFAULT_CSS = """
    AlertsScreen { align: center middle; }
    AlertsScreen > Vertical {
        width: 116; height: auto; max-height: 32; padding: 1 2;
        border: thick $warning; background: $surface;
    }
    AlertsScreen #title { text-style: bold; }
    AlertsScreen OptionList { height: auto; max-height: 24; border: none; }
    AlertsScreen #hint { color: $text-muted; }
    """

    def __init__(self, health: Health, clock) -> None:
        super().__init__()
        self.health = health
        self.clock = clock

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Alerts", id="title")
            yield OptionList(id="alerts")
            yield Static(
                "Enter acknowledges the selected alert (silent until it clears).  Esc closes.", id="hint"
            )

    def on_mount(self) -> None:
        self.fill()
        self.set_interval(1.0, self.fill)

    def fill(self) -> None:
        ol = self.query_one(OptionList)
        keep = ol.highlighted
        now = self.clock()
        ol.clear_options()
        active = self.health.alerts()
        ol.add_option(
            Option(f"active ({len(active)})" if active else "active: none, all is well", disabled=True)
        )
        for a in active:
            ol.add_option(Option(alert_line(a, now), id=f"active:{a.key}"))
        past = list(reversed(self.health.past))
        ol.add_option(Option(f"past ({len(past)})" if past else "past: none", disabled=True))
        for i, a in enumerate(past):
            ol.add_option(Option(alert_line(a, now), id=f"past:{i}"))
        if keep is not None and keep < ol.option_count:
            ol.highlighted = keep
        elif active:
            ol.highlighted = 1

    def action_ack(self) -> None:
        ol = self.query_one(OptionList)
        if ol.highlighted is None:
            return
        oid = ol.get_option_at_index(ol.highlighted).id or ""
        if oid.startswith("active:") and self.health.acknowledge(oid.split(":", 1)[1]):
            self.app.schedule_refresh()
            self.fill()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.action_ack()

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)

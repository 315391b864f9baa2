"""Help (``?``) of the compare view (console/tui/compare_screen.py): the keys that work there, built
from the live bindings (the screen's own first, then the app's that are enabled there), in help's frame
(console/screens/help.py) but without the log's keys: there is no log on that screen."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from console.screens.help import HelpScreen


def binding_rows(screen: Screen) -> list[tuple[str, str, str]]:
    """(key, what, more) for each enabled binding the screen's class or the app's class declares (not
    Textual's own: focus keys, ctrl+c, the palette); the ``toggle_run(N)`` keys are one row."""
    own = {(b.key, b.action) for cls in (type(screen), type(screen.app)) for b in cls.BINDINGS}
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for ab in sorted(screen.active_bindings.values(), key=lambda ab: ab.node is not screen):
        b = ab.binding
        if not ab.enabled or b.action in seen or (b.key, b.action) not in own:
            continue
        seen.add(b.action)
        if b.action.startswith("toggle_run("):
            if "toggle_run" not in seen:
                seen.add("toggle_run")
                rows.append(("1-9", "Show/hide run N", "N: the run's number in the legend"))
            continue
        rows.append((screen.app.get_key_display(b), b.description or b.action, b.tooltip))
    return rows


class CompareHelp(HelpScreen):
    def __init__(self, rows: list[tuple[str, str, str]]) -> None:
        super().__init__(rows, readonly=False)

    def compose(self) -> ComposeResult:
        t = Table(box=None, show_header=False, padding=(0, 2), expand=True)
        t.add_column(style="bold cyan", no_wrap=True, min_width=8)
        t.add_column(no_wrap=True, min_width=26)
        t.add_column(style="dim", overflow="fold", ratio=1)
        for row in self.rows:
            t.add_row(*row)
        with VerticalScroll():
            yield Static("compare: keys", id="title")
            yield Static(t, id="keys")
            yield Static(Text("\nEsc closes.", style="dim"))

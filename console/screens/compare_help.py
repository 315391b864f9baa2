"""Help (``?``) of the compare view (console/tui/compare_screen.py): the keys that work there, built
from the live bindings (the screen's own first, then the app's that are enabled there), in help's frame
(console/screens/help.py) but without the log's keys: there is no log on that screen."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from console.screens.help import HelpScreen, binding_rows

__all__ = ["CompareHelp", "binding_rows"]


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

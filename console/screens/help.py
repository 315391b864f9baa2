"""Help (``?``): the keys, built from the app's live bindings, so read-only mode shows only what works."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

LOG_KEYS = [
    ("n / N", "next / previous match (in the log)"),
    ("f / End", "follow the log again"),
    ("ctrl+p", "command palette: actions by name"),
]

QUIT_NOTE = "Quitting never touches the trainer: it keeps training."


def help_table(rows: list[tuple[str, str, str]], readonly: bool) -> Table:
    t = Table(box=None, show_header=False, padding=(0, 2), expand=True)
    t.add_column(style="bold cyan", no_wrap=True, min_width=8)
    t.add_column(no_wrap=True, min_width=26)
    t.add_column(style="dim", overflow="fold", ratio=1)  # what does not fit wraps (at words), never cut
    for key, desc, tip in rows:
        t.add_row(key, desc, tip)
    t.add_row("", "", "")
    for key, desc in LOG_KEYS:
        t.add_row(key, desc, "")
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 116; height: auto; max-height: 32; padding: 1 2;
        border: thick $primary; background: $surface;
    }
    HelpScreen #title { text-style: bold; margin-bottom: 1; }
    """

    def __init__(self, rows: list[tuple[str, str, str]], readonly: bool, quit_note: str = QUIT_NOTE) -> None:
        super().__init__()
        self.rows = rows
        self.readonly = readonly
        self.quit_note = quit_note

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("dflash-console: keys", id="title")
            yield Static(help_table(self.rows, self.readonly), id="keys")
            note = Text()
            if self.readonly:
                note.append(
                    "\nRead-only: stop, restart, launch and deploy are switched off.\n", style="bold yellow"
                )
            note.append(f"\n{self.quit_note}  Esc closes.", style="dim")
            yield Static(note)

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)

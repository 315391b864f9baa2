"""Help (``?``): the keys of the screen under it, built from the live bindings (the screen's own, then
the app's that are enabled there), so read-only mode, the overview and a run's screen each show only
what works there, and a key added to a binding list is in help without a second list."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

LOG_KEYS = [
    ("n / N", "next / previous match (in the log)"),
    ("f / End", "follow the log again"),
]
PALETTE_KEY = ("ctrl+p", "command palette: actions by name")
# numbered keys (one binding each) shown as one row: action prefix -> (keys, what, more)
NUMBERED = {
    "open_index(": ("1-9", "Open run N", "N: the run's number in the first column"),
    "toggle_run(": ("1-9", "Show/hide run N", "N: the run's number in the legend"),
}
KEY_NAMES = {"enter": "Enter"}


def binding_rows(
    screen: Screen, titles: dict[str, tuple[str, str]] | None = None
) -> list[tuple[str, str, str]]:
    """(key, what, more) for each enabled binding the screen's class or the app's class declares (not
    Textual's own: focus keys, ctrl+c, the palette), the screen's first; ``titles`` (action -> (title,
    help)) words an action better than its footer label; numbered keys are one row."""
    titles = titles or {}
    declared = [  # in the order the classes declare them, the screen's first; not Textual's own
        (b.key, b.action)
        for cls, base in ((type(screen), Screen), (type(screen.app), App))
        for b in Binding.make_bindings(cls.BINDINGS)
        if not any(b.key == o.key and b.action == o.action for o in Binding.make_bindings(base.BINDINGS))
    ]
    order = {kb: i for i, kb in reversed(list(enumerate(declared)))}
    active = [ab for ab in screen.active_bindings.values() if (ab.binding.key, ab.binding.action) in order]
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for ab in sorted(active, key=lambda ab: order[ab.binding.key, ab.binding.action]):
        b = ab.binding
        if not ab.enabled or b.action in seen:
            continue
        seen.add(b.action)
        prefix = next((p for p in NUMBERED if b.action.startswith(p)), None)
        if prefix is not None:
            if prefix not in seen:
                seen.add(prefix)
                rows.append(NUMBERED[prefix])
            continue
        title, tip = titles.get(b.action.removeprefix("app."), (b.description or b.action, b.tooltip))
        rows.append((KEY_NAMES.get(b.key) or screen.app.get_key_display(b), title, tip))
    return rows


QUIT_NOTE = "Quitting never touches the trainer: it keeps training."


def help_table(rows: list[tuple[str, str, str]], extra: list[tuple[str, str]]) -> Table:
    t = Table(box=None, show_header=False, padding=(0, 2), expand=True)
    t.add_column(style="bold cyan", no_wrap=True, min_width=8)
    t.add_column(no_wrap=True, min_width=26)
    t.add_column(style="dim", overflow="fold", ratio=1)  # what does not fit wraps (at words), never cut
    for key, desc, tip in rows:
        t.add_row(key, desc, tip)
    if extra:
        t.add_row("", "", "")
    for key, desc in extra:
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

    def __init__(
        self,
        rows: list[tuple[str, str, str]],
        readonly: bool,
        quit_note: str = QUIT_NOTE,
        extra: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__()
        self.rows = rows
        self.extra = [*LOG_KEYS, PALETTE_KEY] if extra is None else extra  # keys without a binding row
        self.readonly = readonly
        self.quit_note = quit_note

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static("dflash-console: keys", id="title")
            yield Static(help_table(self.rows, self.extra), id="keys")
            note = Text()
            if self.readonly:
                note.append(
                    "\nRead-only: stop, restart, launch and deploy are switched off.\n", style="bold yellow"
                )
            note.append(f"\n{self.quit_note}  Esc closes.", style="dim")
            yield Static(note)

    async def action_dismiss(self, result=None) -> None:
        self.dismiss(None)

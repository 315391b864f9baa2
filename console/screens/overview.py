"""The overview: one row per run (label, host/CT, state, step/total, tok/s, loss, acceptance, queue,
last checkpoint age, health), sortable. Enter or 1..9 opens a run's full screen (the app's
``show_run``); ``o`` there comes back here. ``m`` marks a row, ``c`` opens the compare view of the
marked runs, else of all (the app's ``open_compare``, where it has one: console/tui/compare_screen.py).
Redrawn on a short timer: a row is a few numbers.

The app installs the overview (:func:`install_overview`): a screen that is popped without being
installed is taken down, and pushing it again left the run's screen frozen on the terminal while
the keys went to the overview nobody saw."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from console.core.fleet import COLUMNS, SORT_KEYS, row_values, sort_key
from console.core.formatting import fmt_duration, fmt_tok_s

STATE_STYLE = {
    "running": "green",
    "saving": "yellow",
    "stopped": "dim",
    "no trainer": "yellow",
    "reconnecting": "bold yellow",
    "connecting": "yellow",
    "disconnected": "bold red",
}
HEALTH_STYLE = {"ok": "green", "note": "cyan", "warning": "bold yellow", "critical": "bold red"}


def _num(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def row_cells(v: dict) -> list[Text]:
    step = "-" if v["step"] is None else f"{v['step']:,}"
    if v["total"]:
        step += f" / {v['total']:,}"
    acc = _num(v["accept"], ".2f")
    if v["accept"] is not None and v["accept_source"] != "eval":
        acc += " est"  # the trainer's running estimate, not a measured eval
    depth, cap = v["queue"]
    queue = "-" if depth is None else f"{depth}/{cap if cap is not None else '?'}"
    ckpt = "-" if v["ckpt"] is None else fmt_duration(v["ckpt"]) + " ago"
    run = v["run"] + (" (ro)" if v["readonly"] else "")
    return [
        Text(str(v["#"]), style="bold cyan"),
        Text(run, style="bold"),
        Text(v["host / CT"]),
        Text(v["state"], style=STATE_STYLE.get(v["state"], "")),
        Text(step),
        Text(fmt_tok_s(v["tok/s"])),
        Text(_num(v["loss"], ".4f")),
        Text(acc),
        Text(queue),
        Text(ckpt),
        Text(v["health"], style=HEALTH_STYLE.get(v["health"], "")),
    ]


class OverviewScreen(Screen):
    """``app`` gives ``runs`` (console.core.fleet.Run) and ``show_run(index)``."""

    BINDINGS = [
        Binding("enter", "open", "Open run", tooltip="the selected run's full screen (o there: back here)"),
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("o", "sort", "Sort", tooltip="by the next column"),
        Binding("O", "reverse", "Reverse", show=False, tooltip="the sort order"),
        Binding("m", "mark", "Mark", tooltip="mark the run for the compare view"),
        Binding("c", "compare", "Compare", tooltip="curves of the marked runs (else all) on shared axes"),
        *[Binding(str(i), f"open_index({i - 1})", f"Run {i}", show=False) for i in range(1, 10)],
        Binding("q", "app.quit", "Quit"),
    ]
    DEFAULT_CSS = """
    OverviewScreen { layout: vertical; }
    OverviewScreen #title { height: 1; background: $panel; }
    OverviewScreen #table { height: 1fr; }
    """

    def __init__(self, refresh_s: float = 0.5) -> None:
        super().__init__()
        self.refresh_s = refresh_s
        self.sort_by = "#"
        self.descending = False
        self.cursor = 0  # position in the sorted rows
        self.order: list[int] = []  # run indices in display order
        self.marked: set[int] = set()  # run indices marked for the compare view

    def compose(self) -> ComposeResult:
        yield Static("", id="title")
        yield Static("", id="table")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(self.refresh_s, self.redraw)

    def on_screen_resume(self) -> None:
        self.redraw()

    def rows(self) -> list[dict]:
        values = [row_values(i, r) for i, r in enumerate(self.app.runs)]
        values.sort(key=lambda v: sort_key(v, self.sort_by), reverse=self.descending)
        return values

    def redraw(self) -> None:
        if not self.is_current:  # under a run's full screen: drawn again when it comes back
            return
        rows = self.rows()
        self.order = [v["#"] - 1 for v in rows]
        self.cursor = max(0, min(self.cursor, len(rows) - 1))
        t = Table(expand=True, box=None, padding=(0, 1), header_style="bold")
        for c in COLUMNS:
            arrow = (" ▼" if self.descending else " ▲") if c == self.sort_by else ""
            t.add_column(c + arrow, no_wrap=True, overflow="ellipsis")
        for pos, v in enumerate(rows):
            cells = row_cells(v)
            if v["#"] - 1 in self.marked:
                cells[0] = Text(f"{v['#']} ✓", style="bold cyan")
            t.add_row(*cells, style="reverse" if pos == self.cursor else None)
        self.query_one("#table", Static).update(t)
        title = Text(f" {len(rows)} runs", style="bold")
        note = getattr(self.app, "overview_note", None)  # the replay's cursor
        if callable(note):
            title.append(f"   {note()}", style="bold yellow")
        title.append(
            "   Enter/1-9: open   m: mark   c: compare   o: sort by next column   O: reverse"
            "   (in a run: o comes back here)",
            style="dim",
        )
        self.query_one("#title", Static).update(title)

    def action_move(self, delta: int) -> None:
        self.cursor += delta
        self.redraw()

    def action_sort(self) -> None:
        i = SORT_KEYS.index(self.sort_by) if self.sort_by in SORT_KEYS else -1
        self.sort_by = SORT_KEYS[(i + 1) % len(SORT_KEYS)]
        self.redraw()

    def action_reverse(self) -> None:
        self.descending = not self.descending
        self.redraw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("mark", "compare"):
            return hasattr(self.app, "open_compare")  # an app without the compare view offers neither
        return True

    def action_mark(self) -> None:
        if self.order:
            self.marked ^= {self.order[self.cursor]}
            self.redraw()

    def action_compare(self) -> None:
        if hasattr(self.app, "open_compare"):
            self.app.open_compare(set(self.marked))

    def action_open(self) -> None:
        if self.order:
            self.app.show_run(self.order[self.cursor])

    def action_open_index(self, index: int) -> None:
        if index < len(self.app.runs):
            self.app.show_run(index)


def install_overview(app) -> OverviewScreen:
    """The app's overview, installed: opening a run pops it, ``o`` pushes the same live screen again."""
    screen = OverviewScreen()
    app.install_screen(screen, name="overview")
    return screen


def back_to_overview(app) -> None:
    """``o`` in a run: close what is open over the run, then the overview."""
    if app.screen is app.overview:
        return
    while len(app.screen_stack) > 1:
        app.pop_screen()
    app.push_screen(app.overview)

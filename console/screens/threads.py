"""The threads view (``t``): every process of the run (the launcher and its workers) as a group row, its
threads under it, with CPU% and state, sampled through the helper about once a second while the view is
open (console/core/threads.py); the busiest first. Named threads show their names (the trainer names
its threads: trainer/thread_names.py); unnamed ones are dim. A process shows its busiest
:data:`SHOWN` threads and one row for the rest until ``a`` (every thread); Enter folds a process's
threads; ``p`` shows ``py-spy dump`` of the selected row's process below the table (console/core/pyspy.py),
or says that py-spy is not in the container. Everything here only reads: a read-only session has it.
Text from the container is shown as plain text (never markup), as the helper client cleaned it."""

from __future__ import annotations

import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from console.core.formatting import fmt_duration
from console.core.pyspy import Dump
from console.core.threads import Row, Sampler, Snapshot, fmt_pct, header, role_cell, rows

COLUMNS = ("PID/TID", "role", "name", "S", "CPU%", "CPU time", "")
SHOWN = 10  # threads a process shows, busiest first, until `a` (a row says how many more)
HINT = "Enter folds a process   a every thread / the busiest   p py-spy dump of the selected process   Esc closes"


def _pct_style(percent: float | None) -> str:
    if percent is None:
        return "dim"
    return "bold red" if percent >= 80 else "bold yellow" if percent >= 30 else ""


def cells(snap: Snapshot, r: Row, folded: bool) -> list[Text]:
    """The table's cells of one row, as plain Text (never markup)."""
    if r.process:
        mark = "▸ " if folded else "▾ "
        ident = Text(f"{mark}{r.id}", style="bold")
        name = Text(r.name, style="bold")
    elif r.more:
        ident = Text("    …", style="dim")
        name = Text(f"{r.more} more threads", style="dim italic")
    else:
        ident = Text(f"    {r.id}")
        name = Text(r.name, style="" if r.named else "dim")
    return [
        ident,
        Text(role_cell(snap, r), style="bold cyan"),
        name,
        Text(r.state, style="green" if r.state == "R" else "dim" if r.state == "S" else "yellow"),
        Text(fmt_pct(r.cpu_pct), style=_pct_style(r.cpu_pct), justify="right"),
        Text(fmt_duration(r.cpu_s), justify="right"),
        Text(r.info, style="dim", no_wrap=True, overflow="ellipsis"),
    ]


class ThreadsScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,t", "dismiss", "Close"),
        Binding("p", "dump", "py-spy dump"),
        Binding("a", "all", "Every thread"),
    ]
    DEFAULT_CSS = """
    ThreadsScreen { align: center middle; }
    ThreadsScreen > Vertical {
        width: 100%; height: 100%; padding: 0 1;
        border: thick $primary; background: $surface;
    }
    ThreadsScreen #title { text-style: bold; }
    ThreadsScreen #notes { color: $warning; }
    ThreadsScreen DataTable { height: 1fr; }
    ThreadsScreen #dumpbox { height: 45%; display: none; border-top: solid $primary-darken-2; }
    ThreadsScreen #dumpbox.shown { display: block; }
    ThreadsScreen #hint { color: $text-muted; }
    """

    def __init__(self, session, interval_s: float = 1.0) -> None:
        super().__init__()
        self.session = session
        self.interval_s = interval_s
        self.sampler = Sampler()
        self.snap: Snapshot | None = None
        self.error: str | None = None
        self.samples = 0  # replies shown (tests wait on it)
        self.folded: set[int] = set()
        self.show_all = False  # every thread, not the busiest SHOWN of each process
        self.dump: Dump | None = None
        self._rows: dict[str, Row] = {}
        self._busy = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Threads: sampling…"), id="title")
            yield Static(id="notes")
            yield DataTable(cursor_type="row", zebra_stripes=True)
            with VerticalScroll(id="dumpbox"):
                yield Static(id="dump")
            yield Static(Text(HINT), id="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*COLUMNS)
        table.focus()
        self._sample()
        self.set_interval(self.interval_s, self._sample)

    @work(group="threads-sample", exit_on_error=False)
    async def _sample(self) -> None:
        if self._busy:  # the last one is still on its way (a slow link): no pile-up
            return
        self._busy = True
        try:
            snap = self.sampler.feed(await self.session.sample_threads())
        except Exception as e:  # noqa: BLE001 - said in the view (no trainer, not connected, ...)
            self.error = str(e) or type(e).__name__
            self._show_error()
            return
        finally:
            self._busy = False
        self.snap, self.error = snap, None
        self.samples += 1
        self._show()

    def _show_error(self) -> None:
        self.query_one("#title", Static).update(Text(f"Threads: {self.error}", style="yellow"))

    def _show(self) -> None:
        snap = self.snap
        self.query_one("#title", Static).update(Text(f"Threads of the {header(snap)}"))
        notes = snap.notes()
        box = self.query_one("#notes", Static)
        box.update(Text("\n".join(notes)))
        box.display = bool(notes)
        table = self.query_one(DataTable)
        keep = self.selected_key()
        table.clear()
        self._rows = {}
        for r in rows(snap, None if self.show_all else SHOWN):
            if not r.process and r.pid in self.folded:
                continue
            self._rows[r.key] = r
            table.add_row(*cells(snap, r, r.pid in self.folded), key=r.key)
        if keep in self._rows:
            table.move_cursor(row=table.get_row_index(keep), animate=False)

    def selected_key(self) -> str | None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - no row under the cursor
            return None

    def selected(self) -> Row | None:
        return self._rows.get(self.selected_key() or "")

    def action_all(self) -> None:
        self.show_all = not self.show_all
        if self.snap is not None:
            self._show()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on a row folds (or unfolds) its process's threads."""
        self.fold(self._rows.get(event.row_key.value or ""))

    def fold(self, r: Row | None) -> None:
        if r is None:
            return
        self.folded ^= {r.pid}
        if self.snap is not None:
            self._show()
            table = self.query_one(DataTable)
            table.move_cursor(row=table.get_row_index(f"p{r.pid}"), animate=False)

    def action_dump(self) -> None:
        r, snap = self.selected(), self.snap
        if r is None or snap is None:
            self.notify("no process selected", severity="warning")
            return
        p = snap.find(r.pid)
        self._dump(
            r.pid, p.start_time if p is not None else None, p.label if p is not None else f"pid {r.pid}"
        )

    @work(exclusive=True, group="threads-dump", exit_on_error=False)
    async def _dump(self, pid: int, start_time: int | None, label: str) -> None:
        box = self.query_one("#dumpbox")
        box.add_class("shown")
        out = self.query_one("#dump", Static)
        out.update(Text(f"py-spy dump of {label}: running…", style="dim"))
        try:
            d = await self.session.pyspy_dump(pid, start_time)
        except Exception as e:  # noqa: BLE001 - said in the pane
            d = Dump(pid, False, f"py-spy dump of {label} failed: {e}")
        self.dump = d
        when = time.strftime("%H:%M:%S")
        head = Text(f"py-spy dump of {label} at {when}", style="bold")
        if d.path:
            head.append(f"  ({d.path})", style="dim")
        out.update(Text.assemble(head, "\n", Text(d.text, style="" if d.ok else "yellow")))
        box.scroll_home(animate=False)

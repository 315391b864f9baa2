"""Checkpoints and disk (``c``): the run's checkpoints (step, when saved, size, complete, which one
``latest`` names, where its drafter for serving is), the free space on the run directory's filesystem
and the keep-count; ``y`` copies the selected checkpoint's drafter to this machine over the same SSH
connection (console/core/transfer.py: progress, waits out a dropped link and resumes, verified by
SHA-256). The copy runs on the app, so closing this screen does not stop it."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from console.core.events import CheckpointEntry
from console.core.formatting import fmt_age, fmt_bytes, fmt_duration
from console.core.transfer import CopyError, copy_dir


@dataclass
class CopyJob:
    remote: str
    local: Path
    text: str = "starting"
    running: bool = True
    ok: bool | None = None


class CopyJobs:
    """The app's copies (newest last)."""

    def __init__(self) -> None:
        self.jobs: list[CopyJob] = []

    @property
    def running(self) -> CopyJob | None:
        return next((j for j in self.jobs if j.running), None)


DRAFTER_W = 56  # the drafter column's width: longer paths are elided in the middle (in full below the table)


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """The console's data directory: ``$XDG_DATA_HOME/dflash-console`` (``~/.local/share/...``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "share"
    )
    return Path(base) / "dflash-console"


def default_dest(run_dir: str | None, entry: CheckpointEntry, env: Mapping[str, str] | None = None) -> Path:
    """Where ``y`` proposes to copy a drafter: ``DATA_DIR/drafters/RUN-step_N`` (never the current
    directory unasked)."""
    run = posixpath.basename((run_dir or "run").rstrip("/")) or "run"
    return data_dir(env) / "drafters" / f"{run}-{entry.name}"


def elide_middle(text: str, width: int) -> str:
    """``/runs/a/che…/step_00000007/export``: the start and the end kept, the middle cut."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def drafter_cell(run_dir: str, path: str | None) -> str | Text:
    """The drafter's path relative to the run dir where it is inside it, elided to ``DRAFTER_W``."""
    if path is None:
        return Text("-", style="dim")
    root = run_dir.rstrip("/") + "/"
    return elide_middle(path[len(root) :] if path.startswith(root) else path, DRAFTER_W)


async def run_copy(app, job: CopyJob) -> None:
    def progress(p) -> None:
        percent = 100.0 * p.done_bytes / p.total_bytes if p.total_bytes else 100.0
        job.text = (
            f"{percent:5.1f}%  {fmt_bytes(p.done_bytes)} of {fmt_bytes(p.total_bytes)}  "
            f"file {min(p.files_done + 1, p.files_total)}/{p.files_total} {p.file}"
            + (f"  (link dropped {p.reconnects}x, resumed)" if p.reconnects else "")
        )

    try:
        res = await copy_dir(app.session.need_helper, job.remote, job.local, progress)
    except (CopyError, OSError) as e:
        job.text, job.ok = f"failed: {e} (writing to {job.local})", False
        app.notify(f"copy of {job.remote} failed: {e}", severity="error", timeout=20)
    else:
        job.text, job.ok = (
            (
                f"done: {res.files} files, {fmt_bytes(res.bytes)} in {fmt_duration(res.seconds)} to {res.local}"
                + (f" ({res.reconnects} dropped links resumed)" if res.reconnects else "")
            ),
            True,
        )
        app.notify(f"copied to {res.local}", title="drafter copied", timeout=15)
    finally:
        job.running = False


class CheckpointsScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,c", "dismiss", "Close"),
        Binding("y", "copy", "Copy drafter here"),
    ]
    DEFAULT_CSS = """
    CheckpointsScreen { align: center middle; }
    CheckpointsScreen > Vertical {
        width: 116; height: auto; max-height: 34; padding: 1 2;
        border: thick $primary; background: $surface;
    }
    CheckpointsScreen #title { text-style: bold; }
    CheckpointsScreen DataTable { height: auto; max-height: 16; margin: 1 0; }
    CheckpointsScreen Input { display: none; }
    CheckpointsScreen Input.asking { display: block; }
    CheckpointsScreen #hint, CheckpointsScreen #copy { color: $text-muted; }
    """

    def __init__(self, state, jobs: CopyJobs, clock) -> None:
        super().__init__()
        self.state = state
        self.jobs = jobs
        self.clock = clock
        self._shown = None
        self._entry: CheckpointEntry | None = None
        self._placed = False

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Checkpoints and disk", id="title")
            yield Static(id="disk")
            yield DataTable(cursor_type="row", zebra_stripes=True)
            yield Static(id="selected")
            yield Input(id="dest")
            yield Static(id="copy")
            yield Static(
                "y copies the selected checkpoint's drafter to this machine (it asks where; the default is "
                f"under {data_dir() / 'drafters'}).  Esc closes.",
                id="hint",
            )

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        self._cols = t.add_columns("step", "saved", "size", "complete", "latest", "drafter for serving")
        self._ckpt_seen = (self.state.ckpt_t, self.state.ckpt_step)
        self.fill()
        self.set_interval(0.5, self.fill)
        t.focus()

    def _look_again_after_a_save(self) -> None:
        """A checkpoint saved while the view is open: scan the run dir now, not in up to 30 s."""
        seen = (self.state.ckpt_t, self.state.ckpt_step)
        if seen == self._ckpt_seen:
            return
        self._ckpt_seen = seen
        watch = getattr(getattr(self.app, "health_hooks", None), "watch", None)
        if watch is not None:
            watch.poke()

    def _tick_ages(self, disk, now: float) -> None:
        t = self.query_one(DataTable)
        for c in disk.checkpoints:
            if c.mtime and c.name in t.rows:
                t.update_cell(c.name, self._cols[1], fmt_age(c.mtime, now))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def _show_selected(self) -> None:
        e = self.selected()
        t = Text()
        if e is not None:
            t.append(f"step {e.step if e.step is not None else e.name}: ", style="dim")
            if e.refused:
                t.append(f"{e.path}: not offered ({e.refused})", style="yellow")
            else:
                t.append(e.export or f"{e.path} (no drafter for serving in it)")
        self.query_one("#selected", Static).update(t)

    def fill(self) -> None:
        self._look_again_after_a_save()
        disk = self.state.disk
        now = self.clock()
        head = Text()
        if disk is None:
            head.append("no scan of the run directory yet (it comes every 30 s while connected)", style="dim")
        else:
            head.append(disk.run_dir + "\n", style="bold")  # a line of its own: the figures never wrap
            if disk.free_bytes is not None:
                head.append(f"free {fmt_bytes(disk.free_bytes)} of {fmt_bytes(disk.total_bytes)}   ")
            if disk.keep is not None:
                head.append(f"keeps the newest {disk.keep}   ")
            head.append(f"(looked {fmt_age(disk.t, now)})", style="dim")
            if disk.error:
                head.append(f"   {disk.error}", style="red")
        self.query_one("#disk", Static).update(head)
        if disk is not None and disk is not self._shown:
            self._shown = disk
            t = self.query_one(DataTable)
            row = t.cursor_row
            t.clear()
            for c in reversed(disk.checkpoints):
                t.add_row(
                    str(c.step if c.step is not None else c.name),
                    fmt_age(c.mtime, now) if c.mtime else "-",
                    fmt_bytes(c.bytes),
                    "yes" if c.complete else Text("no", style="yellow"),
                    Text("latest", style="bold green") if c.latest else "",
                    drafter_cell(disk.run_dir, c.export),
                    key=c.name,
                )
            entries = list(reversed(disk.checkpoints))
            if entries:
                if not self._placed:  # first fill: on the checkpoint `latest` names
                    self._placed = True
                    row = next((i for i, c in enumerate(entries) if c.latest), 0)
                t.move_cursor(row=min(row, len(entries) - 1))
            self._show_selected()
        elif disk is not None:  # the same scan: only the ages move
            self._tick_ages(disk, now)
        job = self.jobs.jobs[-1] if self.jobs.jobs else None
        self.query_one("#copy", Static).update(f"copy {job.remote} -> {job.local}: {job.text}" if job else "")

    def selected(self) -> CheckpointEntry | None:
        disk = self.state.disk
        if disk is None or not disk.checkpoints:
            return None
        t = self.query_one(DataTable)
        entries = list(reversed(disk.checkpoints))
        return entries[t.cursor_row] if 0 <= t.cursor_row < len(entries) else None

    def action_copy(self) -> None:
        e = self.selected()
        if e is None or e.export is None or not e.complete:
            self.notify("no complete checkpoint with a drafter selected", severity="warning")
            return
        if self.jobs.running is not None:
            self.notify("a copy is running already", severity="warning")
            return
        if getattr(self.app, "session", None) is None:
            self.notify("not connected to a host", severity="warning")
            return
        self._entry = e
        dest = self.query_one(Input)
        dest.value = str(default_dest(self.state.disk.run_dir, e))
        dest.add_class("asking")
        dest.border_title = "copy the drafter above to this machine, into (Enter starts, Esc cancels)"
        dest.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.remove_class("asking")
        e, self._entry = self._entry, None
        if e is None or not event.value.strip():
            return
        job = CopyJob(e.export, Path(event.value.strip()).expanduser().resolve())
        self.jobs.jobs.append(job)
        self.app.run_worker(run_copy(self.app, job), group="copy", exit_on_error=False)
        self.query_one(DataTable).focus()
        self.fill()

    async def action_dismiss(self, result=None) -> None:
        inp = self.query_one(Input)
        if inp.has_class("asking"):
            inp.remove_class("asking")
            self._entry = None
            self.query_one(DataTable).focus()
            return
        self.dismiss(None)

"""``dflash-console replay FILE``: a record (console/core/record.py) on today's screens, offline and
read-only, with a time cursor (console/core/replay.py): space pauses, ←/→ jump 10 s, [/] 60 s,
Home/End to the start/end, +/- change the speed. The screen's clock is the cursor's (while an
event is folded: the time it arrived), so ages and countdowns read as they did live. Every run of
the record is folded into its own state; a record of several runs opens on the overview
(console/screens/overview.py) and ``o`` comes back to it, as live; ``c`` there opens the compare view
(console/tui/compare_screen.py) over ``compare``, fed by the same fold. Jumping back folds the record
again from its start.

The record is read as the cursor reaches it (console/core/record.py's ``Streamed``: one line at a
time, never the whole file in memory), and each tick folds for at most :data:`FOLD_BUDGET_S`, so a
record that unpacks to gigabytes, a jump to its end or a fast speed keeps the screen drawn and
answering while the fold catches up."""

from __future__ import annotations

import datetime
import math
import time

from textual.binding import Binding

from console.app import ConsoleApp
from console.core.compare import CompareData
from console.core.events import LogLines
from console.core.fleet import Run
from console.core.options import ConnectOptions
from console.core.record import Recording, Streamed
from console.core.replay import Cursor
from console.core.state import ConsoleState
from console.core.targets import Target
from console.screens.overview import OverviewScreen, back_to_overview, install_overview
from console.tui.compare_screen import open_compare
from console.tui.fleet_app import RUN_ACTIONS, not_on_a_run

# priority: the log pane (focused) would take the arrows and Home/End for scrolling
REPLAY_BINDINGS = [
    Binding("space", "pause", "Pause"),
    Binding("left", "jump(-10)", "-10s", priority=True),
    Binding("right", "jump(10)", "+10s", priority=True),
    Binding("left_square_bracket", "jump(-60)", "-60s", show=False, priority=True),
    Binding("right_square_bracket", "jump(60)", "+60s", show=False, priority=True),
    Binding("home", "seek_start", "Start", show=False, priority=True),
    Binding("end", "seek_end", "End", show=False, priority=True),
    Binding("plus", "speed(2)", "Faster", show=False),
    Binding("minus", "speed(0.5)", "Slower", show=False),
    Binding("o", "overview", "Overview", tooltip="back to the overview of every run"),
]


FOLD_BUDGET_S = 0.05  # folding per tick (0.1 s) at most: the screen draws and answers in between


class ReplayApp(ConsoleApp):
    BINDINGS = [*ConsoleApp.BINDINGS, *REPLAY_BINDINGS]

    def __init__(
        self,
        recording: Recording | Streamed,
        run: int | None = None,
        speed: float = 1.0,
        cursor: Cursor | None = None,
        **kw,
    ):
        """``run``: the run to show first (0-based); None: the overview when the record has several."""
        self.recording = recording
        end = recording.end if recording.end is not None else math.inf  # known once read to its end
        self.cursor = cursor or Cursor(recording.start, end, speed)
        self._folding: float | None = None  # while folding an entry: its time is the screen's clock
        self.runs = [
            Run(
                Target(
                    info.get("label", f"run {i + 1}"),
                    ConnectOptions(host=info.get("where", "?")),
                    label=info.get("label", f"run {i + 1}"),
                    readonly=True,
                ),
                None,
                ConsoleState(clock=self.clock),
            )
            for i, info in enumerate(recording.runs)
        ]
        self.compare = CompareData(len(self.runs))  # every run's curves up to the cursor
        self.first = run
        self.current = run or 0
        super().__init__(None, readonly=True, state=self.runs[self.current].state, target="", **kw)
        self._quiet = False  # folding back up to the cursor after a jump back: the log is drawn after
        self._open()
        self.overview: OverviewScreen | None = None

    @property
    def where(self) -> str:
        t = self.runs[self.current].target
        return f"{t.title} · {t.where}"

    def clock(self) -> float:
        """The screen's clock: the time an entry arrived while it is folded, else the cursor's."""
        if self._folding is not None:
            return self._folding
        now = self.cursor.now()  # infinite after a jump to an end not read yet: the last time folded
        return now if math.isfinite(now) else self._last_t

    def _fold(self, entry, draw: bool = True) -> None:
        if not 0 <= entry.run < len(self.runs):
            return
        run = self.runs[entry.run]
        self._folding = entry.t
        try:
            run.apply(entry.event)
            self.compare.apply(entry.run, entry.event)
        finally:
            self._folding = None
        if draw and entry.run == self.current and isinstance(entry.event, LogLines) and self.is_running:
            self.log_view.push(entry.event.lines)

    def on_mount(self) -> None:  # (ConsoleApp.on_mount runs too: Textual calls each class's)
        self._advance()
        self.set_interval(0.1, self._advance)
        if len(self.runs) > 1:
            self.overview = install_overview(self)
            if self.first is None:
                self.push_screen(self.overview)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "overview" and self.overview is None:
            return False  # a record of one run has no overview: the footer does not offer it
        if action in RUN_ACTIONS and self.overview is not None and not_on_a_run(self):
            return False  # on the overview (or the compare view) no run is on screen: open one first
        return super().check_action(action, parameters)

    def open_compare(self, chosen: set[int]) -> None:
        open_compare(self, chosen)

    def overview_note(self) -> str:
        return self._label(where=False)

    def _label(self, where: bool = True) -> str:
        now = self.clock()
        t = datetime.datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S")
        done = now - self.recording.start
        total = self.cursor.end - self.recording.start
        mode = "paused" if self.cursor.paused else f"x{self.cursor.speed:g}"
        of = "?" if math.isinf(total) else f"{total:.0f}"
        return f"REPLAY {t} ({done:.0f}/{of} s, {mode})" + (f"  {self.where}" if where else "")

    def _open(self) -> None:
        """Read the record from its start again."""
        self._stream = self.recording.stream()
        self._peek = next(self._stream, None)
        self._last_t = self.recording.start

    def _advance(self) -> None:
        """Fold what the cursor has passed, for at most FOLD_BUDGET_S (the rest on the next ticks)."""
        now = self.cursor.now()
        changed = False
        deadline = time.monotonic() + FOLD_BUDGET_S
        while self._peek is not None and self._peek.t <= now and time.monotonic() < deadline:
            self._fold(self._peek, draw=not self._quiet)
            self._last_t = self._peek.t
            self._peek = next(self._stream, None)
            changed = True
        if self._peek is None and math.isinf(self.cursor.end):
            self.cursor.end = self._last_t  # the end of the record is known now
        if self._quiet and (self._peek is None or self._peek.t > now):
            self._quiet = False
            self._show(self.current)
        label = self._label()
        if self.w_conn.target != label:
            self.w_conn.target = label
            changed = True
        if changed:
            self.schedule_refresh()

    def _rewind(self) -> None:
        """Fold from the start up to the cursor into fresh states (a jump back)."""
        for run in self.runs:
            run.state = ConsoleState(clock=self.clock)
            run.log_lines.clear()
            if self.health_hooks.config is not None:
                run.state.health.config = self.health_hooks.config
        self.compare.reset()
        self._open()
        self._quiet = True  # _advance folds up to the cursor, then shows the run

    def _show(self, i: int) -> None:
        self.current = i
        run = self.runs[i]
        self.state = run.state
        lv = self.log_view
        lv._pending.clear()
        lv.clear()
        lv.push(list(run.log_lines)[-self.log_max_lines :])
        self.w_conn.target = self._label()
        self.refresh_now(plots=True)

    def show_run(self, i: int) -> None:
        """Put run ``i`` on the full screen (the overview's Enter and 1..9)."""
        self._show(i)
        if self.overview is not None and self.screen is self.overview:
            self.pop_screen()

    def action_overview(self) -> None:
        if self.overview is not None:
            back_to_overview(self)

    def action_pause(self) -> None:
        self.cursor.toggle_pause()
        self._advance()

    def action_jump(self, seconds: float) -> None:
        self.cursor.jump(seconds)
        self._after_move(seconds < 0)

    def action_seek_start(self) -> None:
        self.cursor.seek(self.cursor.start)
        self._after_move(True)

    def action_seek_end(self) -> None:
        self.cursor.seek(self.cursor.end)
        self._after_move(False)

    def seek(self, t: float) -> None:
        """Put the cursor at record time ``t`` and fold up to it at once (tests)."""
        back = t < self.cursor.now()
        self.cursor.seek(t)
        self._after_move(back)
        while self._behind():
            self._advance()

    def _behind(self) -> bool:
        """Entries the cursor has passed are still to be folded (or shown, after a jump back)."""
        return self._quiet or (self._peek is not None and self._peek.t <= self.cursor.now())

    def _after_move(self, back: bool) -> None:
        if back:
            self._rewind()
        self._advance()
        if self.overview is not None and self.screen is self.overview:
            self.overview.redraw()

    def action_speed(self, factor: float) -> None:
        self.cursor.set_speed(self.cursor.speed * factor)
        self._advance()

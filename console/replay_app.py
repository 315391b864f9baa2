"""``dflash-console replay FILE``: a record (console/core/record.py) on today's screen, offline and
read-only, with a time cursor (console/core/replay.py): space pauses, ←/→ jump 10 s, [/] 60 s,
Home/End to the start/end, +/- change the speed. The screen's clock is the cursor's, so ages and
countdowns read as they did live. Jumping back folds the record again from its start."""

from __future__ import annotations

import datetime

from textual.binding import Binding

from console.app import ConsoleApp
from console.core.events import LogLines
from console.core.record import Recording
from console.core.replay import Cursor
from console.core.state import ConsoleState

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
]


class ReplayApp(ConsoleApp):
    BINDINGS = [*ConsoleApp.BINDINGS, *REPLAY_BINDINGS]

    def __init__(
        self, recording: Recording, run: int = 0, speed: float = 1.0, cursor: Cursor | None = None, **kw
    ):
        self.recording = recording
        self.run_index = run
        self.entries = list(recording.events_of(run))
        self.cursor = cursor or Cursor(recording.start, recording.end, speed)
        info = recording.runs[run] if run < len(recording.runs) else {"label": f"run {run + 1}", "where": "?"}
        self.where = f"{info.get('label', '')} · {info.get('where', '')}"
        self._folding: float | None = None  # while folding an entry: its time is the screen's clock
        super().__init__(None, readonly=True, state=ConsoleState(clock=self.clock), target="", **kw)
        self.pos = 0  # entries folded so far

    def clock(self) -> float:
        """The screen's clock: the time an entry arrived while it is folded, else the cursor's."""
        return self._folding if self._folding is not None else self.cursor.now()

    def _fold(self, entry, state: ConsoleState | None = None) -> None:
        self._folding = entry.t
        try:
            if state is None:
                self.on_session_event(entry.event)
            else:
                state.apply(entry.event)
        finally:
            self._folding = None

    def on_mount(self) -> None:  # (ConsoleApp.on_mount runs too: Textual calls each class's)
        self._advance()
        self.set_interval(0.1, self._advance)

    def _label(self) -> str:
        t = datetime.datetime.fromtimestamp(self.cursor.now()).strftime("%Y-%m-%d %H:%M:%S")
        done = self.cursor.now() - self.recording.start
        total = self.recording.end - self.recording.start
        mode = "paused" if self.cursor.paused else f"x{self.cursor.speed:g}"
        return f"REPLAY {t} ({done:.0f}/{total:.0f} s, {mode})  {self.where}"

    def _advance(self) -> None:
        """Fold what the cursor has passed (all of it again after a jump back)."""
        now = self.cursor.now()
        changed = False
        while self.pos < len(self.entries) and self.entries[self.pos].t <= now:
            self._fold(self.entries[self.pos])
            self.pos += 1
            changed = True
        label = self._label()
        if self.w_conn.target != label:
            self.w_conn.target = label
            changed = True
        if changed:
            self.schedule_refresh()

    def _rewind(self) -> None:
        """Fold from the start up to the cursor into a fresh state (a jump back)."""
        now = self.cursor.now()
        st = ConsoleState(clock=self.clock)
        lines: list[str] = []
        self.pos = 0
        while self.pos < len(self.entries) and self.entries[self.pos].t <= now:
            ev = self.entries[self.pos].event
            if isinstance(ev, LogLines):
                lines.extend(ev.lines)
                del lines[: -self.log_max_lines]
            else:
                self._fold(self.entries[self.pos], st)
            self.pos += 1
        if self.health_hooks.config is not None:
            st.health.config = self.health_hooks.config
        self.state = st
        lv = self.log_view
        lv._pending.clear()
        lv.clear()
        lv.push(lines)
        self.refresh_now(plots=True)

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
        """Put the cursor at record time ``t`` (tests, the CLI's --at)."""
        back = t < self.cursor.now()
        self.cursor.seek(t)
        self._after_move(back)

    def _after_move(self, back: bool) -> None:
        if back:
            self._rewind()
        self._advance()

    def action_speed(self, factor: float) -> None:
        self.cursor.set_speed(self.cursor.speed * factor)
        self._advance()

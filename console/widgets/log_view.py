"""The trainer's log: follows the tail, searchable, and never stalls the screen.

Lines arriving at thousands a second are coalesced (toolong's approach): ``push`` only appends to
a bounded buffer; the widget is written at most every ``flush_s`` in one batch, and keeps at most
``max_lines`` (older ones drop off the top). Search highlights every match and jumps between them
(newest first); jumping or scrolling up pauses following, ``f`` resumes it. While following, every
flush repaints the view and ends on the newest line, however fast lines come.

A line wider than the pane wraps (at spaces where it can, continued rows indented by two), never cut
at the edge; the lines as received are kept (``source_lines``) and wrapped again when the width changes.
"""

from __future__ import annotations

import textwrap
from collections import deque

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Input, Log

from console.core.sanitize import clean_text
from console.widgets.text_widget import TextWidget


class LogStatus(Message):
    """The log's follow / search status changed."""


MATCH = Style.parse("black on yellow")
CURRENT = Style.parse("bold black on #ff8700")


class LogView(Log):
    BINDINGS = [
        Binding("n", "next_match", "Next match", show=False),
        Binding("N", "prev_match", "Prev match", show=False),
        Binding("f,end", "follow", "Follow", show=False),
    ]

    def __init__(self, max_lines: int = 5000, flush_s: float = 0.1, **kwargs) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, **kwargs)
        self.flush_s = flush_s
        self._pending: deque[str] = deque(maxlen=max_lines)
        self._source: deque[str] = deque(maxlen=max_lines)  # the lines written, unwrapped
        self._wrap_width = 0  # the width the rows were wrapped at (0: not laid out yet, not wrapped)
        self._flush_handle = None
        self.received = 0  # lines pushed in total
        self.dropped = 0  # lines that never reached the widget (over max_lines within one flush)
        self.query_text = ""
        self._matches: list[int] = []
        self._current: int | None = None  # index into _matches

    @classmethod
    def _process_line(cls, line: str) -> str:
        """Cleaned by the one sanitiser (console/core/sanitize.py): colour codes (transformers' load
        report, tqdm) are dropped, any other escape sequence or control character (C1 included) is
        shown as one U+FFFD, never sent to the terminal."""
        return super()._process_line(clean_text(line))

    def on_mount(self) -> None:
        if self._pending:
            self.flush()

    # ---- feeding ------------------------------------------------------------------------------

    def push(self, lines: list[str]) -> None:
        """Queue lines for the next flush; cheap at any rate."""
        over = len(self._pending) + len(lines) - (self._pending.maxlen or 0)
        if over > 0:
            self.dropped += over
        self._pending.extend(lines)
        self.received += len(lines)
        if self._flush_handle is None and self.is_mounted:
            self._flush_handle = self.set_timer(self.flush_s, self.flush)

    def flush(self) -> None:
        self._flush_handle = None
        if not self._pending:
            return
        shown = [line for line in self._pending if line.splitlines()]  # (Log shows no row for "")
        self._source.extend(shown)
        batch = self._wrapped(shown)
        self._pending.clear()
        before = len(self._lines)
        # Not Log's own follow: once max_lines prunes the top, the lines it repaints are counted from
        # before the pruning (off the end) and a view already at the end does not move, so the pane
        # kept showing old lines under a flood while it said "following". The whole view is repainted
        # here, and following is this widget's own state (a user's scroll up pauses it).
        self.write_lines(batch, scroll_end=False)
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        pruned = before + len(batch) - len(self._lines)
        if self.query_text:
            self._shift_matches(pruned, before - pruned, batch)
        self._notify_status()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        """A scroll up away from the end (the wheel, a key, the scroll bar) pauses following, and the
        status says so; ``f`` resumes it. A resize that keeps the view at the end does not."""
        super().watch_scroll_y(old_value, new_value)
        if self.auto_scroll and new_value < old_value and new_value < self.max_scroll_y:
            self.auto_scroll = False
            self._notify_status()

    @property
    def source_lines(self) -> list[str]:
        """The lines shown, as received (a wrapped line is one)."""
        return list(self._source)

    def _wrapped(self, lines) -> list[str]:
        width = self._wrap_width
        rows: list[str] = []
        for line in lines:
            line = self._process_line(line)
            if width < 8 or len(line) <= width:
                rows.append(line)
            else:
                rows += textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]
        return rows

    def on_resize(self) -> None:
        # the vertical scrollbar's columns kept free: it comes once the log fills the pane
        width = self.content_size.width - self.styles.scrollbar_size_vertical
        if width == self._wrap_width:
            return
        self._wrap_width = width
        if self._source:  # wrap again at the new width (the newest max_lines, as ever)
            lines = [*self._source, *self._pending]
            super().clear()
            self._source.clear()
            self._pending.clear()
            self._pending.extend(lines)
            self.flush()
            self.set_query(self.query_text)

    def clear(self):
        """Empty the log (a replay's jump back, another run on screen); the status counts what is shown."""
        result = super().clear()
        self._pending.clear()
        self._source.clear()
        self.dropped = 0
        self._matches, self._current = [], None
        self._notify_status()
        return result

    # ---- search -------------------------------------------------------------------------------

    def set_query(self, text: str) -> None:
        self.query_text = text
        q = text.lower()
        self._matches = [i for i, line in enumerate(self._lines) if q and q in line.lower()]
        self._current = None
        self._render_line_cache.clear()
        self.refresh()
        self._notify_status()

    def _shift_matches(self, pruned: int, start: int, batch: list[str]) -> None:
        q = self.query_text.lower()
        cur = self._matches[self._current] if self._current is not None else None
        self._matches = [m - pruned for m in self._matches if m - pruned >= 0]
        self._matches += [start + i for i, line in enumerate(batch) if q in line.lower() and start + i >= 0]
        if cur is not None and cur - pruned >= 0:
            self._current = self._matches.index(cur - pruned)
        else:
            self._current = None

    def action_next_match(self) -> None:
        self._jump(+1)

    def action_prev_match(self) -> None:
        self._jump(-1)

    def _jump(self, direction: int) -> None:
        """``prev`` goes toward older lines; the first jump lands on the newest match."""
        if not self._matches:
            self._notify_status()
            return
        if self._current is None:
            self._current = len(self._matches) - 1
        else:
            self._current = (self._current + direction) % len(self._matches)
        self.auto_scroll = False
        y = self._matches[self._current]
        self.scroll_to(y=max(0, y - self.size.height // 2), animate=False, immediate=True)
        self._render_line_cache.clear()
        self.refresh()
        self._notify_status()

    def action_follow(self) -> None:
        self.auto_scroll = True
        self.scroll_end(animate=False, immediate=True, x_axis=False)
        self._notify_status()

    @property
    def current_match_line(self) -> int | None:
        return None if self._current is None else self._matches[self._current]

    # said while the log is empty: where the console looks for it (the app sets it from the trainer found)
    empty_hint = ""

    def set_empty_hint(self, hint: str) -> None:
        self.empty_hint = hint
        self._notify_status()

    def status_text(self) -> Text:
        t = Text()
        if self.auto_scroll:
            t.append(" following ", style="bold green")
        else:
            t.append(" paused (f follows) ", style="bold yellow")
        t.append(f" {len(self._source):,} lines", style="dim")
        if not self._source and self.empty_hint:
            t.append(f" {self.empty_hint}", style="yellow")
        if self.dropped:
            t.append(f", {self.dropped:,} skipped in bursts", style="dim")
        if self.query_text:
            n = len(self._matches)
            pos = "-" if self._current is None else str(self._current + 1)
            t.append(f"   /{self.query_text}  match {pos}/{n}  (n/N)", style="bold")
        else:
            t.append("   / search", style="dim")
        return t

    def _notify_status(self) -> None:
        if self.is_mounted:
            self.post_message(LogStatus())

    def _render_line_strip(self, y: int, rich_style: Style) -> Strip:
        q = self.query_text
        if not q or self.text_selection is not None:
            return super()._render_line_strip(y, rich_style)
        line = self._process_line(self._lines[y])
        text = Text(line, no_wrap=True)
        text.stylize(rich_style)
        text.highlight_words([q], CURRENT if y == self.current_match_line else MATCH, case_sensitive=False)
        return Strip(text.render(self.app.console), text.cell_len)


class LogPane(Vertical):
    """The log, its status line and the search box (shown by ``/``)."""

    DEFAULT_CSS = """
    LogPane { height: 1fr; border-top: solid $primary-darken-2; }
    LogPane LogView { height: 1fr; }
    LogPane #log-status { height: 1; background: $panel; }
    LogPane Input { display: none; height: 3; }
    LogPane.searching Input { display: block; }
    """

    def __init__(self, max_lines: int = 5000, flush_s: float = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.view = LogView(max_lines=max_lines, flush_s=flush_s, id="log")

    def compose(self) -> ComposeResult:
        yield self.view
        status = TextWidget(id="log-status")
        status.set_content(self.view.status_text())
        yield status
        yield Input(
            placeholder="search the log (Enter: newest match, n/N: next/prev, Esc: close)", id="log-search"
        )

    def on_log_status(self, message: LogStatus) -> None:
        message.stop()
        self.query_one("#log-status", TextWidget).set_content(self.view.status_text())

    def open_search(self) -> None:
        self.add_class("searching")
        self.query_one(Input).focus()

    def close_search(self) -> None:
        self.remove_class("searching")
        self.view.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.view.set_query(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.view.set_query(event.value)
        self.view.action_prev_match()
        self.close_search()

    def on_key(self, event) -> None:
        if event.key == "escape" and self.has_class("searching"):
            event.stop()
            self.close_search()

"""File tails that survive reconnects: each remembers the byte offset it has received up to.

:class:`FileTail` is the console's one follower of a remote file: the session's metrics.jsonl and
train.log, ``logs -f`` (through ``Session.follow``) and the event follow of a stop or launch
(console/core/stop.py, launching.py). It follows through the current helper (``attach``); when the link drops,
the next helper resumes it from the same offset, so nothing is lost or delivered twice. ``drain``
stops following and reads what is left up to the end of the file.
:class:`LineSplitter` turns the byte chunks into complete lines (a partial last line waits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from console.core.helper import Helper, HelperError, HelperGone, Stream, b64decode
from console.core.sanitize import clean_text

MAX_LINE = 64 << 10  # a log line longer than this is cut (the rest up to its newline is dropped)


def clean_line(raw: bytes) -> str:
    """A log line as text: undecodable bytes become U+FFFD, and escape sequences and control
    characters are cleaned (console/core/sanitize.py); of a line that redraws itself with carriage
    returns (progress bars) the last drawing is kept."""
    text = raw.decode("utf-8", "replace").rstrip("\r")
    if "\r" in text:
        text = text.rsplit("\r", 1)[1]
    return clean_text(text)


class LineSplitter:
    """Bytes in, complete decoded lines out, in bounded memory. ``skip_first``: drop bytes up to the
    first newline (used when a tail starts in the middle of a file). A line longer than ``max_line``
    bytes comes out cut at ``max_line`` with a note; the rest of it, up to its newline, is dropped."""

    def __init__(self, skip_first: bool = False, max_line: int = MAX_LINE) -> None:
        self._buf = b""
        self._skip = skip_first
        self._dropping = 0  # > 0: inside an over-long line, this many bytes dropped so far
        self.max_line = max_line
        self.cut_lines = 0

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        if self._skip or self._dropping:
            nl = data.find(b"\n")
            if nl < 0:
                if self._dropping:
                    self._dropping += len(data)
                return out
            if self._dropping:
                out.append(f"[dflash-console: the line above was {self._dropping + nl:,} bytes long; cut]")
            data = data[nl + 1 :]
            self._skip = False
            self._dropping = 0
        data = self._buf + data
        *lines, self._buf = data.split(b"\n")
        for ln in lines:
            if len(ln) > self.max_line:
                out.append(clean_line(ln[: self.max_line]) + " …")
                out.append(f"[dflash-console: the line above was {len(ln):,} bytes long; cut]")
                self.cut_lines += 1
            else:
                out.append(clean_line(ln))
        if len(self._buf) > self.max_line:  # no newline yet: emit the head now, drop until the newline
            out.append(clean_line(self._buf[: self.max_line]) + " …")
            self._dropping = len(self._buf)
            self._buf = b""
            self.cut_lines += 1
        return out


class FileTail:
    """Follow ``path`` from ``offset``; ``on_data(bytes)`` gets every new byte exactly once.

    When the file shrinks (truncated) or is replaced by another one (rotated), following starts again
    at the new file's first byte and ``on_truncate("truncated" | "replaced")`` is called first."""

    def __init__(
        self,
        path: str,
        offset: int,
        on_data: Callable[[bytes], None],
        *,
        on_truncate: Callable[[str], None] | None = None,
        on_error: Callable[[str], None] | None = None,
        interval: float = 0.1,
    ) -> None:
        self.path = path
        self.offset = offset
        self.on_data = on_data
        self.on_truncate = on_truncate
        self.on_error = on_error  # the helper refused to follow (a FIFO, a link...): said once, not retried
        self.interval = interval
        self._stream: Stream | None = None

    def _push(self, push: dict) -> None:
        if "data" in push:
            data = b64decode(push["data"])
            self.offset = int(push["offset"])
            self.on_data(data)
        elif push.get("truncated") or push.get("replaced"):
            self.offset = 0
            if self.on_truncate is not None:
                self.on_truncate("truncated" if push.get("truncated") else "replaced")

    def attach(self, helper: Helper) -> None:
        """(Re)start following through ``helper`` from the offset received so far (once per helper)."""
        if self._stream is not None and self._stream.helper is helper and not helper.closed:
            return
        stream = helper.stream(
            "follow",
            lambda push: self._push_from(stream, push),
            path=self.path,
            offset=self.offset,
            interval=self.interval,
        )
        self._stream = stream
        stream.done.add_done_callback(lambda fut: self._ended(stream, fut))

    def _ended(self, stream: Stream, fut) -> None:
        """A follow the helper ended with an error (its exception is always retrieved here)."""
        if fut.cancelled():
            return
        e = fut.exception()
        if stream is self._stream and isinstance(e, HelperError) and self.on_error is not None:
            self.on_error(f"{self.path} is not followed: {e}")

    def _push_from(self, stream: Stream, push: dict) -> None:
        if stream is self._stream:  # a stream replaced by a newer one says nothing more
            self._push(push)

    async def detach(self) -> None:
        """Stop following (the offset is kept: ``attach`` resumes from it)."""
        st, self._stream = self._stream, None
        if st is not None:
            with contextlib.suppress(HelperGone, HelperError):
                await st.cancel()

    async def drain(self, helper: Helper | None = None) -> None:
        """Stop following, then read what is left up to the end of the file through the same helper
        (what a follow's poll had not brought yet when the writer exited), or through ``helper``
        (after a reconnect)."""
        st = self._stream
        await self.detach()
        helper = helper or (st.helper if st is not None else None)
        if helper is None:
            return
        while True:
            try:
                data, _, size = await helper.read(self.path, self.offset)
            except HelperError:
                return
            if not data:
                return
            self.offset += len(data)
            self.on_data(data)
            if self.offset >= size:
                return


async def start_offset(helper: Helper, path: str, history: int) -> tuple[int, bool]:
    """Where a new tail starts: the last ``history`` bytes (the first, cut line is skipped)."""
    st = await helper.stat(path)
    size = int(st.get("size", 0)) if st.get("exists") else 0
    start = max(0, size - history)
    return start, start > 0

"""File tails that survive reconnects: each remembers the byte offset it has received up to.

:class:`FileTail` is the console's one follower of a remote file: the session's metrics.jsonl and
train.log, ``logs -f`` (through ``Session.follow``) and the event follow of a stop or launch
(console/core/control.py). It follows through the current helper (``attach``); when the link drops,
the next helper resumes it from the same offset, so nothing is lost or delivered twice. ``drain``
stops following and reads what is left up to the end of the file.
:class:`LineSplitter` turns the byte chunks into complete lines (a partial last line waits).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from console.core.helper import Helper, HelperError, HelperGone, Stream, b64decode


class LineSplitter:
    """Bytes in, complete decoded lines out. ``skip_first``: drop bytes up to the first newline
    (used when a tail starts in the middle of a file)."""

    def __init__(self, skip_first: bool = False) -> None:
        self._buf = b""
        self._skip = skip_first

    def feed(self, data: bytes) -> list[str]:
        data = self._buf + data
        if self._skip:
            nl = data.find(b"\n")
            if nl < 0:
                self._buf = b""
                return []
            data = data[nl + 1 :]
            self._skip = False
        *lines, self._buf = data.split(b"\n")
        return [ln.decode("utf-8", "replace").rstrip("\r") for ln in lines]


class FileTail:
    """Follow ``path`` from ``offset``; ``on_data(bytes)`` gets every new byte exactly once."""

    def __init__(
        self,
        path: str,
        offset: int,
        on_data: Callable[[bytes], None],
        *,
        on_truncate: Callable[[], None] | None = None,
        interval: float = 0.1,
    ) -> None:
        self.path = path
        self.offset = offset
        self.on_data = on_data
        self.on_truncate = on_truncate
        self.interval = interval
        self._stream: Stream | None = None

    def _push(self, push: dict) -> None:
        if "data" in push:
            data = b64decode(push["data"])
            self.offset = int(push["offset"])
            self.on_data(data)
        elif push.get("truncated"):
            self.offset = 0
            if self.on_truncate is not None:
                self.on_truncate()

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

    def _push_from(self, stream: Stream, push: dict) -> None:
        if stream is self._stream:  # a stream replaced by a newer one says nothing more
            self._push(push)

    async def detach(self) -> None:
        """Stop following (the offset is kept: ``attach`` resumes from it)."""
        st, self._stream = self._stream, None
        if st is not None:
            with contextlib.suppress(HelperGone, HelperError):
                await st.cancel()

    async def drain(self) -> None:
        """Stop following, then read what is left up to the end of the file through the same helper
        (what a follow's poll had not brought yet when the writer exited)."""
        st = self._stream
        await self.detach()
        if st is None:
            return
        while True:
            try:
                data, _, size = await st.helper.read(self.path, self.offset)
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

"""Reading the run's files through the helper: a size, a small text file, the last lines of a log, the
recent records of metrics.jsonl, the files under a folder.

The helper's ``read`` returns bytes (base64 on the wire), the one kind of reply its client does not
clean. Every such read becomes text only through the one sanitiser: log lines through ``clean_line``,
records through ``MetricsParser`` (console/core/metrics.py), anything else through :func:`read_text`.
Only a copy to a local file (console/core/transfer.py) keeps the bytes as they are."""

from __future__ import annotations

import posixpath

from console.core.helper import Helper, HelperError
from console.core.metrics import MetricsParser
from console.core.sanitize import clean_text
from console.core.streams import MAX_LINE, clean_line

TAIL_MAX = 4 << 20  # `logs -n`: at most this much of the log's end is read


async def file_size(helper: Helper, path: str) -> int:
    st = await helper.stat(path)
    return int(st["size"]) if st.get("exists") else 0


async def read_text(helper: Helper, path: str, limit: int = 4096) -> str:
    """The first ``limit`` bytes of a remote file as text, cleaned (undecodable bytes, escapes and
    controls shown as the sanitiser shows them)."""
    data, _, _ = await helper.read(path, 0, limit)
    return clean_text(data.decode("utf-8", "replace"))


async def tail_lines(helper: Helper, path: str, n: int) -> list[str]:
    """The last ``n`` lines of a remote text file ([] when it is absent)."""
    return (await tail_lines_at(helper, path, n))[0]


async def tail_lines_at(helper: Helper, path: str, n: int, chunk: int = 1 << 16) -> tuple[list[str], int]:
    """(last ``n`` complete lines, the byte offset just after them): follow on from that offset."""
    try:
        data, start, _ = await helper.read(path, -chunk, chunk)
    except HelperError as e:
        if e.kind == "FileNotFoundError":
            return [], 0
        raise
    cut = data.rfind(b"\n") + 1  # a partial last line is left for the follower
    data = data[:cut]
    end = start + cut
    while data.count(b"\n") <= n and start > 0 and len(data) < TAIL_MAX:  # bounded: very long lines
        step = min(start, chunk * 4)
        more, start, _ = await helper.read(path, start - step, step)
        data = more + data
        chunk *= 4
    lines = [
        clean_line(ln[:MAX_LINE]) + (" …" if len(ln) > MAX_LINE else "") for ln in data.split(b"\n")[:-1]
    ]
    if start > 0:
        lines = lines[1:]  # the first one is cut
    return (lines[-n:] if n > 0 else []), end


async def recent_records(helper: Helper, run_dir: str, nbytes: int = 1 << 18) -> list[dict]:
    """Records from the last ``nbytes`` of metrics.jsonl (the first, cut line dropped)."""
    path = posixpath.join(run_dir, "metrics.jsonl")
    try:
        data, start, _ = await helper.read(path, -nbytes, nbytes)
    except HelperError as e:
        if e.kind == "FileNotFoundError":
            return []
        raise
    if start > 0:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    return MetricsParser().feed(data)


async def scan_dir(helper: Helper, path: str) -> dict:
    """{relpath: [size, mtime_ns]} of the files under ``path`` ({} when it is absent)."""
    r = await helper.call("scan", path=path)
    return dict(r.get("files") or {})

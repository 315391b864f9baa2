"""Record what sessions delivered, to look at it again later (``connect --record FILE``,
``dflash-console replay FILE``, ``status``/``logs`` on a record).

A record is gzip-compressed JSON lines: a header ``{"kind": "header", "version", "t", "runs":
[{"label", "where"}]}``, then one line per event ``{"kind": "event", "t", "run", "type", "data"}``
(``t``: this machine's time when the event arrived; ``run``: the run's index) for every event of
console/core/events.py (records of metrics.jsonl, log lines, GPU samples, connection and trainer
changes, action phases, disk scans). It is bounded: once the compressed file reaches ``max_bytes``
the recorder writes a last ``{"kind": "note", "text": ...}`` saying so, closes the file and tells
``on_stop`` (the screen shows it); nothing is dropped silently before that.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import time
import typing
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from console.core.events import Event
from console.core.numeric import number
from console.core.sanitize import MAX_DEPTH, BadJson, loads
from console.core.typed import build

VERSION = 1
TYPES = {c.__name__: c for c in typing.get_args(Event)}  # every session event is recorded


def encode(event) -> tuple[str, dict] | None:
    name = type(event).__name__
    if name not in TYPES:
        return None
    return name, dataclasses.asdict(event)


def decode(name: str, data: dict, where: str = ""):
    """The event ``data`` describes, every field checked (console/core/typed.py: a TypeError naming
    the field when it is not what the recorder writes); None for a type this console does not know."""
    cls = TYPES.get(name)
    if cls is None:
        return None
    return build(cls, data, where or name)


class Recorder:
    """Writes events of one or more runs to ``path``; ``subscriber(i)`` is the callback for run i."""

    def __init__(
        self,
        path: str | os.PathLike,
        runs: list[dict],
        max_bytes: int = 256 << 20,
        clock: Callable[[], float] = time.time,
        on_stop: Callable[[str], None] | None = None,
        check_every: int = 64,
    ) -> None:
        self.path = str(path)
        self.max_bytes = max_bytes
        self.clock = clock
        self.on_stop = on_stop
        self.check_every = check_every
        self._raw = open(self.path, "wb")  # noqa: SIM115 - open for the recorder's lifetime
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)
        self.events = 0
        self.stopped: str | None = None  # why it stopped, once it has
        self._write({"kind": "header", "version": VERSION, "t": clock(), "runs": runs})

    def _write(self, obj: dict) -> None:
        self._gz.write((json.dumps(obj, default=str, separators=(",", ":")) + "\n").encode())

    def subscriber(self, run: int) -> Callable[[object], None]:
        return lambda ev: self.write(run, ev)

    def write(self, run: int, event) -> None:
        if self.stopped is not None:
            return
        enc = encode(event)
        if enc is None:
            return
        self._write({"kind": "event", "t": self.clock(), "run": run, "type": enc[0], "data": enc[1]})
        self.events += 1
        if self.events % self.check_every == 0 and self._raw.tell() >= self.max_bytes:
            self.stop(f"record stopped at its size limit ({self.max_bytes} bytes) after {self.events} events")

    def stop(self, why: str = "record closed") -> None:
        if self.stopped is not None:
            return
        self.stopped = why
        self._write({"kind": "note", "t": self.clock(), "text": why})
        self._gz.close()
        self._raw.close()
        if self.on_stop is not None and why != "record closed":
            self.on_stop(why)

    def close(self) -> None:
        self.stop()


MAX_LINE = 16 << 20  # one event's line, at most (the recorder writes at most a few MB: a log batch)
MAX_BAD = 5  # bad lines named in Recording.bad_lines (all are counted)


@dataclass
class Entry:
    t: float
    run: int
    event: object


@dataclass
class Recording:
    path: str
    header: dict
    entries: list[Entry]
    notes: list[tuple[float, str]]
    torn: bool = False  # the file ended mid-way (the console was killed while recording)
    bad: int = 0  # complete lines that were not events this console reads: skipped
    bad_lines: list[str] = field(default_factory=list)  # the first MAX_BAD of them, "FILE:LINE: why"

    @property
    def runs(self) -> list[dict]:
        return self.header.get("runs") or [{"label": "run", "where": "?"}]

    @property
    def start(self) -> float:
        return self.header.get("t", self.entries[0].t if self.entries else 0.0)

    @property
    def end(self) -> float:
        return self.entries[-1].t if self.entries else self.start

    def events_of(self, run: int) -> Iterator[Entry]:
        return (e for e in self.entries if e.run == run)

    def stream(self) -> Iterator[Entry]:
        """The entries from the first (a replay's fold; :class:`Streamed` reads them from the file)."""
        return iter(self.entries)


class Streamed:
    """A record a replay reads as it goes (``dflash-console replay``): the header when opened, then
    :meth:`stream` reads the file from its start one bounded line at a time, each time it is called (a
    jump back). Memory stays that of one line and the screen's folded state, however large the record
    unpacks; its end is known once a stream has reached it (``end`` is None until then)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        with Reader(path) as r:
            self.header = r.header
        self.end: float | None = None
        self.notes: list[tuple[float, str]] = []
        self.bad = 0
        self.bad_lines: list[str] = []
        self.torn = False

    runs = Recording.runs

    @property
    def start(self) -> float:
        return self.header.get("t", 0.0)

    def stream(self) -> Iterator[Entry]:
        last = None
        with Reader(self.path) as r:
            for entry in r:
                last = entry.t
                yield entry
        self.end = last if last is not None else self.start
        self.notes, self.bad, self.bad_lines, self.torn = r.notes, r.bad, r.bad_lines, r.torn


class RecordError(ValueError):
    """Not a record this console can read (the message names the file, and the line when one is to blame)."""


def read(path: str | os.PathLike) -> Recording:
    """The whole record, in memory (what a replay seeks in); status and logs stream it (:class:`Reader`)."""
    with Reader(path) as r:
        entries = list(r)
    return r.recording(entries)


class Reader:
    """A record read one bounded line at a time: the header when opened, then ``for entry in reader``.

    A complete line that is not an event this console reads (too long, not JSON, nested too deep,
    a field of the wrong type) is skipped and counted, with its line number; a torn last line (the
    console was killed while recording) ends the record quietly; a file that is not a record at all
    is a :class:`RecordError` naming it."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self.line = 0
        self.notes: list[tuple[float, str]] = []
        self.torn = False
        self.bad = 0
        self.bad_lines: list[str] = []
        try:
            self._f = gzip.open(self.path, "rb")  # noqa: SIM115 - closed by __exit__ (or below)
        except OSError as e:
            raise RecordError(f"{self.path}: {e.strerror or e}") from e
        try:
            self.header = self._read_header()
        except BaseException:
            self._f.close()
            raise

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def recording(self, entries: list[Entry]) -> Recording:
        return Recording(self.path, self.header, entries, self.notes, self.torn, self.bad, self.bad_lines)

    def __iter__(self) -> Iterator[Entry]:
        for obj in self._objects():
            kind, entry = obj.get("kind"), None
            try:  # each line decoded on its own (and the yield outside: a reader's error is its own)
                if kind == "event":
                    entry = self._entry(obj)
                elif kind == "note":
                    self.notes.append((number(obj.get("t")) or 0.0, str(obj.get("text", ""))))
            except (TypeError, ValueError, KeyError) as e:
                self._bad(str(e))
            if entry is not None:
                yield entry

    def _read_header(self) -> dict:
        raw = next(self._lines(), None)
        try:
            obj = loads(raw) if raw else None
        except BadJson as e:
            raise RecordError(f"{self.path}:1: not a dflash-console record ({e})") from e
        if not isinstance(obj, dict) or obj.get("kind") != "header" or self.line != 1:
            raise RecordError(f"{self.path}:1: not a dflash-console record (no header)")
        if obj.get("version") != VERSION:
            raise RecordError(
                f"{self.path}: record version {obj.get('version')} (this console reads {VERSION})"
            )
        runs = obj.get("runs", [])
        ok = isinstance(runs, list) and all(
            isinstance(r, dict) and all(isinstance(r.get(k, ""), str) for k in ("label", "where"))
            for r in runs
        )
        if not ok or not isinstance(obj.get("t", 0.0), (int, float)):
            raise RecordError(f"{self.path}:1: the header's runs or t are not what a recorder writes")
        return obj

    def _entry(self, obj: dict) -> Entry | None:
        t, run, name = obj.get("t"), obj.get("run", 0), obj.get("type")
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            raise TypeError("event: t is not a number")
        if not isinstance(run, int) or isinstance(run, bool) or not isinstance(name, str):
            raise TypeError("event: run is not an integer or type not a string")
        event = decode(name, obj.get("data"), f"{name} event")
        return None if event is None else Entry(float(t), run, event)

    def _bad(self, why: str) -> None:
        self.bad += 1
        if len(self.bad_lines) < MAX_BAD:
            self.bad_lines.append(f"{self.path}:{self.line}: {why}")

    def _objects(self) -> Iterator[dict]:
        """Each complete line's JSON object (a bad line is counted, never kept whole in memory)."""
        for raw in self._lines():
            if raw is None:
                self._bad(f"longer than {MAX_LINE:,} bytes")
                continue
            try:
                obj = loads(raw, max_depth=MAX_DEPTH + 8)  # an event wraps a record in 3 levels
            except BadJson as e:
                self._bad(str(e))
                continue
            if isinstance(obj, dict):
                yield obj
            else:
                self._bad(f"a JSON {type(obj).__name__}, not an object")

    def _lines(self) -> Iterator[bytes | None]:
        """Complete lines (None for one over MAX_LINE, skipped unread); a torn or corrupt end stops."""
        try:
            while True:
                raw = self._f.readline(MAX_LINE + 1)
                if not raw:
                    return
                self.line += 1
                if len(raw) > MAX_LINE:
                    while raw and not raw.endswith(b"\n"):  # skip the rest of it, 1 MB at a time
                        raw = self._f.readline(1 << 20)
                    yield None
                elif not raw.endswith(b"\n"):
                    self.torn = True
                    return
                elif raw.strip():
                    yield raw
        except (EOFError, gzip.BadGzipFile, OSError, zlib.error) as e:
            if self.line <= 1:
                raise RecordError(f"{self.path}: not a dflash-console record ({e})") from e
            self.torn = True

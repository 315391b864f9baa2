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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from console.core.events import (
    ActionPhase,
    CheckpointEntry,
    ConnState,
    DiskInfo,
    Gpu,
    GpuSample,
    LogLines,
    Record,
    TelemetryState,
    TrainerFound,
    TrainerInfo,
)

VERSION = 1
TYPES = {
    c.__name__: c
    for c in (ActionPhase, ConnState, DiskInfo, GpuSample, LogLines, Record, TelemetryState, TrainerFound)
}


def encode(event) -> tuple[str, dict] | None:
    name = type(event).__name__
    if name not in TYPES:
        return None
    return name, dataclasses.asdict(event)


def decode(name: str, data: dict):
    cls = TYPES.get(name)
    if cls is None:
        return None
    if cls is TrainerFound:
        tr = data.get("trainer")
        return TrainerFound(TrainerInfo(**tr) if tr else None)
    if cls is GpuSample:
        return GpuSample([Gpu(**g) for g in data.get("gpus", [])])
    if cls is DiskInfo:
        return DiskInfo(
            **{**data, "checkpoints": [CheckpointEntry(**c) for c in data.get("checkpoints", [])]}
        )
    return cls(**data)


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


class RecordError(ValueError):
    """Not a record this console can read."""


def read(path: str | os.PathLike) -> Recording:
    """The whole record (a torn end, as after a kill, keeps what is complete)."""
    header, entries, notes, torn = None, [], [], False
    try:
        with gzip.open(path, "rt") as f:
            try:
                for line in f:
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError:
                        torn = True
                        break
                    kind = obj.get("kind")
                    if kind == "header":
                        header = obj
                    elif kind == "event":
                        ev = decode(obj.get("type"), obj.get("data") or {})
                        if ev is not None:
                            entries.append(Entry(obj["t"], obj.get("run", 0), ev))
                    elif kind == "note":
                        notes.append((obj.get("t", 0.0), obj.get("text", "")))
            except (EOFError, gzip.BadGzipFile, OSError) as e:
                if header is None:
                    raise RecordError(f"{path}: not a dflash-console record ({e})") from e
                torn = True
    except FileNotFoundError as e:
        raise RecordError(f"{path}: no such file") from e
    if header is None:
        raise RecordError(f"{path}: not a dflash-console record (no header)")
    if header.get("version") != VERSION:
        raise RecordError(f"{path}: record version {header.get('version')} (this console reads {VERSION})")
    return Recording(str(path), header, entries, notes, torn)

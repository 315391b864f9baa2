"""Start-up as records: what a run does between its launch and its first optimizer step.

``StartupEvents(writer, ...)`` writes ``startup`` records (``{"kind": "startup", "phase": ..., "elapsed_s":
...}``; docs/run-directory.md: a kind of their own, so readers that list events see none of them) and,
once, the ``first_step`` phase. ``elapsed_s`` counts
from the launch: the launcher's (or the single process's) start, read from /proc (interpreter start-up
and imports included), handed to workers in ``DFLASH_LAUNCH_T``. Phases, in order:
``loading_target`` (``bytes`` of ``total_bytes``, repeated as it reads), ``target_loaded``,
``building_drafter``, ``compile_cache``, ``compiling`` (``part``), ``queue_filling``; then ``first_step`` (``seconds``: launch to the first optimizer step).

``startup.json`` in the run directory keeps the durations of past starts (``first_step_s``,
``target_load_s``): the next start's events carry them as ``expected_s``, the console's estimate.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

from trainer.run.rundir import atomic_write_text

STARTUP_FILE = "startup.json"
LAUNCH_ENV = "DFLASH_LAUNCH_T"
PROGRESS_EVERY_S = 0.5  # at most this often a loading_target progress event


def launch_time() -> float:
    """Unix time this run was launched: ``DFLASH_LAUNCH_T`` (a worker), else this process's start."""
    env = os.environ.get(LAUNCH_ENV)
    if env:
        with contextlib.suppress(ValueError):
            return float(env)
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
        t = time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
        if 0 <= time.time() - t < 3600:
            return t
    except (OSError, ValueError, IndexError):
        pass
    return time.time()


def read_history(run_dir: str) -> dict[str, list[float]]:
    try:
        with open(os.path.join(run_dir, STARTUP_FILE), encoding="utf-8") as f:
            data = json.load(f)
        return {k: [float(x) for x in v] for k, v in data.items() if isinstance(v, list)}
    except (OSError, ValueError, TypeError):
        return {}


def expected(history: dict[str, list[float]], key: str) -> float | None:
    """The last start's figure (the same run, code and shapes change little between restarts)."""
    vals = history.get(key) or []
    return vals[-1] if vals else None


def record(run_dir: str, key: str, seconds: float) -> None:
    """Append a duration to startup.json (the last 10 kept); a failure to write is no error."""
    h = read_history(run_dir)
    h[key] = [*h.get(key, []), round(float(seconds), 3)][-10:]
    with contextlib.suppress(OSError):
        atomic_write_text(os.path.join(run_dir, STARTUP_FILE), json.dumps(h))


class StartupEvents:
    """The start-up events of one process (``tags``: ``role``, ``device``, ``rank`` in a worker)."""

    def __init__(
        self, writer, run_dir: str | None = None, *, t0: float | None = None, keep: bool = True, **tags: Any
    ):
        self.writer, self.run_dir, self.keep = writer, run_dir, keep  # keep: record durations in startup.json
        self.t0 = launch_time() if t0 is None else t0
        self.tags = {k: v for k, v in tags.items() if v is not None}
        self.history = read_history(run_dir) if run_dir else {}
        self.done = False
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return max(0.0, time.time() - self.t0)

    def phase(self, phase: str, **fields: Any) -> None:
        if self.done or self.writer is None:
            return
        with self._lock:
            self.writer.write(
                "startup", phase=phase, elapsed_s=round(self.elapsed(), 3), **{**self.tags, **fields}
            )

    def loading(self, total_bytes: int | None) -> None:
        """``loading_target`` at 0 bytes (``total_bytes``: the weight files' size, refined as it reads)."""
        self.load_start = self._last = time.monotonic()
        self.phase(
            "loading_target",
            bytes=0,
            total_bytes=total_bytes,
            expected_s=expected(self.history, "target_load_s"),
        )

    def progress(self, done: int, total: int) -> None:
        """A ``loading_target`` event with ``bytes`` of ``total_bytes``: at most one every
        ``PROGRESS_EVERY_S``, and always the last (``done == total``). Safe to call from any thread."""
        now = time.monotonic()
        if done < total and now - getattr(self, "_last", 0.0) < PROGRESS_EVERY_S:
            return
        self._last = now
        self.phase("loading_target", bytes=int(done), total_bytes=int(total))

    def target_loaded(self, nbytes: int) -> None:
        seconds = time.monotonic() - getattr(self, "load_start", time.monotonic())
        self.phase("target_loaded", seconds=round(seconds, 3), bytes=nbytes)
        if self.run_dir and self.keep:
            record(self.run_dir, "target_load_s", seconds)

    def first_step(self, step: int) -> None:
        """The ``first_step`` record (once): the run trains. Also records the duration for the next start."""
        if self.done or self.writer is None:
            return
        seconds = self.elapsed()
        self.writer.write(
            "startup",
            phase="first_step",
            elapsed_s=round(seconds, 3),
            step=step,
            seconds=round(seconds, 3),
            expected_s=expected(self.history, "first_step_s"),
            **self.tags,
        )
        self.done = True
        if self.run_dir and self.keep:
            record(self.run_dir, "first_step_s", seconds)

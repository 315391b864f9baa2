"""The run directory's files: run.json, metrics.jsonl and the throughput reporter.

See docs/run-directory.md for the contract. Writes that replace a file are atomic (temp name in the
same directory, fsync, rename, fsync of the directory). metrics.jsonl is append-only, one JSON object
a line, flushed per line, written under a lock so that threads never interleave lines.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

ENV_KEYS = (
    "CUDA_VISIBLE_DEVICES",
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "HF_HOME",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_OFFLINE",
    "LD_LIBRARY_PATH",
)
ENV_PREFIXES = ("NCCL_", "TORCH_", "DFLASH_")


class RunDirBusy(RuntimeError):
    """run.json names a trainer that is still alive."""


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str, *, before_rename: Callable[[], None] | None = None) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; run.json and latest are read by other users (a server)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(d)


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot); None if no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = data[data.rindex(")") + 2 :].split()
    return int(rest[19])  # rest[0] is field 3 (state); field 22 is rest[19]


def is_same_process(pid: int, start_time: int) -> bool:
    st = proc_start_time(pid)
    if st is None or st != start_time:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def check_not_running(run_dir: str) -> None:
    """Raise RunDirBusy if run_dir/run.json names a live process other than this one."""
    path = os.path.join(run_dir, "run.json")
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        pid, st = int(info["pid"]), int(info["start_time"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return
    if pid != os.getpid() and is_same_process(pid, st):
        raise RunDirBusy(
            f"{path} names a live trainer (pid {pid}); stop it first or use another --output-dir"
        )


def code_dir() -> str:
    """The directory that contains the ``trainer`` package (what PYTHONPATH needs)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_info(
    run_dir: str, roles: dict[str, list[str]], version: str, drafter: dict[str, Any] | None = None
) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k in ENV_KEYS or k.startswith(ENV_PREFIXES)}
    return {
        "pid": os.getpid(),
        "start_time": proc_start_time(os.getpid()),
        "command": [sys.executable, "-m", "trainer.pipeline", *sys.argv[1:]],
        "argv": list(sys.argv[1:]),
        "interpreter": sys.executable,
        "cwd": os.getcwd(),
        "code_dir": code_dir(),
        "env": env,
        "hostname": socket.gethostname(),
        "roles": roles,
        "drafter": drafter,
        "version": version,
        "output_dir": os.path.abspath(run_dir),
    }


def write_run_json(run_dir: str, info: dict[str, Any]) -> None:
    atomic_write_text(os.path.join(run_dir, "run.json"), json.dumps(info, indent=1) + "\n")


def _clean(v: Any) -> Any:
    """JSON has no NaN/Infinity: non-finite floats become null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


class MetricsWriter:
    """Appends records to metrics.jsonl; thread-safe, one flush per line."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the run
        self.listeners: list[Callable[[dict[str, Any]], None]] = []  # called with each record once written

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        rec = {"t": time.time(), "kind": kind, **fields}
        line = json.dumps(_clean(rec), allow_nan=False) + "\n"
        with self._lock:
            if self._f is not None:
                self._f.write(line)
                self._f.flush()
        for cb in self.listeners:
            cb(rec)
        return rec

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        return self.write("event", name=name, **fields)

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


class RoleMeter:
    """Tokens and busy time of one role on one device, read by the reporter thread."""

    def __init__(self, device: str, role: str, uuid: str | None = None):
        self.device, self.role, self.uuid = device, role, uuid
        self._lock = threading.Lock()
        self._tokens = 0
        self._busy = 0.0
        self._since: float | None = None  # start of the current busy span

    def begin(self) -> None:
        with self._lock:
            self._since = time.monotonic()

    def end(self, tokens: int) -> None:
        with self._lock:
            if self._since is not None:
                self._busy += time.monotonic() - self._since
                self._since = None
            self._tokens += int(tokens)

    def take(self, now: float) -> tuple[int, float]:
        """(tokens, busy seconds) since the last take."""
        with self._lock:
            tokens, busy = self._tokens, self._busy
            if self._since is not None:
                busy += now - self._since
                self._since = now
            self._tokens, self._busy = 0, 0.0
        return tokens, busy


class Reporter(threading.Thread):
    """Background thread: a throughput record every ``interval`` s, and ``on_tick`` callbacks every 0.1 s."""

    def __init__(
        self,
        writer: MetricsWriter,
        meters: list[RoleMeter],
        queue_stats: Callable[[], tuple[int, int]],
        interval: float = 0.5,
    ):
        super().__init__(name="dflash-reporter", daemon=True)
        self.writer, self.meters, self.queue_stats, self.interval = writer, meters, queue_stats, interval
        self.on_tick: list[Callable[[], None]] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        last = time.monotonic()
        while not self._stop_evt.wait(0.1):
            for cb in self.on_tick:
                cb()
            now = time.monotonic()
            if now - last >= self.interval:
                self.report(now, now - last)
                last = now

    def report(self, now: float, dt: float) -> None:
        meters = list(self.meters)  # filled in once the roles exist; nothing to report before
        if not meters:
            return
        devices = []
        for m in meters:
            tokens, busy = m.take(now)
            devices.append(
                {
                    "device": m.device,
                    "uuid": m.uuid,
                    "role": m.role,
                    "tok_s": tokens / dt,
                    "busy": max(0.0, min(1.0, busy / dt)),
                }
            )
        depth, cap = self.queue_stats()
        self.writer.write("throughput", devices=devices, queue={"depth": depth, "capacity": cap})

    def stop(self) -> None:
        self._stop_evt.set()
        if self.is_alive():
            self.join()

"""The run directory's files: run.json, metrics.jsonl and the throughput reporter.

See docs/run-directory.md for the contract. Writes that replace a file are atomic (temp name in the
same directory, fsync, rename, fsync of the directory). metrics.jsonl is append-only, one JSON object
a line, flushed per line, written under a lock so that threads never interleave lines.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from trainer.thread_names import name_this_thread

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
ENV_SECRETS = ("DFLASH_CONTROL_SECRET",)  # never into run.json (0644)


class RunDirBusy(RuntimeError):
    """run.json names a trainer that is still alive."""


# what the trainer (and its trackers) write in the run directory under a fixed name: never a link it did not make
OWN_NAMES = ("metrics.jsonl", "checkpoints", "evals", "tensorboard", "wandb", "mlruns")


class LinkRefused(OSError):
    """A name the trainer writes under is a symbolic link (or not what it should be): the trainer does not follow it."""


def _refusal(path: str, what: str) -> LinkRefused:
    try:
        target = f" (to {os.readlink(path)!r})"
    except OSError:
        target = ""
    return LinkRefused(
        f"{path} is {what}{target}: refused (the trainer makes its run directory's files itself)"
    )


def refuse_links(run_dir: str, names: tuple[str, ...] = OWN_NAMES) -> None:
    """Raise ``LinkRefused`` naming the first of ``names`` in ``run_dir`` that is a symbolic link."""
    for n in names:
        p = os.path.join(run_dir, n)
        if os.path.islink(p):
            raise _refusal(p, "a symbolic link")


def own_dir(path: str) -> str:
    """``path`` as a real folder (made 0755 where missing); ``LinkRefused`` where it is a link or not a folder."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(path, "a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise _refusal(path, "not a folder")
    return path


def open_append(path: str):
    """``path`` opened to append (made 0644 where missing), never through a link, and only a regular file (a FIFO
    would hold the open, a device take the writes): an unbuffered binary file object."""
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644
        )
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link; a FIFO with no reader
            raise _refusal(
                path, "a symbolic link" if e.errno == errno.ELOOP else "not a regular file"
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _refusal(path, "not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab", buffering=0)


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
    """The directory that contains the ``trainer`` package (what PYTHONPATH needs): this file is
    ``CODE/trainer/run/rundir.py``."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_info(
    run_dir: str, roles: dict[str, list[str]], version: str, drafter: dict[str, Any] | None = None
) -> dict[str, Any]:
    """run.json's contents (docs/run-directory.md); ``drafter``: the resolved drafter settings
    (``Settings.drafter_record()``, trainer/run/settings.py), which the console reads by these names."""
    env = {
        k: v
        for k, v in os.environ.items()
        if (k in ENV_KEYS or k.startswith(ENV_PREFIXES)) and k not in ENV_SECRETS
    }
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


# a full disk (or quota), a failing disk: the record is dropped and training goes on
_DROP_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})


class MetricsWriter:
    """Appends records to metrics.jsonl; thread-safe, one write per line.

    A write that fails with ENOSPC, EDQUOT or EIO drops that record (a torn line is cut off again) and
    training goes on: the first failure of a streak is said once on stderr (train.log) with the free
    space, every dropped record is counted, and the first write that succeeds again is preceded by a
    ``metrics_dropped`` event with the count. Other errors are raised."""

    def __init__(self, path: str, *, err: Callable[[str], None] | None = None):
        self.path = path
        self._lock = threading.Lock()
        self._f = open_append(path)  # lives as long as the run
        self.listeners: list[Callable[[dict[str, Any]], None]] = []  # called with each record once written
        self.dropped = 0  # records dropped in the current streak of failed writes
        self.dropped_total = 0
        self._dropped_since: float | None = None
        self._torn = False  # a failed write left part of a line that could not be cut off
        self._err = err or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        rec = {"t": time.time(), "kind": kind, **fields}
        line = (json.dumps(_clean(rec), allow_nan=False) + "\n").encode()
        with self._lock:
            if self._f is not None:
                self._write_or_drop(rec, line)
        for cb in self.listeners:
            cb(rec)
        return rec

    def _write_or_drop(self, rec: dict[str, Any], line: bytes) -> None:
        if not self.dropped:
            self._put(line, rec)
            return
        # writes failed before: the note of what was lost goes first, in the same write as the record
        # (a note that fits where the record does not would start a new streak with every record)
        n = self.dropped
        note = {
            "t": rec["t"],
            "kind": "event",
            "name": "metrics_dropped",
            "count": n,
            "since": self._dropped_since,
        }
        if self._put(json.dumps(note).encode() + b"\n" + line, rec):
            self._err(f"metrics.jsonl: writes succeed again; {n} record(s) were dropped")
            self.dropped, self._dropped_since = 0, None

    def _put(self, data: bytes, rec: dict[str, Any]) -> bool:
        """Write ``data`` whole, or drop ``rec`` (counted; said once per streak) and answer False."""
        fd = self._f.fileno()
        try:
            start = os.fstat(fd).st_size
        except OSError:
            start = None
        try:
            if self._torn:
                self._writeall(b"\n")  # end the torn line: readers skip it as one bad line
                self._torn = False
            self._writeall(data)
            return True
        except OSError as e:
            if e.errno not in _DROP_ERRNOS:
                raise
            self._cut(fd, start)
            if not self.dropped:
                self._dropped_since = rec["t"]
                self._err(
                    f"warning: metrics.jsonl: a write failed: {e} ({_free(self.path)}); the {rec['kind']} "
                    "record was dropped, and records are dropped (and counted) until writes succeed "
                    "again; training goes on"
                )
            self.dropped += 1
            self.dropped_total += 1
            return False

    def _writeall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._f.write(view)
            view = view[n:]

    def _cut(self, fd: int, start: int | None) -> None:
        """Cut off what a failed write left (a part of a line), or mark the line torn."""
        try:
            if start is None:
                self._torn = True
            elif os.fstat(fd).st_size > start:
                os.ftruncate(fd, start)
        except OSError:
            self._torn = True

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        return self.write("event", name=name, **fields)

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None


def _free(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB free on {folder}"
    except OSError:
        return f"free space on {folder} unknown"


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
        name_this_thread()
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
                    **({"host": m.host} if getattr(m, "host", None) else {}),
                }
            )
        depth, cap = self.queue_stats()
        self.writer.write("throughput", devices=devices, queue={"depth": depth, "capacity": cap})

    def stop(self) -> None:
        self._stop_evt.set()
        if self.is_alive():
            self.join()

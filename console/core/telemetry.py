"""GPU telemetry from one long-lived ``nvidia-smi --query-gpu=... -lms N`` on its own channel.

``parse_gpu_line`` reads one CSV line (``--format=csv,noheader,nounits``); ``Telemetry`` runs the
stream and groups lines into samples (one line per GPU each interval). Where there is no nvidia-smi
it reports that (``TelemetryState(available=False)``) and stops; it does not crash the session.
Which GPU is which trainer device: console/core/devices.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import asyncssh

from console.core.events import Gpu, GpuSample, TelemetryState
from console.core.place import HOST, Place
from console.core.sanitize import clean_text

FIELDS = "index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"


def nvidia_smi_argv(interval_ms: int | None = 500) -> list[str]:
    argv = ["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"]
    if interval_ms:
        argv += ["-lms", str(int(interval_ms))]
    return argv


# nvidia-smi watched by its channel: when the console closes it (stdin EOF: a quit, a dropped link) a
# hung nvidia-smi is killed, not left behind; its own exit ends the channel as before (its exit status)
# (fd 3: the channel's stdin, which sh gives an asynchronous list as /dev/null)
WATCHED = (
    'exec 3<&0; "$@" </dev/null 3<&- & p=$!; '
    '{ cat <&3 >/dev/null; kill -KILL "$p"; } >/dev/null 2>&1 & exec 3<&-; wait "$p"'
)


def watched(argv: list[str]) -> list[str]:
    """``argv`` run so that it ends when its channel's stdin closes (:data:`WATCHED`)."""
    return ["sh", "-c", WATCHED, "sh", *argv]


def remote_command(argv: list[str], place: Place) -> str:
    """``argv`` as the SSH channel runs it in ``place`` (console/core/place.py)."""
    return place.command(argv)


def _smi_number(text: str) -> float | None:
    """A field of nvidia-smi's CSV as a float; None for an empty one or what it prints for none."""
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "-"):
        return None  # [N/A], [Not Supported], [Unknown Error]
    try:
        return float(text)
    except ValueError:
        return None


def parse_gpu_line(line: str) -> Gpu | None:
    """One nvidia-smi CSV line -> Gpu, or None for anything else (a header, an error message). It
    comes on its own channel, not through the helper: cleaned here (console/core/sanitize.py)."""
    parts = [p.strip() for p in clean_text(line).strip().split(",")]
    if len(parts) != 8 or not parts[0].isdigit():
        return None
    return Gpu(
        index=int(parts[0]),
        uuid=parts[1],
        name=parts[2],
        util=_smi_number(parts[3]),
        mem_used=_smi_number(parts[4]),
        mem_total=_smi_number(parts[5]),
        power=_smi_number(parts[6]),
        temp=_smi_number(parts[7]),
    )


def parse_output(text: str) -> list[Gpu]:
    return [g for g in (parse_gpu_line(ln) for ln in text.splitlines()) if g is not None]


class Telemetry:
    """Runs nvidia-smi on its own channel and calls ``emit`` with GpuSample / TelemetryState."""

    def __init__(
        self, emit: Callable[[object], None], *, place: Place = HOST, interval_ms: int = 500
    ) -> None:
        self.emit = emit
        self.place = place
        self.interval_ms = interval_ms
        self._task: asyncio.Task | None = None
        self._proc: asyncssh.SSHClientProcess | None = None

    def start(self, conn: asyncssh.SSHClientConnection) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(conn))

    async def stop(self) -> None:
        if self._proc is not None:
            self._proc.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._task = None
        self._proc = None

    async def _run(self, conn: asyncssh.SSHClientConnection) -> None:
        cmd = remote_command(watched(nvidia_smi_argv(self.interval_ms)), self.place)
        try:
            self._proc = proc = await conn.create_process(cmd, encoding="utf-8", errors="replace")
        except (asyncssh.Error, OSError) as e:
            self.emit(TelemetryState(False, f"could not start nvidia-smi: {e}"))
            return
        announced = False
        batch: list[Gpu] = []
        flush_after = max(0.05, self.interval_ms / 4000)

        def flush() -> None:
            nonlocal batch, announced
            if not batch:
                return
            if not announced:
                self.emit(TelemetryState(True, f"nvidia-smi every {self.interval_ms} ms"))
                announced = True
            self.emit(GpuSample(batch))
            batch = []

        try:
            while True:
                try:
                    if batch:  # one sample is the lines of one interval: flush on a pause
                        line = await asyncio.wait_for(proc.stdout.readline(), flush_after)
                    else:
                        line = await proc.stdout.readline()
                except asyncio.TimeoutError:
                    flush()
                    continue
                if not line:
                    break
                g = parse_gpu_line(line)
                if g is None:
                    continue
                if any(b.index == g.index for b in batch):
                    flush()
                batch.append(g)
        except (asyncssh.Error, OSError):
            pass
        flush()
        err = ""
        with contextlib.suppress(Exception):
            err = (await asyncio.wait_for(proc.stderr.read(), 2)).strip()
        status = None
        with contextlib.suppress(Exception):
            status = (await asyncio.wait_for(proc.wait(), 2)).exit_status
        why = clean_text(err.splitlines()[-1]) if err else f"exit status {status}"
        if not announced:
            self.emit(TelemetryState(False, f"no GPU telemetry: nvidia-smi is not available ({why})"))
        else:
            self.emit(TelemetryState(False, f"nvidia-smi stopped ({why})"))


def _index(line: str) -> int | None:
    head = line.split(",", 1)[0].strip()
    return int(head) if head.isdigit() else None

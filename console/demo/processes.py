"""The processes the demo started: each carries ``DFLASH_DEMO=<token>`` in its environment, so
whatever still does at the end is found and ended (trainers with SIGINT, so they save)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

from console.core.trainer_argv import is_trainer_cmdline

MARKER_ENV = "DFLASH_DEMO"
STOP_TIMEOUT = 90.0  # seconds a trainer gets to save and exit

Say = Callable[[str], None]


def marked_processes(token: str) -> list[tuple[int, list[str]]]:
    """(pid, cmdline) of every live process whose environment carries ``DFLASH_DEMO=token``."""
    want = f"{MARKER_ENV}={token}".encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")[:-1]]
        except OSError:
            continue
        out.append((int(name), cmd))
    return out


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


async def _wait_gone(token: str, pids: set[int], timeout: float) -> set[int]:
    end = time.monotonic() + timeout
    left = pids
    while left and time.monotonic() < end:
        await asyncio.sleep(0.1)
        left = pids & {p for p, _ in marked_processes(token)}
    return left


async def end_marked(token: str, say: Say, trainer_wait: float = STOP_TIMEOUT) -> list[str]:
    """End what is left of the demo's processes: trainers get SIGINT (they save), the rest SIGTERM,
    then SIGKILL. Returns what had to be ended (empty when nothing was left)."""
    procs = marked_processes(token)
    if not procs:
        return []
    ended = [f"{pid} {' '.join(cmd)[:120]}" for pid, cmd in procs]
    trainers = {pid for pid, cmd in procs if is_trainer_cmdline(cmd)}
    for pid in trainers:
        say(f"trainer pid {pid} still running: SIGINT (it saves a checkpoint and exits)")
        _signal(pid, signal.SIGINT)
    if trainers:
        await _wait_gone(token, trainers, trainer_wait)
    rest = {p for p, _ in marked_processes(token)}
    for pid in rest:
        _signal(pid, signal.SIGTERM)
    rest = await _wait_gone(token, rest, 5.0)
    for pid in rest:
        say(f"pid {pid} did not end on SIGTERM: SIGKILL")
        _signal(pid, signal.SIGKILL)
    await _wait_gone(token, rest, 5.0)
    return ended

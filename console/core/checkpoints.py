"""The run directory's checkpoints and free space, read through the helper (its ``checkpoints`` op:
one ``statvfs`` and a walk of ``checkpoints/step_*``), for the health rules, the checkpoint list and
``status --check``. :class:`CheckpointWatch` polls at a modest rate (default every 30 s) while connected."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable

from console.core.events import CheckpointEntry, DiskInfo
from console.core.helper import Helper, HelperError, HelperGone

log = logging.getLogger(__name__)

DEFAULT_KEEP = 2  # the trainer's default number of checkpoints kept (trainer/run/checkpoint.py)
_STEP = re.compile(r"^step_(\d+)$")


def keep_count(run: dict | None) -> int | None:
    """How many checkpoints the trainer keeps: ``--keep-checkpoints N`` from run.json's argv, else
    the trainer's default (None without a run.json)."""
    argv = run.get("argv") if isinstance(run, dict) else None
    if not isinstance(argv, list):
        return None
    argv = [str(a) for a in argv]
    for i, a in enumerate(argv):
        v = argv[i + 1] if a == "--keep-checkpoints" and i + 1 < len(argv) else None
        if a.startswith("--keep-checkpoints="):
            v = a.split("=", 1)[1]
        if v is not None:
            with contextlib.suppress(ValueError):
                return int(v)
    return DEFAULT_KEEP


def parse(run_dir: str, result: dict, run: dict | None = None, t: float | None = None) -> DiskInfo:
    latest = result.get("latest")
    entries = []
    for e in result.get("entries") or []:
        m = _STEP.match(str(e.get("name", "")))
        entries.append(
            CheckpointEntry(
                name=e["name"],
                path=e["path"],
                step=int(m.group(1)) if m else None,
                bytes=int(e.get("bytes") or 0),
                mtime=e.get("mtime"),
                complete=bool(e.get("complete")),
                latest=e["name"] == latest,
                export=e.get("export"),
                refused=e.get("link") or e.get("export_refused"),
            )
        )
    entries.sort(key=lambda c: (c.step is None, c.step or 0))
    return DiskInfo(
        run_dir=run_dir,
        free_bytes=result.get("free"),
        total_bytes=result.get("total"),
        checkpoints=entries,
        latest=latest,
        keep=keep_count(run),
        error=result.get("error"),
        t=time.time() if t is None else t,
    )


async def scan(helper: Helper, run_dir: str, run: dict | None = None) -> DiskInfo:
    """One look at the run dir's filesystem and checkpoints."""
    return parse(run_dir, await helper.call("checkpoints", path=run_dir), run)


class CheckpointWatch:
    """Polls ``scan`` every ``interval_s`` for a session (anything with ``helper``, ``run_dir``, ``run``)
    and hands each :class:`DiskInfo` to ``on_info``. ``poke()`` looks again at once (after a save)."""

    def __init__(self, session, on_info: Callable[[DiskInfo], None], interval_s: float = 30.0) -> None:
        self.session = session
        self.on_info = on_info
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def poke(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            helper, run_dir = getattr(self.session, "helper", None), getattr(self.session, "run_dir", None)
            if helper is not None and not helper.closed and run_dir:
                try:
                    self.on_info(await scan(helper, run_dir, getattr(self.session, "run", None)))
                except (HelperError, HelperGone):
                    pass
                except Exception:
                    log.exception("checkpoint scan failed")
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)

"""Stopping the trainer cleanly through the helper: verify, one signal, follow its save to its exit, across
dropped links (:class:`StopFollow`)."""

from __future__ import annotations

import asyncio
import posixpath
import re
import time
from collections.abc import Callable

from console.core import stop_witness
from console.core.events import ActionPhase, ActionResult, Outcome, TrainerInfo
from console.core.finding import Verdict, identify, trainer_identity
from console.core.formatting import fmt_bytes
from console.core.helper import Helper, HelperError
from console.core.metrics import MetricsParser
from console.core.numeric import number
from console.core.phases import StopPhase
from console.core.remote_files import file_size, read_text, scan_dir
from console.core.streams import FileTail

PhaseCallback = Callable[[ActionPhase], None]

SCAN_EVERY_S = 0.5  # a trainer without events: how often its --output-dir is looked at while it saves
REPORT_EVERY_S = 2.0  # ... and how often a growing file's new size is said
_CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")  # a folder of checkpoints/ (step_00000005)

TRAINER_SAVE_FAILED = (
    4  # the trainer's exit status when its final checkpoint could not be written (docs/run-directory.md)
)


def _changed(before: dict, after: dict) -> dict[str, int]:
    """Files of ``after`` that are new or grew (or were rewritten) since ``before``: {relpath: size}."""
    out = {}
    for rel, (size, mtime) in after.items():
        old = before.get(rel)
        if old is None or size != old[0] or mtime != old[1]:
            out[rel] = size
    return out


def _describe(files: dict[str, int], limit: int = 6) -> str:
    names = sorted(files, key=lambda r: (-files[r], r))
    text = ", ".join(f"{r} ({fmt_bytes(files[r])})" for r in names[:limit])
    return text + (f" and {len(names) - limit} more" if len(names) > limit else "")


class StopFollow:
    """One clean stop, followed to the trainer's exit across dropped links.

    ``start(helper)`` verifies the PID, sends the one signal and follows the save; when the link drops
    it raises :class:`HelperGone` and keeps what it knows (the signal was sent, the metrics.jsonl
    offset, the events seen). ``resume(helper)`` on the next link re-identifies the trainer by PID and
    start time: still running, it follows on from the same offset (no second signal); gone, the outcome
    comes from the run directory (the events it wrote meanwhile, ``checkpoints/latest``).

    Every event the trainer wrote after the signal becomes a phase, in file order, however many arrive
    in one read (``stop_requested`` -> signal_sent, ``checkpoint_saving`` -> saving, ``checkpoint_saved``
    -> saved, ``error`` -> error), before ``exited``. A trainer without the run-directory contract (found
    by its command line) gets an open-ended ``saving`` phase that names the files appearing or growing
    in its ``--output-dir``.
    """

    def __init__(
        self,
        trainer: TrainerInfo,
        *,
        timeout: float = 120.0,
        on_phase: PhaseCallback | None = None,
        sig: str = "SIGINT",
    ) -> None:
        self.trainer = trainer
        self.timeout = timeout
        self.on_phase = on_phase
        self.sig = sig
        self.deadline = time.monotonic() + timeout
        self.signalled = False  # the signal was sent, or its request was under way when the link dropped
        self.t_signal: float | None = None
        self.has_events = False
        self.tail: FileTail | None = None
        self.parser = MetricsParser()
        self.saved: dict | None = None
        self.saving_seen = False
        self.errors: list[str] = []
        self.stopped: dict | None = None
        self.baseline: dict | None = None  # no events: the output dir's files before the signal
        self.written: dict[str, int] = {}
        self._said: tuple[list[str], str, float] = ([], "", 0.0)  # the files last named, when

    # -- phases --------------------------------------------------------------------------------------
    def phase(self, name: StopPhase, detail: str, expected: float | None = None) -> None:
        if self.on_phase is not None:
            self.on_phase(ActionPhase(name, detail, expected, time.time()))

    def _on_data(self, data: bytes) -> None:
        for rec in self.parser.feed(data):
            if rec.get("kind") == "event":
                self._event(rec)

    def _event(self, ev: dict) -> None:
        name = ev.get("name")
        if name == "stop_requested":
            self.phase(StopPhase.SIGNAL_SENT, f"trainer acknowledged {ev.get('signal') or self.sig}")
        elif name == "checkpoint_saving":
            self.saving_seen = True
            self.phase(
                StopPhase.SAVING, f"saving checkpoint at step {ev.get('step')}", number(ev.get("expected_s"))
            )
        elif name == "checkpoint_saved":
            self.saved = ev
            secs = number(ev.get("seconds"))
            self.phase(
                StopPhase.SAVED,
                f"checkpoint saved: {ev.get('path')}" + (f" ({secs:.1f} s)" if secs is not None else ""),
            )
        elif name == "error":
            self.errors.append(str(ev.get("message")))
            self.phase(StopPhase.ERROR, f"trainer reported an error: {ev.get('message')}")
        elif name == "stopped":
            self.stopped = ev

    # -- the first link: verify, signal, follow --------------------------------------------------------
    async def start(self, helper: Helper) -> ActionResult:
        trainer, pid, sig = self.trainer, self.trainer.pid, self.sig
        self.phase(StopPhase.VERIFYING, f"pid {pid}: checking /proc/{pid} still is the trainer")
        v = await identify(helper, trainer)
        if v.state == "gone":
            self.phase(StopPhase.EXITED, f"pid {pid} is not running")
            return ActionResult(Outcome.NO_TRAINER, f"no trainer: pid {pid} is not running", trainer)
        if not v.same:
            msg = (
                f"refused: pid {pid} is no longer the trainer ({v.why}; now running: {v.now_running()}); "
                "nothing was signalled"
            )
            self.phase(StopPhase.REFUSED, msg)
            return ActionResult(Outcome.REFUSED, msg, trainer)
        if v.owner:
            self.phase(StopPhase.VERIFYING, f"pid {pid} {v.owner}")
        if v.ignores(sig):
            return self._refuse_ignored(v)
        refused = await self._witness_before(helper)
        if refused is not None:
            return refused
        metrics = posixpath.join(trainer.run_dir, "metrics.jsonl") if trainer.run_dir else None
        self.has_events = trainer.source == "run.json" or bool(
            metrics and (await helper.stat(metrics)).get("exists")
        )
        if metrics and self.has_events:
            self.tail = FileTail(metrics, await file_size(helper, metrics), self._on_data, interval=0.05)
            self.tail.attach(helper)
        elif trainer.run_dir:
            self.baseline = await scan_dir(helper, trainer.run_dir)
        self.signalled = True  # from here on a dropped link never leads to a second signal
        sent = await helper.call("kill", pid=pid, sig=sig, expect=trainer_identity(trainer))
        if not sent["sent"]:
            self.signalled = False
            if self.tail is not None:
                await self.tail.detach()
            if sent["reason"] == "mismatch":
                why = str(sent.get("why") or "")[:200]  # changed between the check and the signal
                because = f" ({why})" if why else ""
                msg = f"refused: pid {pid} is no longer the trainer{because}; nothing was signalled"
                self.phase(StopPhase.REFUSED, msg)
                return ActionResult(Outcome.REFUSED, msg, trainer)
            self.phase(StopPhase.EXITED, f"pid {pid} exited before the signal")
            return ActionResult(
                Outcome.NO_TRAINER, f"no trainer: pid {pid} exited before the signal", trainer
            )
        self.t_signal = time.time()
        self.phase(StopPhase.SIGNAL_SENT, f"{sig} sent to pid {pid}")
        if not self.has_events:
            where = (
                f"; watching {trainer.run_dir} for new or growing files" if self.baseline is not None else ""
            )
            self.phase(
                StopPhase.SAVING,
                f"waiting for pid {pid} to save and exit (it reports no progress events){where}",
            )
        return await self._follow(helper)

    # -- a later link ----------------------------------------------------------------------------------
    async def resume(self, helper: Helper) -> ActionResult:
        """Go on after a reconnect (only once ``signalled``): follow a live trainer or read the outcome."""
        tr, pid = self.trainer, self.trainer.pid
        if (await identify(helper, tr)).same:
            self.phase(
                StopPhase.RECONNECTED,
                f"link back: pid {pid} (start time {tr.start_time}) is still the trainer; following its save "
                f"(not signalled again)",
            )
            if self.tail is not None:
                self.tail.attach(helper)
            return await self._follow(helper)
        self.phase(
            StopPhase.RECONNECTED,
            f"link back: pid {pid} exited while the link was down; reading the run directory",
        )
        if self.tail is not None:
            await self.tail.drain(helper)
        return await self._conclude(helper, {"rc": None}, offline=True)

    # -- following -----------------------------------------------------------------------------------
    async def _follow(self, helper: Helper) -> ActionResult:
        pid = self.trainer.pid
        waiter = asyncio.ensure_future(helper.call("wait_exit", pid=pid, start_time=self.trainer.start_time))
        try:
            while True:
                left = self.deadline - time.monotonic()
                step = min(left, SCAN_EVERY_S) if self.baseline is not None else left
                await asyncio.wait([waiter], timeout=max(0.0, step))
                if waiter.done():
                    exit_info = waiter.result()  # HelperGone when the link dropped: resume() goes on
                    if self.tail is not None:
                        await self.tail.drain()
                    return await self._conclude(helper, exit_info)
                if self.baseline is not None:
                    await self._report_files(helper)
                if time.monotonic() >= self.deadline:
                    return self._timeout()
        finally:
            if not waiter.done():
                waiter.cancel()
            if self.tail is not None:
                await self.tail.detach()

    async def _report_files(self, helper: Helper, final: bool = False) -> None:
        self.written = _changed(self.baseline or {}, await scan_dir(helper, self.trainer.run_dir))
        if not self.written or final:
            return
        text, names, now = _describe(self.written), sorted(self.written), time.monotonic()
        said_names, said_text, said_t = self._said
        if names != said_names or (text != said_text and now - said_t >= REPORT_EVERY_S):
            self._said = (names, text, now)  # a new file at once; a growing one every few seconds
            self.phase(StopPhase.SAVING, f"writing in {self.trainer.run_dir}: {text}")

    def _refuse_ignored(self, v: Verdict) -> ActionResult:
        """The trainer ignores the stop's signal: sending it would only start a wait for the timeout."""
        pid, sig = self.trainer.pid, self.sig
        other = "SIGTERM" if sig == "SIGINT" else "SIGINT"
        msg = (
            f"refused: pid {pid} ignores {sig} (SigIgn in /proc/{pid}/status), so it cannot stop cleanly; "
            f"nothing was signalled. A Python program started in the background by a script (`nohup ... &`) "
            f"inherits SIGINT ignored, and its KeyboardInterrupt never comes; a run the console launches does not. "
            + ("" if v.ignores(other) else f"If it saves on {other}: `kill -{other[3:]} {pid}`; ")
            + f"`kill -KILL {pid}` inside the container ends it without a save."
        )
        self.phase(StopPhase.REFUSED, msg)
        return ActionResult(Outcome.REFUSED, msg, self.trainer)

    def _timeout(self) -> ActionResult:
        pid = self.trainer.pid
        what = "still saving" if self.saving_seen and self.saved is None else "still running"
        msg = (
            f"timeout after {self.timeout:.0f} s: pid {pid} is {what} and was left running. "
            f"Wait and check with `status`, run `stop` again with a longer --timeout, or (losing the "
            f"save in progress; checkpoints/latest keeps the last complete one) `kill -KILL {pid}` "
            f"inside the container."
        )
        self.phase(StopPhase.TIMEOUT, msg)
        return ActionResult(Outcome.STILL_RUNNING, msg, self.trainer)

    async def _latest(self, helper: Helper) -> str | None:
        """What ``checkpoints/latest`` names, as the final message says it (None: nothing). Its bytes are
        the run directory's: cleaned, and only a checkpoint's folder name is taken for one."""
        if not self.trainer.run_dir:
            return None
        ckpts = posixpath.join(self.trainer.run_dir, "checkpoints")
        try:
            name = (await read_text(helper, posixpath.join(ckpts, "latest"), 4096)).strip()
        except HelperError:
            return None
        if not name:
            return None
        if not _CHECKPOINT_NAME.fullmatch(name) or not name.strip("."):
            return f"{name[:80]!r} (not a checkpoint's name)"
        return posixpath.join(ckpts, name)

    async def _witness_before(self, helper: Helper) -> ActionResult | None:
        """Just before the signal: a run.json that no longer names the verified process refuses the
        stop; another trainer of the run directory is said (only the verified one is signalled)."""
        changed = await stop_witness.rewritten(helper, self.trainer)
        if changed:
            msg = (
                f"refused: run.json was rewritten since the trainer was found: {changed}; nothing was "
                "signalled (check `status`)"
            )
            self.phase(StopPhase.REFUSED, msg)
            return ActionResult(Outcome.REFUSED, msg, self.trainer)
        left = await stop_witness.others(helper, self.trainer)
        if left:
            self.phase(
                StopPhase.VERIFYING,
                f"also running with --output-dir {self.trainer.run_dir}: {stop_witness.describe(left)}; "
                f"only pid {self.trainer.pid} is signalled",
            )
        return None

    async def _conclude(self, helper: Helper, exit_info: dict, offline: bool = False) -> ActionResult:
        """How the stop ended for the verified process, checked against the run directory
        (console/core/stop_witness.py): a rewritten run.json or a trainer left running is no success."""
        return await stop_witness.verdict(
            helper, self.trainer, await self._outcome(helper, exit_info, offline)
        )

    async def _outcome(self, helper: Helper, exit_info: dict, offline: bool = False) -> ActionResult:
        tr, pid = self.trainer, self.trainer.pid
        rc = exit_info.get("rc")
        if rc is None and self.stopped is not None and isinstance(self.stopped.get("exit_code"), int):
            rc = self.stopped["exit_code"]
        rc_s = f", exit code {rc}" if rc is not None else ""
        when = (
            "while the link was down"
            if offline
            else f"{time.time() - (self.t_signal or time.time()):.1f} s after the signal"
        )
        src = " (from the run directory)" if offline else ""
        if not self.has_events:
            if self.baseline is not None:
                await self._report_files(helper, final=True)
            if self.written and rc in (0, None):
                self.phase(StopPhase.SAVED, f"wrote {_describe(self.written)}")
                self.phase(StopPhase.EXITED, f"pid {pid} exited {when}{rc_s}")
                note = (
                    ""
                    if rc is not None
                    else " (its exit status is not visible: it is not the helper's child)"
                )
                return ActionResult(
                    Outcome.OK,
                    f"stopped: pid {pid} exited{rc_s}{note} after writing in {tr.run_dir}: {_describe(self.written)}",
                    tr,
                )
            if self.written:
                what = f"after writing {_describe(self.written)}, but with exit code {rc}"
            elif self.baseline is None:
                what = "(its output directory is unknown: nothing to check)" + (
                    f"{rc_s}" if rc is not None else ""
                )
            else:
                what = f"without writing anything new in {tr.run_dir}{rc_s}"
            self.phase(StopPhase.EXITED, f"pid {pid} exited {when} {what}")
            return ActionResult(Outcome.NO_CHECKPOINT, f"pid {pid} exited {what}", tr)
        if self.saved is not None:
            self.phase(StopPhase.EXITED, f"pid {pid} exited {when}{rc_s}")
            msg = (
                f"stopped{' while the link was down' if offline else ''}: checkpoint "
                f"{self.saved.get('path')} saved (step {self.saved.get('step')}); pid {pid} exited{rc_s}{src}"
            )
            return ActionResult(Outcome.OK, msg, tr, self.saved.get("path"))
        latest = await self._latest(helper)
        keeps = (
            f"; checkpoints/latest still names {latest}" if latest else "; there is no complete checkpoint"
        )
        failed = (
            (self.stopped or {}).get("reason") == "checkpoint_failed"
            or (self.saving_seen and bool(self.errors))
            or rc == TRAINER_SAVE_FAILED  # a full disk may refuse even the events that say so
        )
        if failed:
            err = self.errors[-1] if self.errors else "the save did not complete"
            self.phase(StopPhase.EXITED, f"pid {pid} exited {when}: checkpoint failed{rc_s}")
            return ActionResult(
                Outcome.NO_CHECKPOINT, f"checkpoint failed: {err}; pid {pid} exited{rc_s}{src}{keeps}", tr
            )
        self.phase(StopPhase.EXITED, f"pid {pid} exited {when} without saving a checkpoint{rc_s}")
        return ActionResult(
            Outcome.NO_CHECKPOINT, f"pid {pid} exited without checkpoint_saved{rc_s}{src}{keeps}", tr
        )


async def stop(
    helper: Helper,
    trainer: TrainerInfo,
    *,
    timeout: float = 120.0,
    on_phase: PhaseCallback | None = None,
    sig: str = "SIGINT",
) -> ActionResult:
    """Stop the trainer cleanly on this one link (see :class:`StopFollow`; ``Session.stop_trainer``
    also goes on across reconnects)."""
    return await StopFollow(trainer, timeout=timeout, on_phase=on_phase, sig=sig).start(helper)

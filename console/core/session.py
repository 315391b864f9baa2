"""A live session with one host: the connection, the helper, the trainer, its streams.

The screen, the CLI and the demo all use this. ``subscribe(callback)`` delivers the events of
console/core/events.py on the event loop (Records and LogLines in file order). ``start()`` connects
once (raising what went wrong); after that a dropped link is retried in the background with capped
backoff, and the tails resume from their byte offsets. ``close()`` never touches the trainer.
Every method that changes the remote raises :class:`ReadOnlyError` when ``readonly``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import posixpath
import shlex
import time
from collections.abc import Callable, Collection

import asyncssh

from console.core import deploy, finding, launching, pyspy, remote_files, serve_watch, threads, trainer_argv
from console.core.control_error import ControlError
from console.core.events import (
    ActionPhase,
    ActionResult,
    ConnState,
    JobState,
    LogLines,
    Outcome,
    Record,
    TrainerFound,
    TrainerInfo,
)
from console.core.helper import Helper, HelperError, HelperGone
from console.core.metrics import MetricsParser
from console.core.options import ConnectOptions
from console.core.phases import StopPhase
from console.core.place import HOST, Place, PlaceError
from console.core.restart_trust import prefill_concerns, refusal, restart_concerns
from console.core.sanitize import clean_text
from console.core.serving import Endpoint
from console.core.ssh import backoff, connect
from console.core.stop import StopFollow
from console.core.streams import FileTail, LineSplitter, start_offset
from console.core.telemetry import Telemetry
from console.core.threads import ThreadsError

log = logging.getLogger(__name__)

Callback = Callable[[object], None]
JOB_POLL_S = 15.0  # how often the screen asks the scheduler about the place's job (a Slurm job)


class ReadOnlyError(PermissionError):
    """A changing action was asked of a read-only session."""


class NotConnected(ConnectionError):
    """No live link to the host right now (it is being retried)."""


class Session:
    def __init__(
        self,
        options: ConnectOptions,
        *,
        place: Place = HOST,
        run_dir: str | None = None,
        readonly: bool = False,
        gpu_interval_ms: int = 500,
        python: str = "python3",
        streams: bool = True,
        telemetry: bool = True,
        metrics_history: int = 4 << 20,
        log_history: int = 64 << 10,
        rescan_s: float = 1.0,
        link=None,
        serve: Endpoint | None = None,
        pyspy: str | None = None,
    ) -> None:
        self.options = options
        self.pyspy = pyspy  # the operator's py-spy in the container (else the helper's PATH's)
        # a console.core.hostlink.HostLink when several sessions share one connection to a host
        self.link = link
        self.place = place  # where the trainer lives: the host, or Proxmox(200) (console/core/place.py)
        self.run_dir = run_dir
        self.readonly = readonly
        self.python = python
        self.streams = streams
        self.metrics_history = metrics_history
        self.log_history = log_history
        self.rescan_s = rescan_s
        self.serve = serve  # a serving endpoint whose acceptance the screen shows (console/core/serving.py)
        self.trainer: TrainerInfo | None = None
        self.run: dict | None = None
        self.conn: asyncssh.SSHClientConnection | None = None
        self.helper: Helper | None = None
        self._subs: list[Callback] = []
        self._conn_state = ConnState("disconnected", "not started", None)
        self._trainer_known = False
        self._closing = False
        self._supervisor: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._job_watcher: asyncio.Task | None = None  # the place's scheduler job (Slurm), on the screen
        self._serve_watcher: asyncio.Task | None = None  # the serving endpoint's /metrics, on the screen
        self._telemetry = (
            Telemetry(self._emit, place=place, interval_ms=gpu_interval_ms) if telemetry else None
        )
        self._metrics_tail: FileTail | None = None
        self._log_tail: FileTail | None = None
        self._followed: list[FileTail] = []  # tails of callers (Session.follow), re-attached on reconnect
        self._metrics_parser = MetricsParser()
        self._metrics_skip = False
        self._log_lines = LineSplitter()
        self._tails_dir: str | None = None
        # one attach at a time: two concurrent attaches (connect racing a launch) made two pairs of tails
        self._attach_lock = asyncio.Lock()
        self._linked = asyncio.Event()  # set while a helper is up (a stop waits on it after a drop)

    # --- events ------------------------------------------------------------------------------------

    def subscribe(self, callback: Callback) -> Callable[[], None]:
        """Add a subscriber; it gets the current ConnState (and TrainerFound once known) at once."""
        self._subs.append(callback)
        callback(self._conn_state)
        if self._trainer_known:
            callback(TrainerFound(self.trainer))

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subs.remove(callback)

        return unsubscribe

    def _emit(self, event: object) -> None:
        for cb in list(self._subs):
            try:
                cb(event)
            except Exception:
                log.exception("session subscriber failed on %s", type(event).__name__)

    def _state(self, state: str, detail: str, retry_in: float | None = None) -> None:
        # the detail may carry an SSH server's or a runtime's own words (a disconnect reason): cleaned
        self._conn_state = ConnState(state, clean_text(detail), retry_in)
        self._emit(self._conn_state)

    @property
    def connected(self) -> bool:
        return self.helper is not None and not self.helper.closed

    @property
    def where(self) -> str:
        return self.place.at(self.options.display, " ")

    # --- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, start the helper, find the trainer, start tails and telemetry; then keep it up."""
        self._closing = False
        self._state("connecting", f"connecting to {self.where}")
        try:
            await self._connect()
        except Exception as e:
            self._state("disconnected", str(e))
            raise
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())

    async def close(self) -> None:
        """Drop the link and stop every stream. The trainer is left exactly as it is."""
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
            self._supervisor = None
        await self._teardown()
        self._state("disconnected", "closed")

    async def __aenter__(self) -> Session:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _connect(self) -> None:
        conn = await (self.link.acquire() if self.link is not None else connect(self.options))
        try:
            helper = await Helper.start(conn, place=self.place, python=self.python)
        except BaseException:
            self._drop_conn(conn)
            raise
        self.conn, self.helper = conn, helper
        if self.run_dir is None:
            self.run_dir = await self._job_run_dir()
        if self.run_dir and not posixpath.isabs(self.run_dir):
            self.run_dir = trainer_argv.resolve(self.run_dir, helper.home)
        try:
            await self._refresh_trainer()
            if self.streams:
                await self._attach_tails()
            for tail in self._followed:
                tail.attach(helper)
        except HelperGone:
            pass  # the link died again at once: the supervisor sees the closed helper and retries
        self._linked.set()
        py = ".".join(str(v) for v in helper.hello.get("python_version", []))
        self._state("connected", f"{self.where}: helper pid {helper.pid} (python {py})")
        if self._telemetry is not None:
            self._telemetry.start(conn)
        self._watcher = asyncio.get_running_loop().create_task(self._watch(helper))
        if self._telemetry is not None and self.place.state_argv() is not None:
            self._job_watcher = asyncio.get_running_loop().create_task(self._watch_job(helper))
        if self.streams and self.serve is not None:
            watching = serve_watch.watch(helper, self.serve, self._emit, lambda: self._closing)
            self._serve_watcher = asyncio.get_running_loop().create_task(watching)

    async def _teardown(self) -> None:
        self._linked.clear()
        for task in (self._watcher, self._job_watcher, self._serve_watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._watcher = self._job_watcher = None
        if self._telemetry is not None:
            await self._telemetry.stop()
        for tail in (self._metrics_tail, self._log_tail, *self._followed):
            if tail is not None:
                await tail.detach()
        helper, conn = self.helper, self.conn
        self.helper = self.conn = None
        if helper is not None:
            await helper.close()
        if conn is not None:
            if self.link is not None:
                self.link.release(conn)
                return
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)

    def _drop_conn(self, conn) -> None:
        if self.link is not None:
            self.link.release(conn)
        else:
            conn.close()

    async def _supervise(self) -> None:
        """Wait for the link to drop; reconnect with capped backoff; say so at every step."""
        while not self._closing:
            helper = self.helper
            if helper is not None:
                await helper.wait_closed()
            if self._closing:
                return
            await self._teardown()
            attempt = 0
            reason = "link lost"
            while not self._closing:
                delay = backoff(attempt)
                attempt += 1
                self._state("reconnecting", f"{self.where}: {reason}; retrying", delay)
                await asyncio.sleep(delay)
                self._state("connecting", f"reconnecting to {self.where} (attempt {attempt})")
                try:
                    await self._connect()
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    reason = str(e) or type(e).__name__

    # --- trainer tracking -------------------------------------------------------------------------

    def _set_trainer(self, trainer: TrainerInfo | None) -> None:
        old = self.trainer
        same = (old is None and trainer is None) or (
            old is not None
            and trainer is not None
            and (old.pid, old.start_time) == (trainer.pid, trainer.start_time)
            and old.source == trainer.source
        )
        self.trainer = trainer
        if trainer is not None and trainer.run is not None:
            self.run = trainer.run
        if not same or not self._trainer_known:
            self._trainer_known = True
            self._emit(TrainerFound(trainer))

    async def _trainer_exited(self, helper: Helper, trainer: TrainerInfo) -> None:
        """The trainer exited: first read metrics.jsonl and train.log to their end and deliver what
        they still held (its last records, `stopped` among them, may not have been polled yet), and
        only then say it is gone, so that whoever hears of the exit has already seen its last words."""
        async with self._attach_lock:
            for tail in (self._metrics_tail, self._log_tail):
                if tail is None:
                    continue
                with contextlib.suppress(HelperError):
                    await tail.drain(helper)
                if not helper.closed:
                    tail.attach(helper)  # a trainer resumed in the same run dir appends to the same files
        if self.trainer is trainer:
            self._set_trainer(None)

    async def _refresh_trainer(self) -> TrainerInfo | None:
        helper = self.need_helper()
        if self.run_dir is None and self.place.state_argv() is not None:  # a scheduler's job (Slurm)
            self.run_dir = await self._job_run_dir()
            if self.run_dir is None and not helper.hello.get("slurm_job"):
                self._set_trainer(None)  # no job of it runs: the host's other trainers are not its
                return None
        trainer, run = await finding.find_trainer(helper, self.run_dir)
        if trainer is None and self.trainer is not None:  # it exited while we were not watching
            await self._trainer_exited(helper, self.trainer)
        if run is not None:
            self.run = run
        if trainer is not None and self.run_dir is None and trainer.run_dir:
            self.run_dir = trainer.run_dir
        self._set_trainer(trainer)
        if self.streams and self.run_dir and self.run_dir != self._tails_dir:
            await self._attach_tails()
        return trainer

    async def _watch(self, helper: Helper) -> None:
        """Learn at once when the trainer exits (pidfd in the helper); look for one while there is none."""
        with contextlib.suppress(HelperGone, asyncio.CancelledError):
            while not helper.closed and not self._closing:
                trainer = self.trainer
                if trainer is None:
                    await asyncio.sleep(self.rescan_s)
                    if self.trainer is None:
                        with contextlib.suppress(HelperError):
                            await self._refresh_trainer()
                    continue
                try:
                    r = await helper.call("wait_exit", pid=trainer.pid, start_time=trainer.start_time)
                except HelperError:
                    await asyncio.sleep(self.rescan_s)
                    continue
                if r.get("exited") and self.trainer is trainer:
                    await self._trainer_exited(helper, trainer)

    async def job_state(self) -> dict | None:
        """The place's scheduler job now (a Slurm job: id, state, reason, time used and left, nodes, output
        file); None where the place has no scheduler or it shows no job; ``{"error": ...}`` when it could
        not be asked."""
        argv = self.place.state_argv()
        if argv is None:
            return None
        try:
            r = await self.need_helper().run(argv, timeout=15)
        except HelperError as e:
            return {"error": str(e)[:200]}
        if r["rc"] != 0:  # squeue -j of a job that has left the queue
            return {"error": (r["stderr"] or r["stdout"]).strip()[:200] or f"exit {r['rc']}"}
        return self.place.state(r["stdout"])

    async def _job_run_dir(self) -> str | None:
        """The run dir the place's scheduler job names (a Slurm job's output file), else None: on a node
        every trainer is visible, and the job says which one is this place's."""
        state = await self.job_state()
        return self.place.run_dir(state if state and "error" not in state else None)

    async def _watch_job(self, helper: Helper) -> None:
        """Ask the place's scheduler about its job (``squeue``) every ``JOB_POLL_S``: state, time left."""
        with contextlib.suppress(HelperGone, NotConnected, asyncio.CancelledError):
            while not helper.closed and not self._closing:
                self._emit(JobState.of(await self.job_state(), time.time()))
                await asyncio.sleep(JOB_POLL_S)

    # --- streams ------------------------------------------------------------------------------------

    def _on_metrics(self, data: bytes) -> None:
        if self._metrics_skip:
            nl = data.find(b"\n")
            if nl < 0:
                return
            data = data[nl + 1 :]
            self._metrics_skip = False
        bad = self._metrics_parser.bad_lines
        for rec in self._metrics_parser.feed(data):
            self._emit(Record(rec))
        if self._metrics_parser.bad_lines > bad:
            self._note(
                f"metrics.jsonl: skipped {self._metrics_parser.bad_lines - bad} line(s) that are not "
                f"valid records (too long, not JSON, or binary; {self._metrics_parser.bad_lines} so far)"
            )

    def _note(self, text: str) -> None:
        """A line of the console's own in the log pane (a skipped record, a rotated file...)."""
        self._emit(LogLines([f"[dflash-console] {text}"]))

    def _on_log(self, data: bytes) -> None:
        lines = self._log_lines.feed(data)
        if lines:
            self._emit(LogLines(lines))

    async def _attach_tails(self) -> None:
        async with self._attach_lock:
            await self._attach_tails_locked()

    async def _attach_tails_locked(self) -> None:
        helper = self.helper
        if helper is None or self.run_dir is None:
            return
        if self._tails_dir != self.run_dir:  # a new run dir: new tails, from a bounded history
            for tail in (self._metrics_tail, self._log_tail):
                if tail is not None:
                    await tail.detach()
            mpath = posixpath.join(self.run_dir, "metrics.jsonl")
            lpath = posixpath.join(self.run_dir, "train.log")
            moff, self._metrics_skip = await start_offset(helper, mpath, self.metrics_history)
            loff, lskip = await start_offset(helper, lpath, self.log_history)
            self._metrics_parser = MetricsParser()
            self._log_lines = LineSplitter(skip_first=lskip)
            self._metrics_tail = FileTail(
                mpath, moff, self._on_metrics, on_truncate=self._metrics_reset, on_error=self._note
            )
            self._log_tail = FileTail(
                lpath, loff, self._on_log, on_truncate=self._log_reset, on_error=self._note
            )
            self._tails_dir = self.run_dir
        self._metrics_tail.attach(helper)
        self._log_tail.attach(helper)

    def _metrics_reset(self, how: str = "truncated") -> None:
        self._metrics_parser = MetricsParser()
        self._metrics_skip = False
        self._note(f"metrics.jsonl was {how}: reading the new file from its start")

    def _log_reset(self, how: str = "truncated") -> None:
        self._log_lines = LineSplitter()
        self._note(f"train.log was {how}: following the new file from its start")

    def follow(self, path: str, offset: int, on_data: Callable[[bytes], None]) -> FileTail:
        """Follow the remote file ``path`` from byte ``offset``: ``on_data`` gets every new byte once,
        across reconnects (the tail is attached now when connected, and again after each reconnect).
        :meth:`unfollow` ends it; :meth:`close` ends them all."""
        tail = FileTail(path, offset, on_data)
        self._followed.append(tail)
        if self.connected:
            tail.attach(self.helper)
        return tail

    async def unfollow(self, tail: FileTail) -> None:
        with contextlib.suppress(ValueError):
            self._followed.remove(tail)
        await tail.detach()

    @property
    def log_path(self) -> str | None:
        """The run's train.log (None without a run dir)."""
        return posixpath.join(self.run_dir, "train.log") if self.run_dir else None

    @property
    def offsets(self) -> dict[str, int]:
        """Bytes received so far of metrics.jsonl and train.log (for tests and status)."""
        return {
            "metrics": self._metrics_tail.offset if self._metrics_tail else 0,
            "log": self._log_tail.offset if self._log_tail else 0,
        }

    # --- actions ------------------------------------------------------------------------------------

    def need_helper(self) -> Helper:
        """The live helper; :class:`NotConnected` while there is none (the link is being retried)."""
        if self.helper is None or self.helper.closed:
            raise NotConnected(f"not connected to {self.where} ({self._conn_state.detail})")
        return self.helper

    def _writable(self) -> Helper:
        if self.readonly:
            raise ReadOnlyError("this session is read-only")
        return self.need_helper()

    def _phase_fn(self, on_phase: Callable[[ActionPhase], None] | None) -> Callable[[ActionPhase], None]:
        def phase(p: ActionPhase) -> None:
            self._emit(p)
            if on_phase is not None:
                on_phase(p)

        return phase

    async def find_trainer(self) -> TrainerInfo | None:
        """Look again now (run.json of the run dir, else the process table)."""
        return await self._refresh_trainer()

    async def stop_trainer(self, timeout: float = 120.0, on_phase=None, sig: str = "SIGINT") -> ActionResult:
        """Stop cleanly (see console/core/stop.py); the result's code says how it ended."""
        helper = self._writable()
        trainer = self.trainer or await self._refresh_trainer()
        if trainer is None:
            stale = await finding.stale_run_pid(helper, self.run, self.run_dir)
            if stale is not None:
                msg = (
                    f"refused: run.json names pid {stale['pid']}, but that pid is no longer the trainer "
                    f"({stale['why']}; now running: {stale['now']}); nothing was signalled"
                )
                p = ActionPhase(StopPhase.REFUSED, msg, None, time.time())
                self._phase_fn(on_phase)(p)
                return ActionResult(Outcome.REFUSED, msg)
            where = f" for {self.run_dir}" if self.run_dir else ""
            return ActionResult(Outcome.NO_TRAINER, f"no trainer found{where} on {self.where}")
        res = await self._stop(helper, trainer, timeout, self._phase_fn(on_phase), sig)
        if res.code in (Outcome.OK, Outcome.NO_CHECKPOINT, Outcome.NO_TRAINER) and self.trainer is trainer:
            self._set_trainer(None)
        return res

    async def _stop(
        self, helper: Helper, trainer: TrainerInfo, timeout: float, phase, sig: str
    ) -> ActionResult:
        """StopFollow across dropped links: after a drop it waits for the supervisor's reconnect
        (backoff) and goes on with the new helper; the trainer is signalled once, never again."""
        follow = StopFollow(trainer, timeout=timeout, on_phase=phase, sig=sig)
        try:
            return await follow.start(helper)
        except HelperGone as e:
            err = e
        while True:
            if not follow.signalled:
                return ActionResult(
                    Outcome.ERROR,
                    f"the link dropped before the signal was sent ({err}); nothing was signalled: check `status`",
                    trainer,
                )
            phase(
                ActionPhase(
                    StopPhase.RECONNECTING,
                    f"the link dropped during the stop ({err}); reconnecting. pid {trainer.pid} got {sig} once "
                    "and is not signalled again",
                    None,
                    time.time(),
                )
            )
            try:
                await asyncio.wait_for(self._linked.wait(), max(0.0, follow.deadline - time.monotonic()))
                helper = self.need_helper()
            except (asyncio.TimeoutError, NotConnected):
                msg = (
                    f"the link did not come back within {timeout:.0f} s: pid {trainer.pid} got {sig} and may "
                    f"still be saving; check `status` once the host is reachable"
                )
                phase(ActionPhase(StopPhase.ERROR, msg, None, time.time()))
                return ActionResult(Outcome.ERROR, msg, trainer)
            try:
                return await follow.resume(helper)
            except HelperGone as e:
                err = e

    async def plan_restart(
        self, code_dir: str | None = None
    ) -> tuple[launching.RestartPlan, list[str], TrainerInfo | None]:
        """(what a restart would launch, why it needs its own confirmation (restart_trust), the trainer
        it would stop first); :class:`ControlError` when it could not be launched again. The one planner
        of the CLI's ``restart`` and the screen's ``r``: without ``code_dir`` it runs the last deployment
        to this place (deploy.last_deployed) where run.json's code is a deployed one (launching.choose_code)."""
        helper = self._writable()
        trainer = self.trainer or await self._refresh_trainer()
        run = self.run
        if run is None and self.run_dir:
            run = await finding.read_run_json(helper, self.run_dir)
        recorded = ((trainer.run if trainer and trainer.run else None) or run or {}).get("code_dir")
        old = await deploy.resolve_code_folder(helper, recorded) if isinstance(recorded, str) else None
        code_dir = await deploy.resolve_code_folder(helper, code_dir)
        last = None if code_dir else await deploy.last_deployed(helper)
        base = deploy.deployed_base(helper)
        plan = launching.restart_plan(trainer, run, code_dir, old_folder=old, last=last, base=base)
        with contextlib.suppress(PlaceError):  # a job by id: the relaunch itself says why it cannot
            batch = self.place.submit(
                plan.argv, log=posixpath.join(plan.run_dir, "train.log"), cwd=plan.cwd or "~"
            )
            if batch is not None:
                said = f"{shlex.join(batch[:3])} ... (a new {self.place.describe})"
                plan = dataclasses.replace(plan, submitted_as=said)
        return plan, await restart_concerns(helper, plan, trainer, run), trainer

    async def restart_trainer(
        self,
        timeout: float = 120.0,
        on_phase=None,
        code_dir: str | None = None,
        wait_s: float = 300.0,
        on_startup=None,
        shown: launching.RestartPlan | None = None,
        trusted: tuple[str, ...] | list[str] = (),
    ) -> ActionResult:
        """Stop cleanly, then launch the same run (run.json) with ``--resume auto``: planned once
        (:meth:`plan_restart`), before anything is stopped; the stop survives a dropped link (_stop).
        What only run.json vouches for (console/core/restart_trust.py) is refused unless each such
        concern is in ``trusted`` (what the operator confirmed); a plan that is no longer ``shown`` (what
        the prompt showed) is refused too. The interpreter's preflight (deploy.preflight) runs before
        the stop."""
        helper = self._writable()
        phase = self._phase_fn(on_phase)
        try:  # refuse before stopping when it could not be launched again
            plan, concerns, trainer = await self.plan_restart(code_dir)
            if shown is not None and plan != shown:
                raise ControlError(
                    "what it would run changed after it was shown (run.json, or a new deployment); look again"
                )
            unconfirmed = [c for c in concerns if c not in trusted]
            if unconfirmed:
                return ActionResult(Outcome.ERROR, refusal(unconfirmed), self.trainer)
            await deploy.preflight(helper, plan.python, env=plan.env, cwd=plan.cwd)
        except ControlError as e:
            return ActionResult(e.outcome, f"not restarted, nothing was done: {e}", self.trainer)
        if trainer is not None:
            res = await self._stop(helper, trainer, timeout, phase, "SIGINT")
            if res.code != Outcome.OK:
                return ActionResult(res.code, f"not restarted: {res.message}", trainer)
            if self.trainer is trainer:
                self._set_trainer(None)
            trainer = None
            helper = self.need_helper()
            if helper.hello.get("slurm_job"):  # it ran inside the job that just ended: link again outside
                helper = await self._leave_job(helper, str(helper.hello["slurm_job"]))
        try:
            res = await launching.relaunch(
                helper,
                plan,
                check=False,
                wait_s=wait_s,
                on_status=lambda s: phase(ActionPhase(StopPhase.LAUNCHING, s, None, time.time())),
                on_startup=on_startup,
                place=self.place,
            )
        except ControlError as e:
            return ActionResult(e.outcome, str(e), trainer)
        except HelperGone as e:
            return ActionResult(
                Outcome.ERROR, f"the link dropped during the restart ({e}); check `status`", trainer
            )
        if res.code == Outcome.OK and res.trainer is not None:
            phase(ActionPhase(StopPhase.STARTED, res.message, None, time.time()))
            await self._adopt(res.trainer)
        return res

    async def _leave_job(self, helper: Helper, job: str, timeout: float = 60.0) -> Helper:
        """A helper that does not run inside ``job`` (a Slurm job that has ended with its trainer, taking
        its steps with it): the link is made again until the helper lands outside it (on the host, where
        a relaunch submits the next job). The last helper at ``timeout``; the relaunch then says why."""
        deadline = time.monotonic() + timeout
        while helper.hello.get("slurm_job") == job and time.monotonic() < deadline:
            await helper.close()
            while (self.helper is None or self.helper is helper) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            helper = self.helper or helper
            if helper.hello.get("slurm_job") == job:
                await asyncio.sleep(0.5)  # the job is still ending: squeue still shows it running
        return helper

    async def prefill_concerns(
        self, python: str | None, code_dir: str | None, run: dict | None = None
    ) -> list[str]:
        """Why the launch dialog's run.json values (``python``, ``code_dir``; None: not run.json's) need
        a typed ``trust`` (restart_trust.prefill_concerns, the restart's rules)."""
        helper = self._writable()
        code = await deploy.resolve_code_folder(helper, code_dir)
        return await prefill_concerns(helper, python, code, run or self.run)

    async def launch(
        self,
        flags: list[str],
        python: str = "python3",
        code_dir: str | None = None,
        env: dict[str, str] | None = None,
        wait_s: float = 300.0,
        on_status: Callable[[str], None] | None = None,
        on_startup: Callable[[dict], None] | None = None,
        serve_accepted: Collection[str] | bool = False,
    ) -> ActionResult:
        """Start the trainer with ``flags`` (see launching.launch); never raises for a refusal. The
        train/serve check runs against :attr:`serve` (console/core/serve_check.py): its errors refuse the
        launch unless ``serve_accepted`` (True, or those lines) accepts them."""
        helper = self._writable()
        try:
            res = await launching.launch(
                helper,
                flags,
                run_dir=self.run_dir,
                python=python,
                code_dir=code_dir,
                env=env,
                wait_s=wait_s,
                on_status=on_status,
                on_startup=on_startup,
                place=self.place,
                serve_check=True,
                serve=self.serve,
                serve_accepted=serve_accepted,
            )
        except ControlError as e:
            return ActionResult(e.outcome, str(e), serve_check=getattr(e, "check", None))
        if res.trainer is not None:
            await self._adopt(res.trainer)
        return res

    async def _adopt(self, trainer: TrainerInfo) -> None:
        if trainer.run_dir and trainer.run_dir != self.run_dir:
            self.run_dir = trainer.run_dir
        self._set_trainer(trainer)
        if self.streams and self.run_dir != self._tails_dir:
            await self._attach_tails()

    def interpreter(self, python: str | None = None) -> str:
        """``python``, else the run's interpreter (run.json), else the session's: what a deploy checks with."""
        recorded = (self.run or {}).get("interpreter")
        return python or (recorded if isinstance(recorded, str) and recorded else None) or self.python

    async def deploy(self, python: str | None = None) -> str:
        """Copy the bundled trainer into a new versioned code dir in the container; returns it. Its check
        compiles it with :meth:`interpreter`."""
        helper = self._writable()
        return await deploy.deploy(helper, self.interpreter(python))

    async def sample_threads(self) -> dict:
        """One sample of the trainer's processes and threads (console/core/threads.py: Sampler makes
        CPU% of two); :class:`ThreadsError` when no trainer runs. Reads only: a read-only session may."""
        helper, trainer = self.need_helper(), self.trainer
        if trainer is None:
            raise ThreadsError(f"no trainer is running on {self.where}")
        return await threads.sample(helper, trainer, self.run_dir)

    async def pyspy_dump(self, pid: int, start_time: int | None = None) -> pyspy.Dump:
        """``py-spy dump`` of ``pid``, the trainer or one of its descendants (console/core/pyspy.py);
        it reads the process's memory and changes nothing, so a read-only session may."""
        helper, trainer = self.need_helper(), self.trainer
        if trainer is None:
            raise ThreadsError(f"no trainer is running on {self.where}")
        return await pyspy.dump(helper, trainer, pid, start_time, self.run_dir, configured=self.pyspy)

    async def read_log_tail(self, n: int) -> list[str]:
        """The last ``n`` lines of the run's train.log ([] without a run dir)."""
        return (await self.read_log_tail_at(n))[0]

    async def file_exists(self, path: str | None) -> bool:
        """Whether ``path`` is a regular file in the place (False for None, a folder, an unreadable one)."""
        if not path:
            return False
        try:
            st = await self.need_helper().stat(path)
        except HelperError:
            return False
        return bool(st.get("exists")) and bool(st.get("is_file"))

    async def read_log_tail_at(self, n: int) -> tuple[list[str], int]:
        """(the last ``n`` complete lines of train.log, the byte offset just after them): ``follow``
        the log from that offset to go on without a gap. ([], 0) without a run dir."""
        helper = self.need_helper()
        if not self.log_path:
            return [], 0
        return await remote_files.tail_lines_at(helper, self.log_path, n)

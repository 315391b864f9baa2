"""Launching the trainer through the helper (detached, then followed to its ``started`` or first step),
and a restart: planned once, before anything is stopped (:class:`RestartPlan`), then relaunched."""

from __future__ import annotations

import asyncio
import posixpath
import shlex
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from console.core.control_error import ControlError
from console.core.deploy import code_folder, deploy, is_deployed_path, preflight, resolve_code_folder
from console.core.events import ActionResult, Outcome, TrainerInfo
from console.core.finding import find_trainer
from console.core.helper import Helper
from console.core.metrics import MetricsParser
from console.core.place import HOST, Place, PlaceError
from console.core.remote_files import file_size, tail_lines
from console.core.restart_env import passed_env
from console.core.serve_check import ServeCheck, refusal, skipped
from console.core.serve_check import run as run_serve_check
from console.core.serving import Endpoint
from console.core.streams import FileTail
from console.core.trainer_argv import TRAINER_MODULE, flag_value, resolve, set_flag


def pythonpath(code_dir: str, recorded: str | None, *old_code_dirs: str | None) -> str:
    """PYTHONPATH with ``code_dir`` first, the recorded entries after it (the old code dir removed, as
    each of ``old_code_dirs`` names it)."""
    drop = {posixpath.normpath(d) for d in (code_dir, *old_code_dirs) if d}
    parts = [p for p in (recorded or "").split(":") if p and posixpath.normpath(p) not in drop]
    return ":".join([code_dir, *parts])


def _launch_dir(flags: list[str], run_dir: str | None, cwd: str) -> tuple[list[str], str]:
    """(the flags, with ``--output-dir`` added when only ``run_dir`` names it; the run dir, resolved)."""
    out = flag_value(flags, "--output-dir")
    if out is None and run_dir is None:
        raise ControlError("no run dir: give --output-dir in the trainer flags (or --run-dir)", Outcome.USAGE)
    if out is None:
        flags = [*flags, "--output-dir", run_dir]
        out = run_dir
    rd = resolve(out, cwd)
    if run_dir is not None and resolve(run_dir, cwd) != rd:
        raise ControlError(
            f"--run-dir {run_dir!r} and the trainer's --output-dir {out!r} differ", Outcome.USAGE
        )
    return flags, rd


async def launch(
    helper: Helper,
    flags: list[str],
    *,
    run_dir: str | None = None,
    python: str = "python3",
    code_dir: str | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    wait_s: float = 300.0,
    on_status: Callable[[str], None] | None = None,
    on_startup: Callable[[dict], None] | None = None,
    check: bool = True,
    place: Place = HOST,
    serve_check: bool = False,
    serve: Endpoint | None = None,
    serve_accepted: Collection[str] | bool = False,
) -> ActionResult:
    """Start ``python -m trainer.pipeline FLAGS`` detached and wait for its ``started`` event. Where
    ``place`` hands it to a scheduler (a Slurm job: :meth:`Place.submit`) the job is submitted instead.

    ``code_dir`` is the folder that holds the ``trainer`` package (:func:`code_folder`); without it the
    bundled trainer is deployed. With ``check`` it first runs :func:`preflight` with the launch's
    interpreter, env and cwd (a restart that ran it before stopping passes ``check=False``).

    With ``on_startup``, it waits on for the ``first_step`` event instead, and hands every start-up record
    (``started``, ``startup``, ``first_step``; docs/run-directory.md) to it as it arrives: a trainer that
    exits before its first step is then an error too.

    With ``serve_check``, once the code is in place it runs the train/serve check of ``flags`` against
    ``serve`` (console/core/serve_check.py; skipped, and said, without ``serve``) and refuses (code 1) when
    it fails with an error line not in ``serve_accepted`` (True: any); its lines go to ``on_status``.

    Refuses (code 1) when a live trainer owns the run dir; on an early exit the message holds the
    tail of train.log. ``run_dir`` defaults to the flags' ``--output-dir``; when both are given they
    must name the same directory (code 2 otherwise).
    """
    say = on_status or (lambda s: None)
    cwd = cwd or helper.home
    try:  # a place that cannot take a launch (a Slurm job named by id) says so before anything is done
        place.check_launch()
    except PlaceError as e:
        raise ControlError(str(e), Outcome.USAGE) from None
    flags, rd = _launch_dir(list(flags), run_dir, cwd)
    live, _ = await find_trainer(helper, rd)
    if live is not None:
        raise ControlError(f"refused: a live trainer (pid {live.pid}) owns {rd}; stop it first")
    env = dict(env or {})
    code_dir = await resolve_code_folder(helper, code_dir)
    if check:
        pre = {**env, "PYTHONPATH": pythonpath(code_dir, env.get("PYTHONPATH"))} if code_dir else env
        await preflight(helper, python, env=pre, cwd=cwd)
    if code_dir is None:
        say("deploying the bundled trainer")
        code_dir = await deploy(helper, python, check=False)
    env["PYTHONPATH"] = pythonpath(code_dir, env.get("PYTHONPATH"))
    env.setdefault("PYTHONUNBUFFERED", "1")
    checked = None
    if serve_check:
        checked = await _serve_check(helper, flags, serve, python, env, cwd, serve_accepted, say)
    metrics = posixpath.join(rd, "metrics.jsonl")
    log = posixpath.join(rd, "train.log")
    await helper.call("mkdir", path=rd)
    follower, events = _event_tail(metrics, await file_size(helper, metrics))
    argv = [python, "-m", TRAINER_MODULE, *flags]
    say(f"starting {shlex.join(argv)}")
    batch = place.submit(argv, log=log, cwd=cwd)
    if batch is not None:
        pid, sp, waiter = None, {}, await _submit(helper, place, batch, env, cwd, say)
    else:
        sp = await helper.call("spawn", argv=argv, cwd=cwd, env=env, log=log)
        pid = int(sp["pid"])
        # the spawned process itself (pid + start time): its command line may change (an interpreter shim)
        waiter = asyncio.ensure_future(helper.call("wait_exit", pid=pid, start_time=sp.get("start_time")))
    follower.attach(helper)
    try:
        await _await_start(helper, pid, waiter, follower, events, log, wait_s, on_startup, say)
    finally:
        if not waiter.done():
            waiter.cancel()
        await follower.detach()
    trainer, _ = await find_trainer(helper, rd)
    if trainer is None and pid is None:
        raise ControlError(f"the job's trainer started but no live trainer owns {rd} now")
    if trainer is None:
        info = await helper.proc(pid)
        trainer = TrainerInfo(
            pid, int(sp.get("start_time") or 0), (info or {}).get("cmdline", argv), rd, "cmdline", None
        )
    said = f"; serve check {checked.summary}" if checked is not None and checked.state != "skipped" else ""
    msg = f"launched pid {trainer.pid} in {rd} (code {code_dir}){said}"
    return ActionResult(Outcome.OK, msg, trainer, serve_check=checked)


class ServeCheckRefused(ControlError):
    """A launch refused by its train/serve check: ``check`` says what failed."""

    OVERRIDE = '--skip-serve-check (the launch dialog: type "serve")'

    def __init__(self, check: ServeCheck) -> None:
        super().__init__(refusal(check, self.OVERRIDE))
        self.check = check


async def _serve_check(
    helper: Helper,
    flags: list[str],
    serve: Endpoint | None,
    python: str,
    env: dict[str, str],
    cwd: str,
    accepted: Collection[str] | bool,
    say: Callable[[str], None],
) -> ServeCheck:
    """Run the train/serve check (or say it is skipped); :class:`ServeCheckRefused` when it blocks."""
    if serve is None:
        check = skipped()
    else:
        say(f"checking the flags against {serve.kind}'s serving rules (python -m trainer.serve_check)")
        check = await run_serve_check(helper, flags, serve, python=python, env=env, cwd=cwd)
    if check.blocks(accepted):
        raise ServeCheckRefused(check)
    for line in check.lines():
        say(line)
    return check


async def _submit(
    helper: Helper, place: Place, batch: list[str], env: dict[str, str], cwd: str, say: Callable[[str], None]
) -> asyncio.Future:
    """Hand the trainer to the place's scheduler (``batch``: :meth:`Place.submit`, run where the helper is)
    and return a future that resolves when the job has ended (its trainer's pid is known only from its
    started event)."""
    r = await helper.call("run", argv=batch, cwd=cwd, env=env, timeout=60)
    job = place.submitted(str(r.get("stdout") or ""))
    if r.get("rc") != 0 or job is None:
        said = (str(r.get("stderr") or "") or str(r.get("stdout") or "")).strip()[-400:]
        raise ControlError(f"{shlex.join(batch[:3])} ... failed (exit {r.get('rc')}): {said or 'no output'}")
    say(f"submitted {place.NOUN} {job}")
    return asyncio.ensure_future(_job_ended(helper, place, job))


async def _job_ended(helper: Helper, place: Place, job: str, poll_s: float = 1.0) -> dict:
    """Returns (as ``wait_exit`` does) once the scheduler no longer shows ``job`` as live."""
    while True:
        r = await helper.call("run", argv=place.job_argv(job), timeout=30)
        state = place.state(str(r.get("stdout") or "")) if r.get("rc") == 0 else None
        if r.get("rc") == 0 and place.ended(state):
            return {"exited": True, "rc": None, "job_state": (state or {}).get("state") or "gone"}
        await asyncio.sleep(poll_s)


def _event_tail(path: str, offset: int) -> tuple[FileTail, asyncio.Queue[dict]]:
    """A tail of metrics.jsonl from ``offset`` and the queue its ``event`` records go to."""
    parser = MetricsParser()
    queue: asyncio.Queue[dict] = asyncio.Queue()

    def on_data(data: bytes) -> None:
        for rec in parser.feed(data):
            if rec.get("kind") in ("event", "startup"):  # startup: launch's progress (StopFollow ignores it)
                queue.put_nowait(rec)

    return FileTail(path, offset, on_data, interval=0.05), queue


async def _await_start(
    helper: Helper,
    pid: int | None,
    waiter: asyncio.Future,
    follower: FileTail,
    events: asyncio.Queue[dict],
    log: str,
    wait_s: float,
    on_startup: Callable[[dict], None] | None,
    say: Callable[[str], None],
) -> None:
    """Wait for the spawned trainer's ``started`` event (``first_step`` with ``on_startup``, which gets
    every start-up record); :class:`ControlError` when it exits first; at ``wait_s`` it is left running."""
    deadline = time.monotonic() + wait_s
    while True:
        getter = asyncio.ensure_future(events.get())
        done, _ = await asyncio.wait(
            [waiter, getter],
            timeout=max(0.0, deadline - time.monotonic()),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if not getter.done():
            getter.cancel()
        if getter in done:
            ev = getter.result()
            name = ev.get("name") if ev.get("kind") == "event" else ev.get("phase")
            if on_startup is not None and (ev.get("kind") == "startup" or name == "started"):
                on_startup(ev)
            if name == "started" and (pid is None or ev.get("pid") in (pid, None)) and on_startup is None:
                return
            if name == "first_step" and ev.get("kind") == "startup" and on_startup is not None:
                return
            continue
        if waiter in done:
            await follower.drain()
            started = False
            while not events.empty():
                started |= events.get_nowait().get("name") == "started"
            rc = waiter.result().get("rc")
            tail = "\n".join(await tail_lines(helper, log, 30))
            raise ControlError(
                f"the trainer exited during start-up (exit code {rc}; "
                f"{'after' if started else 'before'} its started event). "
                f"Last lines of {log}:\n{tail}"
            )
        say(f"{f'pid {pid}' if pid else 'the job'} still starting after {wait_s:.0f} s; leaving it running")
        return


@dataclass(frozen=True)
class RestartPlan:
    """What a restart launches (:func:`restart_plan`): run.json's interpreter, cwd, env and argv with
    ``--resume auto``, and the code dir ``code_from`` chose: ``given`` (``--code-dir``), ``deployed`` (the
    last deployment to this place, :func:`deploy.last_deployed`) or ``run.json``; ``code_why`` says why,
    for the prompt. ``dropped``: run.json's env names never passed on (test hooks: restart_trust.py)."""

    flags: list[str]
    python: str
    cwd: str | None
    code_dir: str | None
    env: dict[str, str]
    run_dir: str
    code_from: str = "run.json"
    code_why: str = "run.json"
    dropped: tuple[str, ...] = ()
    submitted_as: str | None = None  # where a scheduler takes it (a Slurm job): how it is submitted

    @property
    def code_given(self) -> bool:
        """The code dir is not run.json's word: the operator's ``--code-dir`` or a verified deployment."""
        return self.code_from != "run.json"

    @property
    def argv(self) -> list[str]:
        return [self.python, "-m", TRAINER_MODULE, *self.flags]

    def lines(self) -> list[str]:
        """What it will run, for a prompt: interpreter, code directory, cwd, env and the command."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return [
            f"interpreter: {self.python}",
            "code directory: "
            + (
                f"{self.code_dir} ({self.code_why})"
                if self.code_dir
                else "(none: the bundled trainer is deployed first)"
            ),
            f"working directory: {self.cwd or '(the home directory)'}",
            f"environment: {env or '(none)'}",
            *([f"not passed on (test hooks): {' '.join(self.dropped)}"] if self.dropped else []),
            f"command: {shlex.join(self.argv)}",
            *([f"submitted as: {self.submitted_as}"] if self.submitted_as else []),
        ]


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t)) if t > 0 else "time unknown"


def choose_code(
    given: str | None, old: str | None, last: tuple[str, float] | None, base: str
) -> tuple[str | None, str, str]:
    """(code dir, code_from, code_why) of a restart: the operator's ``given`` one; else the last
    deployment to this place (``last``: dir, time) when run.json's code dir ``old`` is a deployed one
    (``base/HASH``) or absent; else run.json's (a checkout of the user's own is not swapped for the
    bundled trainer; the prompt names the newer deployment and ``--code-dir`` for it)."""
    if given:
        return given, "given", "given"
    if last is not None and (old is None or is_deployed_path(old, base)):
        if old is not None and posixpath.normpath(old) == last[0]:
            return old, "deployed", f"deployed last: {_when(last[1])}; run.json's too"
        was = f"; run.json had {old}" if old else ""
        return last[0], "deployed", f"deployed last: {_when(last[1])}{was}"
    if last is not None and old is not None:
        return old, "run.json", f"run.json: the run's own code; the last deployment is --code-dir {last[0]}"
    return old, "run.json", "run.json"


def restart_plan(
    trainer: TrainerInfo | None,
    run: dict | None,
    code_dir: str | None = None,
    old_folder: str | None = None,
    last: tuple[str, float] | None = None,
    base: str = "",
) -> RestartPlan:
    """The one planning pass of a restart, before anything is stopped: the run.json of ``trainer`` (else
    ``run``, the run dir's) made into what the relaunch starts: its interpreter, cwd, env and argv +
    ``--resume auto``, the code dir :func:`choose_code` picks (``code_dir``: the operator's; ``last``: the
    last deployment under ``base``). :class:`ControlError` when there is no run.json (``NO_TRAINER``
    without a trainer; a trainer found by its command line only cannot be restarted) or it cannot be
    launched again. ``old_folder``: run.json's ``code_dir`` as :func:`resolve_code_folder` found it in the
    container (default: :func:`code_folder` of it). Test hooks in run.json's env are dropped
    (:func:`restart_env.passed_env`)."""
    run = (trainer.run if trainer and trainer.run else None) or run
    if run is None:
        if trainer is not None:
            raise ControlError(
                "restart needs the trainer's run.json (this one was found by its command "
                "line only): stop it, then launch"
            )
        raise ControlError("no trainer and no run.json to restart from", Outcome.NO_TRAINER)
    for key in ("interpreter", "argv", "output_dir"):
        if key not in run:
            raise ControlError(f"run.json has no {key!r}; cannot restart the same run")
    recorded = run.get("code_dir") if isinstance(run.get("code_dir"), str) else None
    old = old_folder or code_folder(recorded)
    new, code_from, why = choose_code(code_folder(code_dir), old, last, base)
    env, dropped = passed_env(run.get("env"))
    if new:
        env["PYTHONPATH"] = pythonpath(new, env.get("PYTHONPATH"), old, recorded)
    return RestartPlan(
        flags=set_flag(list(run["argv"]), "--resume", "auto"),
        python=run["interpreter"],
        cwd=run.get("cwd"),
        code_dir=new,
        env=env,
        run_dir=run["output_dir"],
        code_from=code_from,
        code_why=why,
        dropped=dropped,
    )


async def relaunch(
    helper: Helper,
    plan: RestartPlan,
    *,
    wait_s: float = 300.0,
    on_status: Callable[[str], None] | None = None,
    on_startup: Callable[[dict], None] | None = None,
    check: bool = True,
    place: Place = HOST,
) -> ActionResult:
    """Launch ``plan`` (the second half of a restart, once the old trainer stopped)."""
    res = await launch(
        helper,
        plan.flags,
        run_dir=plan.run_dir,
        python=plan.python,
        code_dir=plan.code_dir,
        env=plan.env,
        cwd=plan.cwd,
        wait_s=wait_s,
        on_status=on_status,
        on_startup=on_startup,
        check=check,
        place=place,
    )
    return ActionResult(res.code, "restarted: " + res.message, res.trainer)

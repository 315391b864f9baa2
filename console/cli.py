"""``dflash-console``: status, launch, deploy, stop, restart and logs of a remote trainer; connect; demo.

    dflash-console status|launch|deploy|stop|restart|logs|threads TARGET [PLACE] [-p PORT] [-l USER] [-i KEY]
        [-F CONFIG] [-J JUMP] [--known-hosts FILE] [--run-dir DIR]

PLACE is where the trainer lives on the host (console/core/places/, docs/runtimes.md): --ct N,
--lxc [LXCPATH/]NAME, --docker|--podman [USER@][CONTEXT/]NAME, --pod [NAMESPACE/]POD[:CONTAINER], --slurm JOB.

TARGET is [user@]host or a name of the config file's [targets] (console/core/targets.py).

Exit codes: 0 done (stop: the trainer exited after saving); 1 other errors, a declined confirmation;
2 bad usage (also: a target that names several runs, an unknown name); 3 still running at the
timeout; 4 no trainer; 5 refused (the PID is no longer that trainer, or it ignores SIGINT); 6 the trainer exited without a
checkpoint_saved; 7 refused: the target is read-only in the config. docs/cli.md has the details.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shlex
import socket
import sys
import time
from collections.abc import Collection

from console import __version__, cli_serve
from console.cli_exit import (  # noqa: F401  (the exit codes are part of this module's interface)
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NO_CHECKPOINT,
    EXIT_NO_TRAINER,
    EXIT_OK,
    EXIT_READONLY,
    EXIT_REFUSED,
    EXIT_STILL_RUNNING,
    EXIT_USAGE,
    err,
    exit_code,
)
from console.cli_record import cmd_record_logs, cmd_record_status, cmd_replay, is_record
from console.cli_threads import add_threads_parser, cmd_threads
from console.core import json_out
from console.core.control_error import ControlError
from console.core.deploy import bundled_trainer_files
from console.core.events import ActionPhase, ActionResult, ConnState, Outcome
from console.core.finding import visible_trainers
from console.core.options import options_from_args
from console.core.phases import FAILED, StopPhase
from console.core.place import KINDS
from console.core.startup_fold import StartupPrinter
from console.core.trainer_argv import flag_value


def _conn_flags(p: argparse.ArgumentParser, run_dir: bool = True, multi: bool = False) -> None:
    if multi:
        p.add_argument(
            "host",
            metavar="TARGET",
            nargs="+",
            help="[user@]host as for ssh, or a name of the config file's [targets]; several for several runs",
        )
    else:
        p.add_argument(
            "host",
            metavar="TARGET",
            help="[user@]host as for ssh (Host aliases of ~/.ssh/config work), or a name of the config "
            "file's [targets]; one run",
        )
    g = p.add_argument_group("connection (as ssh)")
    for kind in KINDS:  # where the trainer lives: one flag a runtime (console/core/places/)
        g.add_argument(
            kind.FLAG,
            type=kind.TYPE,
            metavar=kind.METAVAR,
            action="append",
            help=kind.HELP + ("; repeat for several of the host" if multi else ""),
        )
    g.add_argument("-p", dest="port", type=int, metavar="PORT", help="ssh port")
    g.add_argument("-l", dest="user", metavar="USER", help="login user")
    g.add_argument(
        "-i", dest="identity", action="append", default=[], metavar="KEY", help="identity (key) file"
    )
    g.add_argument("-F", dest="config", metavar="CONFIG", help="ssh config file (default ~/.ssh/config)")
    g.add_argument("-J", dest="jump", metavar="JUMP", help="jump host(s): [user@]host[:port][,...]")
    g.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="known_hosts to check the host key against "
        "(default ~/.ssh/known_hosts; unknown or changed keys are refused)",
    )
    if run_dir:
        p.add_argument("--run-dir", metavar="DIR", help="the trainer's run directory (its --output-dir)")


DETACH = "--detach"
TRUST = "--trust-run-json"
DETACH_HELP = "return once the trainer has written its started event (no start-up progress to the first step)"


def _startup_printer(args):
    """The start-up progress of launch/restart (console/core/startup_fold.py), None with --detach."""
    if getattr(args, "detach", False):
        return None
    return StartupPrinter(sys.stdout, time.time)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-console",
        description="Drive a DFlash trainer on a remote host (or in a Proxmox container) over one SSH connection.",
        epilog="Exit codes: 0 ok; 1 error or declined; 2 usage; 3 still running at timeout; 4 no trainer; "
        "5 refused (PID no longer the trainer, or it ignores SIGINT); 6 exited without a saved checkpoint; 7 the target is read-only.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("status", help="show the trainer, its progress, the GPUs")
    _conn_flags(p, multi=True)
    p.add_argument(
        "--json", action="store_true", help="print one JSON object (an array of them for several runs)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="health check for monitoring: one line; exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN",
    )

    p = sub.add_parser(
        "launch",
        help="start the trainer: launch TARGET [options] -- TRAINER_FLAGS",
        usage="dflash-console launch TARGET [options] -- TRAINER_FLAGS",
    )
    _conn_flags(p)
    p.add_argument(
        "--python",
        default="python3",
        metavar="PATH",
        help="remote interpreter, with torch and transformers (default python3)",
    )
    p.add_argument(
        "--code-dir",
        metavar="DIR",
        help="remote code dir: the folder that holds the trainer package (default: deploy the bundled one)",
    )
    p.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="environment for the trainer"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=300.0,
        metavar="S",
        help="wait for its first step (started with --detach) (300)",
    )
    p.add_argument(DETACH, action="store_true", help=DETACH_HELP)
    cli_serve.add_launch_args(p)

    p = sub.add_parser(
        "deploy",
        help="copy the bundled trainer into a new versioned code dir, compile-checked; "
        "checks the interpreter imports torch and transformers",
    )
    _conn_flags(p)
    p.add_argument(
        "--python",
        metavar="PATH",
        help="remote interpreter for the checks (default: the run's, from run.json with --run-dir; else python3)",
    )

    for name, what in (
        ("stop", "stop cleanly: SIGINT, wait for the checkpoint and the exit"),
        ("restart", "stop cleanly, then launch the same run with --resume auto"),
    ):
        p = sub.add_parser(name, help=what)
        _conn_flags(p)
        p.add_argument(
            "--timeout", type=float, default=120.0, metavar="S", help="give up waiting after S s (120)"
        )
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        if name == "restart":
            p.add_argument(
                "--code-dir",
                metavar="DIR",
                help="relaunch with this code dir, the folder that holds the trainer package "
                "(default: the last deployment to this place when run.json's is a deployed one, else run.json's)",
            )
            p.add_argument(
                "--wait", type=float, default=300.0, metavar="S", help="wait for the first step (300)"
            )
            p.add_argument(DETACH, action="store_true", help=DETACH_HELP)
            p.add_argument(
                TRUST,
                action="store_true",
                help="also run what only run.json vouches for (a code dir outside the deployed ones, "
                "another interpreter, extra env): --yes alone does not",
            )

    p = sub.add_parser("logs", help="print the trainer's train.log")
    _conn_flags(p)
    p.add_argument("-f", dest="follow", action="store_true", help="follow (across reconnects) until Ctrl-C")
    p.add_argument("-n", dest="lines", type=int, default=50, metavar="N", help="last N lines (50)")
    add_threads_parser(sub, _conn_flags)

    p = sub.add_parser("connect", help="open the operator screen (an overview first for several runs)")
    _conn_flags(p, multi=True)
    p.add_argument("--readonly", action="store_true", help="hide every action that changes the remote")
    p.add_argument("--serve", type=cli_serve.endpoint_arg, metavar="KIND:PORT", help=cli_serve.SERVE_HELP)
    p.add_argument(
        "--record",
        metavar="FILE",
        help="write what the screen receives to FILE (gzip JSON lines) for `dflash-console replay`",
    )
    p.add_argument(
        "--record-max-mb",
        type=float,
        default=256.0,
        metavar="MB",
        help="stop recording (and say so) at this compressed size (256)",
    )

    cli_serve.add_parser(sub, _conn_flags)

    p = sub.add_parser("replay", help="show a record (connect --record) again: offline, read-only")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--speed", type=float, default=1.0, metavar="N", help="N x real time (1)")
    p.add_argument(
        "--run", type=int, metavar="N", help="open run N's screen first (default: the overview for several)"
    )

    p = sub.add_parser("demo", help="the whole system on this machine: local SSH host, tiny trainer, screen")
    p.add_argument("--headless", action="store_true", help="no screen: print the status once a second")
    p.add_argument(
        "--dir",
        metavar="DIR",
        help="keep the demo's files here; a rerun resumes the run (default: a temp dir, removed at the end)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="N",
        help="port of the demo's SSH host on 127.0.0.1 (default: a free one)",
    )
    return parser


def _session(args: argparse.Namespace, **kw):
    from console.core.place import HOST, from_flags
    from console.core.session import Session

    target = getattr(args, "target", None)
    places = from_flags(vars(args))
    pyspy = getattr(args, "pyspy", None) or (target.pyspy if target is not None else None)
    return Session(
        target.options if target is not None else options_from_args(args),
        place=target.place if target is not None else (places[0] if places else HOST),
        run_dir=getattr(args, "run_dir", None),
        streams=False,
        telemetry=False,
        pyspy=pyspy,
        **kw,
    )


def env_from_pairs(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` flags as a dict."""
    env = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise ControlError(f"--env wants KEY=VALUE, got {p!r}", Outcome.USAGE)
        env[k] = v
    return env


# --- commands ---------------------------------------------------------------------------------------


def resolve_targets(args):
    """The runs the positionals name (console/core/targets.py); ConfigError for a bad config file."""
    from console.core.config_file import load
    from console.core.place import from_flags
    from console.core.targets import resolve

    base = options_from_args(argparse.Namespace(**{**vars(args), "host": "-"}))
    targets = resolve(
        list(args.host),
        base,
        places=from_flags(vars(args)) or None,
        run_dir=getattr(args, "run_dir", None),
        readonly=getattr(args, "readonly", False),
        config=load(),
    )
    serve = getattr(args, "serve", None)  # --serve: every run named here (else each entry's own)
    return [dataclasses.replace(t, serve=serve) for t in targets] if serve is not None else targets


ONE_RUN = ("launch", "deploy", "stop", "restart", "logs", "threads", "serve-status")
CHANGING = ("launch", "deploy", "stop", "restart")


def resolve_one_target(args):
    """The one run the positional names (a config name or HOST [--ct N]); ConfigError when it is not
    exactly one run or the config file is unusable."""
    from console.core.config_file import load
    from console.core.place import from_flags
    from console.core.targets import resolve_one

    base = options_from_args(argparse.Namespace(**{**vars(args), "host": "-"}))
    target, _named = resolve_one(
        args.host, base, places=from_flags(vars(args)), run_dir=getattr(args, "run_dir", None), config=load()
    )
    return target


def _readonly_refusal(args, target) -> int | None:
    """EXIT_READONLY with a message when ``target`` is read-only and the command changes the remote."""
    from console.core.config_file import config_path

    if args.command in CHANGING and target.readonly:
        err(
            f"{target.name} ({target.where}) is read-only (readonly = true in {config_path()}); "
            f"{args.command} refused, nothing was done"
        )
        return EXIT_READONLY
    return None


def _connect_failed(args, e: Exception) -> int:
    """A connection that failed: exit 2 when the target is neither a config name nor a host that
    resolves (most likely a misspelt name), else 1."""
    from console.core.config_file import ConfigError, config_path, load
    from console.core.targets import names

    given = args.host if isinstance(args.host, list) else [args.host]
    known: list[str] = []
    if isinstance(e.__cause__, socket.gaierror):
        with contextlib.suppress(ConfigError):
            known = names(load())
    unknown = [h for h in given if h not in known]
    if not isinstance(e.__cause__, socket.gaierror) or len(given) != 1 or not unknown:
        err(str(e))
        return EXIT_ERROR
    err(  # one message: the resolver's own words add nothing to it
        f"{unknown[0]!r} is neither a target of {config_path()} "
        f"({', '.join(known) if known else 'it names none'}) nor a host that resolves"
    )
    return EXIT_USAGE


def _single(args, target) -> None:
    """Point the one-run commands' flags at ``target`` (a config name or HOST --ct N)."""
    args.target = target
    args.run_dir = target.run_dir
    if hasattr(args, "readonly"):
        args.readonly = target.readonly


async def cmd_status(args) -> int:
    from console.core.config_file import ConfigError
    from console.core.status import collect, format_text

    if len(args.host) == 1 and is_record(args.host[0]):
        return cmd_record_status(args, args.host[0])
    try:
        targets = resolve_targets(args)
    except ConfigError as e:
        if getattr(args, "check", False):  # the monitoring convention: cannot look is UNKNOWN
            from console.core.check import UNKNOWN, line

            print(line("unknown", f"cannot check: {e}"))
            return UNKNOWN
        err(str(e))
        return EXIT_USAGE
    if len(targets) > 1:
        if getattr(args, "check", False):
            err(f"--check takes one run; {' '.join(args.host)} names {len(targets)}")
            return EXIT_USAGE
        return await cmd_status_many(args, targets)
    _single(args, targets[0])
    if getattr(args, "check", False):
        return await cmd_check(args)

    async with _session(args) as s:
        several = await several_trainers(args, s)
        if several is not None:
            return several
        st = await collect(s)
    if args.json:
        print(json_out.dumps(st))
    else:
        print(format_text(st))
    return EXIT_OK if st["trainer"] else EXIT_NO_TRAINER


async def several_trainers(args, s) -> int | None:
    """EXIT_USAGE, with the list, when no run dir was given and more than one run's trainer is
    visible on the target (a command must not pick one of them silently); else None."""
    if args.run_dir is not None:
        return None
    if s.place.state_argv() is not None:  # a scheduler's place (a Slurm job): its job names its run, or none
        return None
    found = await visible_trainers(s.need_helper())
    if len({t.run_dir for t in found}) < 2:
        return None
    err(f"{len(found)} trainers are running on {s.where}; say which with --run-dir:")
    for t in found:
        err(f"  pid {t.pid}  --run-dir {shlex.quote(t.run_dir or '?')}  ({shlex.join(t.cmdline)[:120]})")
    return EXIT_USAGE


async def cmd_status_many(args, targets) -> int:
    """One line per run (a JSON array with ``--json``); each target is looked at on its own, so an
    unreachable host is one line that says so and does not hold up the others."""
    from console.core.session import Session
    from console.core.status import collect, format_line

    async def one(t):
        try:
            async with Session(
                t.options, place=t.place, run_dir=t.run_dir, streams=False, telemetry=False
            ) as s:
                return await collect(s), None
        except Exception as e:  # noqa: BLE001 - said on its line; the other targets go on
            return None, str(e) or type(e).__name__

    results = await asyncio.gather(*(one(t) for t in targets))
    if args.json:
        out = []
        for t, (st, error) in zip(targets, results, strict=True):
            out.append({"target": t.title, "where": t.where, **(st or {"error": error})})
        print(json_out.dumps(out))
    else:
        for t, (st, error) in zip(targets, results, strict=True):
            print(format_line(f"{t.title} ({t.where})", st, error))
    if any(st is None for st, _ in results):
        return EXIT_ERROR
    return EXIT_OK if all(st["trainer"] for st, _ in results) else EXIT_NO_TRAINER


async def cmd_check(args) -> int:
    """``status --check``: the monitoring-plugin convention (console/core/check.py); anything that keeps
    the check from looking (connection, host key, config file) is UNKNOWN (3)."""
    from console.core.check import UNKNOWN, check, line
    from console.core.config_file import health_config

    try:
        cfg = health_config()
        key = bundled_trainer_files()[0]
        async with _session(args) as s:
            found = [] if args.run_dir is not None else await visible_trainers(s.need_helper())
            if len({t.run_dir for t in found}) > 1:  # which one is to be judged? never a silent pick
                dirs = ", ".join(f"pid {t.pid} {t.run_dir}" for t in found)
                raise ControlError(f"{len(found)} trainers are running ({dirs}); give --run-dir")
            code, text = await check(s, cfg, key)
    except Exception as e:  # noqa: BLE001 - every failure to look is UNKNOWN (ConfigError, connection...)
        code, text = UNKNOWN, line("unknown", f"cannot check: {e}")
    print(text)
    return code


async def cmd_deploy(args) -> int:
    async with _session(args) as s:
        t0 = time.monotonic()
        where = await s.deploy(python=args.python)
        python = s.interpreter(args.python)
    print(
        f"deployed the bundled trainer to {where} ({time.monotonic() - t0:.1f} s; compile-checked, and "
        f"{python} imports torch and transformers); launch with --python {shlex.quote(python)} "
        f"--code-dir {shlex.quote(where)} (launch deploys it by itself when --code-dir is not given); "
        "a restart of a run that runs deployed code runs this one (restart --code-dir DIR for another)"
    )
    return EXIT_OK


async def cmd_launch(args) -> int:
    flags = args.trainer_flags
    if not flags:
        err(
            "launch needs the trainer's flags after `--` (e.g. -- --target-model M --data-dir D --output-dir R)"
        )
        return EXIT_USAGE
    env = env_from_pairs(args.env)
    try:
        serve = cli_serve.launch_endpoint(args)
    except ValueError as e:  # EndpointError
        err(str(e))
        return EXIT_USAGE
    out = flag_value(flags, "--output-dir")
    if args.run_dir is None and out is not None:
        args.run_dir = out  # the session watches this run dir, not whatever trainer it finds first
    printer = _startup_printer(args)
    async with _session(args, serve=serve) as s:
        ticker = asyncio.ensure_future(printer.tick()) if printer is not None else None
        try:
            res = await s.launch(
                flags,
                python=args.python,
                code_dir=args.code_dir,
                env=env,
                wait_s=args.wait,
                on_status=lambda m: print(m, flush=True),
                on_startup=printer.on_record if printer is not None else None,
                serve_accepted=args.skip_serve_check,
            )
        finally:
            if ticker is not None:
                ticker.cancel()
                printer.end()
    return _report(res)


def _report(res: ActionResult, said: Collection[str] = ()) -> int:
    """The outcome, once: on stdout when it went well (unless a phase line ``said`` it already), else on
    stderr."""
    if res.code == Outcome.OK:
        if res.message not in said:
            print(res.message, flush=True)
    else:
        err(res.message)
    return exit_code(res.code)


def _ask(question: str) -> str | None:
    """The answer typed on the terminal (stripped); None when there is no terminal to ask on."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    sys.stderr.write(question + " ")
    sys.stderr.flush()
    return sys.stdin.readline().strip()


def _confirm(question: str) -> bool | None:
    """True/False from the terminal; None when there is no terminal to ask on."""
    answer = _ask(question + " [y/N]")
    return None if answer is None else answer.lower() in ("y", "yes")


class Countdown:
    """Prints the stop phases; on a terminal it also redraws a live line with the seconds."""

    def __init__(self, timeout: float, stream=None) -> None:
        self.timeout = timeout
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()
        self.phase: ActionPhase | None = None
        self.phase_t = self.t0
        self._last_plain = self.t0
        self.said: list[str] = []  # the phases' details printed
        self.failure: ActionPhase | None = None  # a refusal, timeout or error: the outcome says it

    def on_phase(self, ph: ActionPhase) -> None:
        self.phase = ph
        self.phase_t = time.monotonic()
        if StopPhase.of(ph.phase) in FAILED:  # said once, on stderr, with the outcome
            self.failure = ph
            return
        self.said.append(ph.detail)
        extra = f" (expected {ph.expected_s:.1f} s)" if ph.expected_s is not None else ""
        self._line(f"[{ph.phase}] {ph.detail}{extra}", newline=True)

    def _line(self, text: str, newline: bool) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text + ("\n" if newline else ""))
        elif newline:
            self.stream.write(text + "\n")
        self.stream.flush()

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(0.2 if self.tty else 1.0)
            ph = self.phase
            if ph is None or ph.phase in (StopPhase.EXITED, StopPhase.TIMEOUT, StopPhase.REFUSED):
                continue
            now = time.monotonic()
            left = self.timeout - (now - self.t0)
            in_phase = now - self.phase_t
            if ph.phase == StopPhase.SAVING and ph.expected_s is not None:
                msg = f"  saving: {in_phase:.1f} s of ~{ph.expected_s:.1f} s"
            else:
                msg = f"  {ph.phase}: {in_phase:.1f} s"
            msg += f"; timeout in {max(0.0, left):.0f} s"
            if self.tty:
                self._line(msg, newline=False)
            elif now - self._last_plain >= 10:
                self._last_plain = now
                self._line(msg, newline=True)


async def cmd_stop(args) -> int:
    async with _session(args) as s:
        several = await several_trainers(args, s)
        if several is not None:
            return several
        tr = s.trainer
        if tr is None:
            return _report(await s.stop_trainer(timeout=args.timeout))  # 4, or 5 for a stale run.json pid
        print(f"trainer pid {tr.pid} ({tr.source}) in {tr.run_dir or '?'}\n  {shlex.join(tr.cmdline)}")
        refused = _confirmed(args, "stop", [])
        if refused is not None:
            return refused
        return await _with_countdown(args, lambda on_phase, _: s.stop_trainer(args.timeout, on_phase))


async def cmd_restart(args) -> int:
    """Stop cleanly, then launch run.json's command with --resume auto: what it will run is shown
    first; what only run.json vouches for needs --trust-run-json (or a typed ``trust``) besides --yes."""
    async with _session(args) as s:
        several = await several_trainers(args, s)
        if several is not None:
            return several
        if s.trainer is None and not (s.run_dir and s.run):
            return _report(await s.stop_trainer(timeout=args.timeout))  # 4, or 5 for a stale run.json pid
        try:
            plan, concerns, tr = await s.plan_restart(args.code_dir)
        except ControlError as e:
            err(f"not restarted, nothing was done: {e}")
            return exit_code(e.outcome)
        if tr is not None:
            print(f"trainer pid {tr.pid} ({tr.source}) in {tr.run_dir or '?'}\n  {shlex.join(tr.cmdline)}")
            print("then it launches again (run.json, --resume auto):")
        else:
            print(
                f"no trainer running; will launch the run of {plan.run_dir} again (run.json, --resume auto):"
            )
        for ln in plan.lines():
            print(f"  {ln}")
        refused = _confirmed(args, "restart", concerns)
        if refused is not None:
            return refused

        def run(on_phase, on_startup):
            return s.restart_trainer(
                timeout=args.timeout,
                on_phase=on_phase,
                code_dir=args.code_dir,
                wait_s=args.wait,
                on_startup=on_startup,
                shown=plan,
                trusted=concerns,
            )

        return await _with_countdown(args, run, _startup_printer(args))


def _confirmed(args, verb: str, concerns: list[str]) -> int | None:
    """None when the action may go on: confirmed on the terminal or by --yes, and each concern (what only
    run.json vouches for) by --trust-run-json or a typed ``trust``; else the exit code, said why."""
    if not args.yes:
        ok = _confirm(f"{verb} it?")
        if ok is None:
            err(f"refusing to {verb} without --yes: no terminal to ask on")
            return EXIT_ERROR
        if not ok:
            err(f"not confirmed; nothing was done ({verb})")
            return EXIT_ERROR
    if not concerns:
        return None
    print("needs its own confirmation (only run.json vouches for it):")
    for c in concerns:
        print(f"  ! {c}")
    if getattr(args, "trust_run_json", False):
        return None
    typed = _ask('type "trust" to run it anyway:')
    if typed is None:
        err(f"refusing to {verb}: this needs {TRUST} (--yes does not cover it); nothing was done")
        return EXIT_ERROR
    if typed != "trust":
        err(f"not confirmed; nothing was done ({verb})")
        return EXIT_ERROR
    return None


async def _with_countdown(args, action, printer=None) -> int:
    """Run ``action(on_phase, on_startup)`` with the stop's countdown line and, for a restart, the
    start-up printer once the stop is over."""
    cd = Countdown(args.timeout)
    ticker = asyncio.ensure_future(cd.tick())

    def on_startup(rec: dict) -> None:
        ticker.cancel()  # the stop is over: the start-up line takes the terminal
        printer.on_record(rec)

    try:
        res = await action(cd.on_phase, on_startup if printer is not None else None)
        if printer is not None:
            printer.end()
    finally:
        ticker.cancel()
        if cd.tty:
            cd._line("", newline=False)
    failure = cd.failure
    # the failure's own words, unless the outcome already holds them (the trainer's error, say)
    own = failure.detail.removeprefix("trainer reported an error: ") if failure is not None else ""
    if own and own not in res.message:
        err(failure.detail)
    return _report(res, said=cd.said)


async def cmd_logs(args) -> int:
    from console.core.streams import LineSplitter

    if is_record(args.host):
        return cmd_record_logs(args, args.host)
    async with _session(args) as s:
        several = await several_trainers(args, s)
        if several is not None:
            return several
        if not s.run_dir:
            err(f"no run dir: no trainer found on {s.where}; give --run-dir")
            return EXIT_NO_TRAINER
        lines, end = await s.read_log_tail_at(args.lines)
        for ln in lines:
            print(ln)
        sys.stdout.flush()
        missing = not lines and end == 0 and not await s.file_exists(s.log_path)
        if missing:  # the user's own script, say: its output is where it was started, not here
            err(f"no {s.log_path}: the console reads the log a trainer keeping docs/run-directory.md writes")
        if not args.follow:
            return EXIT_ERROR if missing else EXIT_OK
        split = LineSplitter()
        done = asyncio.Event()  # set when the reader goes away (`logs -f | head`); else until Ctrl-C

        def on_data(data: bytes) -> None:
            if done.is_set():
                return
            try:
                for ln in split.feed(data):
                    print(ln)
                sys.stdout.flush()
            except BrokenPipeError:
                done.set()

        tail = s.follow(s.log_path, end, on_data)  # across reconnects, from the offset received

        def on_event(ev) -> None:
            if isinstance(ev, ConnState) and ev.state == "reconnecting":
                err(f"{ev.detail} in {ev.retry_in:.1f} s")

        s.subscribe(on_event)
        try:
            await done.wait()
        finally:
            await s.unfollow(tail)
    return EXIT_OK


def cmd_connect(args) -> int:
    """The operator screen on a session built from the connection flags."""
    from console.app import ConsoleApp
    from console.core.config_file import ConfigError, health_config
    from console.core.session import Session
    from console.screens.health_hooks import HealthHooks

    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        err("connect: the screen needs a terminal; without one use `status`, `logs -f` or `status --check`")
        return EXIT_USAGE
    try:
        hooks = HealthHooks(health_config(), bundled_trainer_files()[0])
    except ConfigError as e:
        err(str(e))
        return EXIT_USAGE
    try:
        targets = resolve_targets(args)
    except ConfigError as e:
        err(str(e))
        return EXIT_USAGE
    recorder = None
    if args.record:
        from console.core.record import Recorder

        try:
            recorder = Recorder(
                args.record,
                [{"label": t.title, "where": t.where} for t in targets],
                max_bytes=int(args.record_max_mb * (1 << 20)),
            )
        except OSError as e:
            err(f"cannot record to {args.record}: {e.strerror or e}")
            return EXIT_USAGE
    if len(targets) > 1:
        from console.core.fleet import build_runs
        from console.tui.fleet_app import FleetApp

        runs = build_runs(targets)
        app = FleetApp(runs, health=hooks)
        sessions = [r.session for r in runs]
    else:
        t = targets[0]
        session = Session(
            t.options, place=t.place, run_dir=t.run_dir, readonly=t.readonly, serve=t.serve, pyspy=t.pyspy
        )
        target = t.where
        if t.label and t.label != t.name:
            target = f"{t.label} · {target}"
        app = ConsoleApp(session, readonly=t.readonly, target=target, health=hooks)
        sessions = [session]
    if recorder is not None:
        for i, s in enumerate(sessions):
            s.subscribe(recorder.subscriber(i))

        def stopped(why: str) -> None:
            app.notify(why, title="recording stopped", severity="warning", timeout=30)
            app.state.note(why, "error")

        recorder.on_stop = stopped
    try:
        app.run()
    finally:
        if recorder is not None:
            recorder.close()
            print(recorder.stopped if recorder.stopped != "record closed" else f"recorded to {args.record}")
    return EXIT_OK


# --- entry point ------------------------------------------------------------------------------------


def _split_trainer_flags(argv: list[str]) -> tuple[list[str], list[str] | None]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, None


def main(argv: list[str] | None = None) -> int:
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    head, trainer_flags = _split_trainer_flags(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(head)
    if extra:  # `status HOST --ct 200 NAME`: targets after the flags are targets too
        if args.command in ("status", "connect") and not any(e.startswith("-") for e in extra):
            args.host += extra
        elif args.command in ONE_RUN and not any(e.startswith("-") for e in extra):
            parser.error(
                f"{args.command} acts on one run: give one target, not {' '.join([args.host, *extra])}"
            )
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.trainer_flags = trainer_flags or []
    if trainer_flags is not None and args.command != "launch":
        parser.error(f"`--` and trainer flags only go with launch, not {args.command}")
    if args.command == "connect":
        return cmd_connect(args)
    if args.command == "replay":
        return cmd_replay(args)
    if args.command == "demo":
        from console import demo

        return demo.run(args) or 0
    if args.command in ONE_RUN and not (args.command == "logs" and is_record(args.host)):
        from console.core.config_file import ConfigError

        try:
            target = resolve_one_target(args)
        except ConfigError as e:
            err(str(e))
            return EXIT_USAGE
        refused = _readonly_refusal(args, target)
        if refused is not None:
            return refused
        _single(args, target)
    runner = {
        "status": cmd_status,
        "launch": cmd_launch,
        "deploy": cmd_deploy,
        "stop": cmd_stop,
        "restart": cmd_restart,
        "logs": cmd_logs,
        "threads": lambda a: cmd_threads(a, _session, several_trainers),
        "serve-status": lambda a: cli_serve.cmd_serve_status(a, _session),
    }[args.command]
    import asyncssh

    from console.core.helper import HelperError, HelperStartError, PlaceUnreachable
    from console.core.session import NotConnected
    from console.core.ssh import ConnectError

    try:
        code = asyncio.run(runner(args))
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`status --json | head`): nothing more to say
        code = EXIT_ERROR
    except ControlError as e:
        err(str(e))
        code = exit_code(e.outcome)
    except ConnectError as e:
        code = _connect_failed(args, e)
    except PlaceUnreachable as e:  # a wrong container/pod/job name, a runtime the host lacks
        err(str(e))
        code = EXIT_USAGE
    except (HelperStartError, NotConnected, HelperError, OSError, asyncssh.Error) as e:
        err(str(e))
        code = EXIT_ERROR
    if from_shell:
        # Run as the program: everything is said and closed, so skip the interpreter's slow teardown
        # (asyncssh/cryptography finalisation, ~0.15 s): a script waiting on `stop` learns at once.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a reader that went away
                stream.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    raise SystemExit(main())

"""``dflash-console threads TARGET [--json] [--dump PID]``: the trainer's processes (launcher and workers)
and their threads with CPU% and state (console/core/threads.py; CPU% from two samples ``--interval``
apart), or ``py-spy dump`` of one of those processes (console/core/pyspy.py). It only reads, so a
read-only target allows it. docs/cli.md has the details."""

from __future__ import annotations

import argparse
import asyncio

from console.cli_exit import EXIT_ERROR, EXIT_NO_TRAINER, EXIT_OK, err
from console.core import json_out


def add_threads_parser(sub, conn_flags) -> None:
    """The ``threads`` subcommand (``conn_flags``: the CLI's connection flags)."""
    p = sub.add_parser(
        "threads", help="the trainer's processes and threads with CPU%% and state (py-spy dump: --dump)"
    )
    conn_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--dump",
        type=int,
        metavar="PID",
        help="print `py-spy dump --pid PID` of the trainer or one of its workers instead (py-spy must be "
        "in the container: --pyspy, the target's pyspy in the config file, or the helper's PATH)",
    )
    p.add_argument(
        "--pyspy",
        metavar="PATH",
        help="py-spy's absolute path in the container (root's or the helper user's, writable by no one "
        "else); never looked for beside the run's interpreter",
    )
    p.add_argument(
        "--interval",
        type=_interval,
        default=1.0,
        metavar="S",
        help="seconds between the two samples CPU%% is measured over (1.0)",
    )


def _interval(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.05 <= v <= 60:
        raise argparse.ArgumentTypeError(f"{v:g} s: give 0.05 to 60 seconds")
    return v


async def cmd_threads(args, session, several) -> int:
    """``session(args)``: the CLI's one-run session; ``several(args, s)``: its refusal to pick one of
    several trainers silently (an exit code, or None)."""
    from console.core.threads import ThreadsError

    async with session(args) as s:
        refused = await several(args, s)
        if refused is not None:
            return refused
        if s.trainer is None:
            where = f" for {s.run_dir}" if s.run_dir else ""
            err(f"no trainer found{where} on {s.where}")
            return EXIT_NO_TRAINER
        try:
            if args.dump is not None:
                return await _dump(s, args)
            return await _table(s, args)
        except ThreadsError as e:
            err(str(e))
            return EXIT_NO_TRAINER


async def _table(s, args) -> int:
    from console.core.threads import Sampler, format_text, to_json

    sampler = Sampler()
    sampler.feed(await s.sample_threads())
    await asyncio.sleep(args.interval)
    snap = sampler.feed(await s.sample_threads())
    print(json_out.dumps(to_json(snap)) if args.json else format_text(snap))
    return EXIT_OK


async def _dump(s, args) -> int:
    d = await s.pyspy_dump(args.dump)
    if args.json:
        print(json_out.dumps({"pid": d.pid, "ok": d.ok, "found": d.found, "path": d.path, "text": d.text}))
    elif d.ok:
        print(d.text)
    else:
        err(d.text)
    return EXIT_OK if d.ok else EXIT_ERROR

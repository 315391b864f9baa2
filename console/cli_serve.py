"""``dflash-console serve-status TARGET --serve vllm:8000``: the served acceptance of a serving endpoint beside
the run's own evaluation, once (docs/cli.md, docs/serving.md). Exit codes as ``status --check``: 0 OK,
1 WARNING (served this share below the evaluation), 2 CRITICAL (twice that), 3 UNKNOWN (nothing to judge:
the endpoint unreadable, nothing drafted)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses

from console.cli_exit import EXIT_USAGE, err
from console.core import json_out
from console.core.check import EXIT
from console.core.check import UNKNOWN as CHECK_UNKNOWN
from console.core.config_file import health_config
from console.core.health import served_shortfall
from console.core.remote_files import recent_records
from console.core.serve_watch import ServeError, sample
from console.core.serving import THINKING, Endpoint, EndpointError, parse_endpoint, served, with_thinking

OK, UNKNOWN = EXIT["ok"], CHECK_UNKNOWN
LEVEL = {0: "OK", 1: "WARNING", 2: "CRITICAL", UNKNOWN: "UNKNOWN"}


def endpoint_arg(text: str) -> Endpoint:
    try:
        return parse_endpoint(text)
    except EndpointError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


SERVE_HELP = (
    "a serving endpoint on the place's loopback whose acceptance to read: vllm:PORT or sglang:PORT "
    "(its /metrics, fetched by the helper; config key `serve`)"
)


SKIP_CHECK = "--skip-serve-check"


def add_launch_args(p) -> None:
    """``launch``'s serving flags: what the train/serve check compares the run with (serve_check.py)."""
    p.add_argument(
        "--serve", type=endpoint_arg, metavar="KIND:PORT",
        help="how the drafter will be served (vllm:PORT or sglang:PORT; config key `serve`): the launch "
        "first checks the flags against that server's rules (python -m trainer.serve_check)",
    )  # fmt: skip
    p.add_argument(
        "--serve-thinking", choices=THINKING, metavar="on|off",
        help="whether the server renders prompts with thinking (config key `serve_thinking`)",
    )  # fmt: skip
    p.add_argument(
        SKIP_CHECK, action="store_true",
        help="launch even when the train/serve check fails (its lines are still printed)",
    )  # fmt: skip


def launch_endpoint(args) -> Endpoint | None:
    """The endpoint ``launch`` checks against: ``--serve`` else the target's ``serve``, with ``--serve-thinking``
    else its ``serve_thinking``; ``EndpointError`` (usage) for a thinking setting without a server."""
    endpoint = args.serve or getattr(getattr(args, "target", None), "serve", None)
    thinking = args.serve_thinking or (endpoint.thinking if endpoint is not None else None)
    try:
        return with_thinking(endpoint, thinking)
    except EndpointError as e:
        raise EndpointError(f"--serve-thinking: {e}") from None


def add_parser(sub, conn_flags) -> None:
    p = sub.add_parser("serve-status", help="a serving endpoint's acceptance beside the run's evaluation")
    conn_flags(p)
    p.add_argument("--serve", type=endpoint_arg, metavar="KIND:PORT", help=SERVE_HELP)
    p.add_argument(
        "--window", type=float, default=10.0, metavar="S",
        help="read the counters twice, S seconds apart (10; 0: the server's totals since it started)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")


async def report(session, endpoint: Endpoint, window_s: float) -> dict:
    """The served figure over ``window_s`` and the run's newest evaluation, judged."""
    helper = session.need_helper()
    await session.find_trainer()
    last_eval = None
    if session.run_dir:
        for rec in await recent_records(helper, session.run_dir):
            if rec.get("kind") == "eval" and isinstance(rec.get("accept_len"), (int, float)):
                last_eval = rec
    try:
        samples = [await sample(helper, endpoint)]
        if window_s > 0:
            await asyncio.sleep(window_s)
            samples.append(await sample(helper, endpoint))
        figure = served(endpoint.kind, samples)
    except ServeError as e:
        figure = None
        error = str(e)
    else:
        error = figure.error
    out = {
        "endpoint": str(endpoint),
        "served": dataclasses.asdict(figure) if figure else None,
        "eval": {"accept_len": last_eval["accept_len"], "step": last_eval.get("step")} if last_eval else None,
        "run_dir": session.run_dir,
        "error": error,
    }
    out["level"], out["text"] = judge(out, health_config().served_drop)
    return out


def judge(out: dict, drop: float) -> tuple[int, str]:
    s, ev = out["served"], out["eval"]
    if not s or s.get("accept_length") is None:
        return UNKNOWN, f"{out['endpoint']}: {out['error'] or 'no figure'}"
    al = s["accept_length"]
    over = "since the server started" if s["lifetime"] else f"over {s['window_s']:.0f} s"
    text = f"served acceptance {al:.2f} ({out['endpoint']}, {over}, {s['drafts']:.0f} drafts)"
    if not ev:
        return OK, text + "; no evaluation of the run to compare"
    level, below = served_shortfall(al, ev["accept_len"], drop)
    text += f"; evaluation {ev['accept_len']:.2f} at step {ev['step']}"
    return EXIT[level], text + (f": {below:.0%} below" if level != "ok" else "")


async def cmd_serve_status(args, make_session) -> int:
    endpoint = args.serve or getattr(args.target, "serve", None)
    if endpoint is None:
        err("serve-status needs --serve KIND:PORT (or `serve` in the target's config entry)")
        return EXIT_USAGE
    async with make_session(args) as s:
        out = await report(s, endpoint, max(0.0, args.window))
    if args.json:
        print(json_out.dumps(out, indent=None))
    else:
        print(f"SERVED {LEVEL[out['level']]}: {out['text']}")
        per_pos = (out["served"] or {}).get("per_pos") or []
        if per_pos:
            print("  per position: " + " ".join(f"{p:.2f}" for p in per_pos))
    return out["level"]

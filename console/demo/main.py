"""``dflash-console demo``: checks, the demo directory, then the headless or the screen mode."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from console.demo.demo import INSTALL_HINT, Demo, DemoError, missing_trainer_deps, printer


def run(args) -> int:
    """``dflash-console demo``: see the module docstring."""
    say = printer()
    err = printer(sys.stderr)
    missing = missing_trainer_deps()
    if missing:
        err(
            f"dflash-console demo: the demo runs the trainer on this machine and needs {', '.join(missing)}, "
            f"which {sys.executable} lacks: {INSTALL_HINT}"
        )
        return 1
    if not args.headless and not (sys.stdout.isatty() and sys.stdin.isatty()):
        err(
            "dflash-console demo: the screen needs a terminal; use `dflash-console demo --headless` without one"
        )
        return 2
    if args.dir:
        root, temp = Path(args.dir).expanduser().resolve(), False
    else:
        root, temp = Path(tempfile.mkdtemp(prefix="dflash-demo-")), True
    demo = Demo(root, temp=temp, port=getattr(args, "port", 0) or 0, say=say)
    try:
        demo.claim_dir()
    except DemoError as e:
        err(f"dflash-console demo: {e}")
        if temp:
            shutil.rmtree(root, ignore_errors=True)
        return 1
    say(
        f"dflash-console demo in {root}"
        + (" (a temp dir, removed at the end; --dir keeps a run)" if temp else "")
    )
    try:
        code = asyncio.run(_mode(demo, args.headless))
    finally:
        demo.release_dir()
    if temp:
        say(f"removed the temp dir {root}")
    else:
        say(f"files kept in {root}; `dflash-console demo --dir {root}` resumes the run")
    return code


async def _mode(demo: Demo, headless: bool) -> int:
    if headless:
        from console.demo.headless import run_headless

        return await run_headless(demo)
    from console.demo.screen import run_screen

    return await run_screen(demo)

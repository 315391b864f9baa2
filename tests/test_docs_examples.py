"""The docs' CPU examples train briskly: every `launch` example of docs/cli.md that trains on the CPU
carries the demo's CPU sizing (console/demo/demo.py), not the trainer's GPU-sized defaults (block 16,
--token-budget 16384 ran 0.2 steps/s on a 2-core machine)."""

from __future__ import annotations

import shlex

from console.demo.demo import TRAINER_FLAGS
from tests.support.trainer_run import ROOT

SIZING = ("--block-size", "--max-anchors", "--token-budget", "--max-seq-len")


def _commands(text: str) -> list[list[str]]:
    """The shell commands of the page's console blocks (``$ ...``, continued with backslashes)."""
    out, current = [], None
    for line in text.splitlines():
        if current is not None:
            current += " " + line.strip().rstrip("\\")
            if not line.rstrip().endswith("\\"):
                out.append(shlex.split(current))
                current = None
        elif line.startswith("$ "):
            current = line[2:].strip().rstrip("\\")
            if not line.rstrip().endswith("\\"):
                out.append(shlex.split(current))
                current = None
    return out


def test_every_cpu_launch_example_is_sized_for_a_cpu():
    demo = {flag: TRAINER_FLAGS[TRAINER_FLAGS.index(flag) + 1] for flag in SIZING}
    launches = [
        argv
        for argv in _commands((ROOT / "docs" / "cli.md").read_text())
        if argv[:2] == ["dflash-console", "launch"] and "cpu" in argv
    ]
    assert launches, "docs/cli.md has no CPU launch example"
    for argv in launches:
        flags = argv[argv.index("--") + 1 :]
        given = {f: flags[flags.index(f) + 1] for f in SIZING if f in flags}
        assert given == demo, f"{shlex.join(argv)}: {given} (the demo's: {demo})"

"""A code directory that is not the bundled trainer: its ``trainer.pipeline`` marks that it ran (the file
``RAN`` in its ``--output-dir``, holding its argv), writes a ``started`` event and exits after a second.
For the tests of what a restart runs on run.json's word (console/core/restart_trust.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PIPELINE = r"""
import json, os, sys, time
out = sys.argv[sys.argv.index("--output-dir") + 1]
open(os.path.join(out, "RAN"), "w").write(" ".join(sys.argv))
with open(os.path.join(out, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"t": time.time(), "kind": "event", "name": "started", "pid": os.getpid()}) + "\n")
time.sleep(1)
"""


def other_code(folder: Path) -> str:
    """Write the fake ``trainer`` package into ``folder`` (the code dir); returns its path."""
    (folder / "trainer").mkdir(parents=True)
    (folder / "trainer" / "__init__.py").write_text("")
    (folder / "trainer" / "pipeline.py").write_text(PIPELINE)
    return str(folder)


def run_json_for(run_dir: Path, cwd: Path, code: str) -> None:
    """A run.json of a run that is not running (no pid) with ``code`` as its code dir."""
    argv = ["--output-dir", str(run_dir)]
    info = {
        "argv": argv,
        "interpreter": sys.executable,
        "command": [sys.executable, "-m", "trainer.pipeline", *argv],
        "cwd": str(cwd),
        "code_dir": code,
        "env": {"PYTHONPATH": code},
        "output_dir": str(run_dir),
    }
    (run_dir / "run.json").write_text(json.dumps(info))

"""A code directory that is not the bundled trainer: its ``trainer.pipeline`` marks that it ran (the file
``RAN`` in its ``--output-dir``, holding its argv, argv[0] its own path; ``ENV``: its ``DFLASH_*`` and
``LD_*`` environment), writes a ``started`` event and exits after a second.
For the tests of what a restart runs on run.json's word (console/core/restart_trust.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PIPELINE = r"""
import json, os, sys, time
out = sys.argv[sys.argv.index("--output-dir") + 1]
open(os.path.join(out, "RAN"), "w").write(" ".join(sys.argv))  # argv[0]: this file, so which code ran
hooks = {k: v for k, v in os.environ.items() if k.startswith(("DFLASH_", "LD_"))}
open(os.path.join(out, "ENV"), "w").write(json.dumps(hooks))
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


def fake_deployment(base: Path, digest: str) -> str:
    """A deployed code folder ``base/DIGEST`` (with its ``.complete``) holding the fake package."""
    code = other_code(base / digest)
    (base / digest / ".complete").write_text(json.dumps({"hash": digest, "files": [], "t": 0}))
    return code


def mark_last(base: Path, digest: str) -> None:
    """What deploy writes: ``base/last`` names ``digest`` the last deployment."""
    (base / "last").write_text(json.dumps({"hash": digest, "t": 1.8e9}))

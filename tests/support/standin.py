"""A stand-in trainer that keeps the run-directory contract (run.json, metrics.jsonl events, checkpoints/)
without torch: for the console's stop tests that need exact control over what the trainer writes when.

``STANDIN_MODE``:
- ``fast``: on SIGINT every event of the stop (stop_requested, checkpoint_saving, checkpoint_saved,
  stopped) goes out in one write, then it exits 0 (a save faster than any poll);
- ``hold``: after stop_requested + checkpoint_saving it holds the save until the path
  ``STANDIN_RELEASE`` exists, then saves and exits 0;
- ``fail``: the save fails as on a full disk: an ``error`` event, ``stopped`` with reason
  ``checkpoint_failed``, exit 4; ``latest`` still names the checkpoint of step 5 it made at start.
- ``finish``: no SIGINT: once the path ``STANDIN_RELEASE`` exists it writes its last step records and
  ``stopped`` with reason ``finished`` in one write and exits 0 at once (a clean end of training).
It prints ``signals N`` (how many SIGINTs it got) last. It runs as ``python -m trainer.pipeline`` (a
``trainer`` package of its own, first on its PYTHONPATH), since only the trainer's command line is ever
taken for the trainer (``helper_program.identity.is_trainer_cmdline``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONTRACT_TRAINER = r"""
import json, os, signal, sys, time
run = sys.argv[sys.argv.index("--output-dir") + 1]
mode = os.environ.get("STANDIN_MODE", "fast")
ckroot = os.path.join(run, "checkpoints")
os.makedirs(os.path.join(ckroot, "step_00000005"), exist_ok=True)
with open(os.path.join(ckroot, "latest"), "w") as f:
    f.write("step_00000005\n")
with open(f"/proc/{os.getpid()}/stat") as f:
    start_time = int(f.read().rsplit(")", 1)[1].split()[19])
info = {"pid": os.getpid(), "start_time": start_time,
        "command": [sys.executable, "-m", "trainer.pipeline", *sys.argv[1:]],
        "argv": sys.argv[1:], "interpreter": sys.executable, "cwd": os.getcwd(), "output_dir": run}
with open(os.path.join(run, "run.json.tmp"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(run, "run.json.tmp"), os.path.join(run, "run.json"))
metrics = open(os.path.join(run, "metrics.jsonl"), "ab", buffering=0)
def ev(name, **kw):
    return (json.dumps({"t": time.time(), "kind": "event", "name": name, **kw}) + "\n").encode()
signals = []
signal.signal(signal.SIGINT, lambda s, f: signals.append(s))
metrics.write(ev("started", pid=os.getpid(), step=5))
print("training", flush=True)
while not signals and mode != "finish":
    time.sleep(0.01)
ckpt = os.path.join(ckroot, "step_00000007")
def saved():
    os.makedirs(ckpt)
    with open(os.path.join(ckroot, "latest"), "w") as f:
        f.write("step_00000007\n")
    return ev("checkpoint_saved", step=7, path=ckpt, seconds=0.01, bytes=10)
def leave(code):
    print(f"signals {len(signals)}", flush=True)
    sys.exit(code)
if mode == "finish":
    while not os.path.exists(os.environ["STANDIN_RELEASE"]):
        time.sleep(0.01)
    steps = b"".join((json.dumps({"t": time.time(), "kind": "step", "step": i, "loss": 1.0}) + "\n").encode()
                     for i in range(6, 9))
    metrics.write(steps + ev("stopped", reason="finished", exit_code=0))
    leave(0)
if mode == "fast":
    metrics.write(ev("stop_requested", signal="SIGINT") + ev("checkpoint_saving", step=7, expected_s=None)
                  + saved() + ev("stopped", reason="signal", exit_code=0))
    leave(0)
metrics.write(ev("stop_requested", signal="SIGINT") + ev("checkpoint_saving", step=7, expected_s=2.0))
if mode == "hold":
    print("holding the save", flush=True)
    while not os.path.exists(os.environ["STANDIN_RELEASE"]):
        time.sleep(0.02)
    metrics.write(saved() + ev("stopped", reason="signal", exit_code=0))
    leave(0)
metrics.write(ev("error", step=7, message="checkpoint at step 7 failed: [Errno 28] No space left on device "
                 "(0.0 MB free on " + ckroot + ")")
              + ev("stopped", reason="checkpoint_failed", exit_code=4))
leave(4)
"""


def start_contract_trainer(folder: Path, run_dir: Path, **env: str) -> subprocess.Popen:
    """Start the stand-in (``env``: STANDIN_MODE, STANDIN_RELEASE) and wait until it trains. The
    caller is its parent (its exit status stays readable until reaped); stdout is a pipe."""
    import os

    package = folder / ".standin" / "trainer"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "pipeline.py").write_text(CONTRACT_TRAINER)
    path = os.pathsep.join(p for p in (str(package.parent), os.environ.get("PYTHONPATH")) if p)
    p = subprocess.Popen(
        [sys.executable, "-m", "trainer.pipeline", "--output-dir", str(run_dir)],
        cwd=folder,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "training"
    return p

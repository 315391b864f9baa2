"""A stand-in run for the threads view, without torch: ``python -m trainer.pipeline`` (a ``trainer`` package
of its own, as in tests/support/standin.py, since only the trainer's command line is taken for the
trainer) that writes run.json and then:

- names its main thread ``dflash-launch`` and starts ``dflash-spin`` (busy about half the time, so
  its ticks move) and a thread that names itself :data:`HOSTILE` (escape bytes: an OSC title sequence,
  a BEL, an 8-bit CSI), through prctl(PR_SET_NAME) as trainer/thread_names.py does;
- starts one child, ``python -c``, which names itself ``dflash-target0`` and exits once the file
  ``RUN/child-exit`` exists (a process that exits between two samples);
- exits once ``RUN/release`` exists.
It prints ``training`` once every one of them has its name, and the child's pid (``child N``) before it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# 15 bytes: OSC 0 (set the window title) ... BEL, markup-looking text, a C1 CSI (U+009B) "2J" (clear)
HOSTILE = b"\x1b]0;pwn\x07[b]\xc2\x9b2J"
HOSTILE_SHOWN = "\ufffd[b]\ufffd"  # as the console shows it (console/core/sanitize.py), markup not applied

CHILD = r"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, ctypes.c_char_p(b"dflash-target0"), 0, 0, 0)
while not os.path.exists(os.path.join(sys.argv[1], "child-exit")):
    time.sleep(0.02)
"""

SCRIPT = r"""
import ctypes, json, os, subprocess, sys, threading, time
HOSTILE, CHILD = %r, %r
prctl = ctypes.CDLL(None).prctl
def name(b):
    prctl(15, ctypes.c_char_p(b), 0, 0, 0)
run = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(run, exist_ok=True)
with open(f"/proc/{os.getpid()}/stat") as f:
    start_time = int(f.read().rsplit(")", 1)[1].split()[19])
info = {"pid": os.getpid(), "start_time": start_time,
        "command": [sys.executable, "-m", "trainer.pipeline", *sys.argv[1:]],
        "argv": sys.argv[1:], "interpreter": sys.executable, "cwd": os.getcwd(), "output_dir": run}
with open(os.path.join(run, "run.json.tmp"), "w") as f:
    json.dump(info, f)
os.replace(os.path.join(run, "run.json.tmp"), os.path.join(run, "run.json"))
name(b"dflash-launch")
def released():
    return os.path.exists(os.path.join(run, "release"))
def spin():
    name(b"dflash-spin")
    while not released():
        end = time.monotonic() + 0.02
        while time.monotonic() < end:
            pass
        time.sleep(0.02)
def hostile():
    name(HOSTILE)
    while not released():
        time.sleep(0.05)
threading.Thread(target=spin, daemon=True).start()
threading.Thread(target=hostile, daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", CHILD, run])
def comm(path):
    try:
        with open(path, "rb") as f:
            return f.read().rstrip(b"\n")
    except OSError:
        return b""
def named():
    mine = {comm(f"/proc/self/task/{t}/comm") for t in os.listdir("/proc/self/task")}
    return {b"dflash-spin", HOSTILE} <= mine and comm(f"/proc/{child.pid}/comm") == b"dflash-target0"
while not named():
    time.sleep(0.01)
print(f"child {child.pid}", flush=True)
print("training", flush=True)
while not released():
    time.sleep(0.05)
    child.poll()
child.wait()
"""


def start_threads_standin(
    folder: Path, run_dir: Path, python: str | None = None
) -> tuple[subprocess.Popen, int]:
    """Start the stand-in (with ``python``, default this interpreter) and wait until it runs: (it, its
    child's pid). The caller ends it: ``RUN/release``, or a kill."""
    package = folder / ".threads-standin" / "trainer"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "pipeline.py").write_text(SCRIPT % (HOSTILE, CHILD))
    p = subprocess.Popen(
        [python or sys.executable, "-m", "trainer.pipeline", "--output-dir", str(run_dir)],
        cwd=folder,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(package.parent)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    first = p.stdout.readline().strip()
    assert first.startswith("child "), first + p.stdout.read()
    assert p.stdout.readline().strip() == "training"
    return p, int(first.split()[1])


@contextlib.contextmanager
def threads_standin(folder: Path, run_dir: Path, python: str | None = None) -> Iterator[tuple]:
    """``start_threads_standin`` for a ``with`` block: (it, its child's pid); released at the end (the child
    told to exit too), killed if it does not end within 20 s."""
    p, child = start_threads_standin(folder, run_dir, python)
    try:
        yield p, child
    finally:
        (run_dir / "release").touch()
        (run_dir / "child-exit").touch()
        try:
            p.wait(20)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def path_without_pyspy(bin_dir: Path) -> str:
    """PATH for a devhost's sessions with no py-spy on it (its ``bin_dir``, the pct stand-in, first)."""
    dirs = [d for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep) if d]
    return os.pathsep.join(
        [str(bin_dir), *(d for d in dirs if not os.path.exists(os.path.join(d, "py-spy")))]
    )


def no_pyspy_env(root: Path) -> dict[str, str]:
    """A devhost's ``env`` (a function of its root, for tests/support/devhost.py) with no py-spy on PATH."""
    return {"PATH": path_without_pyspy(root / "bin")}


def python_without_pyspy(folder: Path) -> str:
    """This interpreter, by a link in a folder of its own: no py-spy beside it (a virtualenv's is)."""
    bindir = folder / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    exe = bindir / "python3"
    if not exe.exists():
        exe.symlink_to(sys.executable)
    return str(exe)

"""What every runtime fixture shares: the skip-or-fail for a missing program, the bind mounts, the skeleton
root, a reaping init, and running a command with a deadline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# PID 1 of a test container: reaps what the helper leaves behind (a trainer outliving its helper), ends on
# SIGTERM. The runtimes' own inits (catatonit, tini) are not packaged with all of them here.
INIT = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)


def need(package: str, *programs: str) -> None:
    """Skip (fail under ``CI=true``) when one of ``programs`` is not installed, naming the Debian package."""
    missing = [p for p in programs if shutil.which(p) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        why = f"{package}: the real runtime needs root"
    else:
        why = f"{', '.join(missing)} not installed (Debian package {package}; .ci/run installs it)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run this runtime's tests: {why}")
    pytest.skip(why)


def binds(run_root: Path) -> list[Path]:
    """Host folders a container sees at their own paths: /usr (python3 and what the helper runs), this
    interpreter's installation, the repository and its venv, and the test run's folder (tiny target, run
    dirs)."""
    paths = [Path("/usr"), Path(os.path.realpath(sys.base_prefix)), Path(sys.prefix), ROOT, run_root]
    out: list[Path] = []
    for p in paths:
        if not any(p == q or q in p.parents for q in out):
            out = [q for q in out if p not in q.parents] + [p]
    return out


def skeleton(root: Path) -> Path:
    """An empty root: top folders, lib/bin links into /usr, root in passwd."""
    for d in ("proc", "sys", "dev", "tmp", "etc", "usr", "root", "run", "var/tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, to in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")):
        if not (root / link).is_symlink():
            (root / link).symlink_to(to)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/hostname").write_text("trainer\n")
    os.chmod(root / "tmp", 0o1777)
    return root


def run(argv: list[str], *, env: dict | None = None, timeout: float = 120, check: bool = True, **kw):
    """``argv`` with a deadline; a failure raises with its output (the fixture's error says why)."""
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stdout[-800:]} {p.stderr[-800:]}")
    return p


def until(ok: Callable[[], bool], timeout: float, what: str, step: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(step)


def stop_pid(pid_file: Path, timeout: float = 20) -> None:
    """SIGTERM the daemon whose pid the file holds, SIGKILL after ``timeout``."""
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    for sig, wait in ((15, timeout), (9, 5)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


class Engine:
    """What the Docker and Podman fixtures share: their CLI run with the fixture's environment, the binds as
    ``-v`` flags, exec into a container, the containers started (removed at the end)."""

    PROGRAM = ""
    env: dict[str, str]
    run_root: Path

    def __init__(self) -> None:
        self.names: list[str] = []

    def cli(self, *args: str, **kw):
        return run([self.PROGRAM, *args], env={**os.environ, **self.env}, **kw)

    def volumes(self) -> list[str]:
        return [a for p in binds(self.run_root) for a in ("-v", f"{p}:{p}")]

    def exec(self, name: str, *argv: str, **kw):
        return self.cli("exec", name, *argv, **kw)

"""Helpers for the console core's tests: a devhost, options for it, the CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from console.core.options import ConnectOptions
from tests.trainer_run import ROOT

CT = 200
CLI = [str(Path(sys.executable).parent / "dflash-console")]


def options_for(h, **kw) -> ConnectOptions:
    """Options for a DevHost (or DevHostThread): its port, client key and known_hosts; no ssh config."""
    return ConnectOptions(host=h.host, port=h.port, user=h.user, identity_files=[str(h.client_key_path)],
                          known_hosts=str(h.known_hosts_path), config_files=[], **kw)


def conn_args(h, ct: int | None = CT) -> list[str]:
    args = [h.host, "-p", str(h.port), "-l", h.user, "-i", str(h.client_key_path),
            "--known-hosts", str(h.known_hosts_path), "-F", "/dev/null"]
    return args + (["--ct", str(ct)] if ct is not None else [])


def cli(*args: str, timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``dflash-console ARGS`` as a real subprocess (no terminal)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL if input is None else None, input=input)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(pred, timeout: float = 30, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])

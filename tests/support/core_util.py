"""Helpers for the console core's tests: a devhost, options for it, the CLI as a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from console.core.options import ConnectOptions
from console.devhost import DevHostThread
from tests.support.trainer_run import ROOT

CT = 200
CLI = [str(Path(sys.executable).parent / "dflash-console")]


def _dh(h):
    return h.host if isinstance(h, DevHostThread) else h  # DevHostThread.host is the DevHost


def options_for(h, **kw) -> ConnectOptions:
    """Options for a DevHost (or DevHostThread): its port, client key and known_hosts; no ssh config."""
    h = _dh(h)
    return ConnectOptions(
        host=h.host,
        port=h.port,
        user=h.user,
        identity_files=[str(h.client_key_path)],
        known_hosts=str(h.known_hosts_path),
        config_files=[],
        **kw,
    )


def conn_args(h, ct: int | None = CT) -> list[str]:
    h = _dh(h)
    args = [
        h.host,
        "-p",
        str(h.port),
        "-l",
        h.user,
        "-i",
        str(h.client_key_path),
        "--known-hosts",
        str(h.known_hosts_path),
        "-F",
        "/dev/null",
    ]
    return args + (["--ct", str(ct)] if ct is not None else [])


def cli(*args: str, timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``dflash-console ARGS`` as a real subprocess (no terminal)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL if input is None else None,
        input=input,
    )


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


# A stand-in for the workflow's own ``train_dflash_pipeline.py`` (no run.json, no metrics): it trains
# until SIGINT; its KeyboardInterrupt handler then writes a checkpoint file into --output-dir in two
# halves with STANDIN_SAVE_S seconds between them (STANDIN_WRITE=0: writes nothing) and exits
# STANDIN_RC. On SIGUSR1 it execs ``sleep`` (same PID and start time, another program: what a stop must
# refuse to signal).
USER_SCRIPT = r"""
import os, signal, sys, time
signal.signal(signal.SIGUSR1, lambda *a: os.execvp("sleep", ["sleep", "30"]))
out = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(out, exist_ok=True)
print("training", flush=True)
try:
    while True:
        time.sleep(0.01)
except KeyboardInterrupt:
    print("saving", flush=True)
    if os.environ.get("STANDIN_WRITE", "1") == "1":
        with open(os.path.join(out, "checkpoint_step_100.pt"), "wb") as f:
            f.write(b"w" * 100_000)
            f.flush()
            time.sleep(float(os.environ.get("STANDIN_SAVE_S", "0.4")))
            f.write(b"w" * 100_000)
    print("saved", flush=True)
    sys.exit(int(os.environ.get("STANDIN_RC", "0")))
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_user_script(
    folder: Path,
    output_dir: str,
    args: tuple[str, ...] = ("--epochs", "6"),
    ignore_sigint: bool = False,
    **env: str,
) -> subprocess.Popen:
    """Run the stand-in as ``python .../train_dflash_pipeline.py ARGS --output-dir OUTPUT_DIR`` in ``folder``
    (``env``: STANDIN_* settings; ``ignore_sigint``: started with SIGINT ignored, as ``nohup ... &`` in a script
    starts it). The caller is its parent: its exit status stays readable until reaped."""
    script = folder / "train_dflash_pipeline.py"
    script.write_text(USER_SCRIPT)
    p = subprocess.Popen(
        [sys.executable, "-u", str(script), *args, "--output-dir", output_dir],
        cwd=folder,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if ignore_sigint else None,
    )
    assert p.stdout.readline().strip() == "training"
    return p

"""From the trainer's exit to the return of the stop command (goal: under 0.2 s).

    .venv/bin/python bench/bench_stop_exit.py [-n 10] [--real TINY_DIR]

Starts a devhost (console/devhost) in a separate process. Each round starts a trainer stand-in in
container 200 (a user script that, on SIGINT, "saves" for 0.3 s and exits), watches its exit here
with a pidfd (the reference time), and stops it through the console:
  api   Session.stop_trainer() returning, in this process
  cli   `dflash-console stop ... --yes` as a subprocess, until that process has exited (includes the
        CLI's own teardown)
With --real TINY_DIR (the output of `python -m trainer.tiny`) it also launches the real tiny trainer
through Session.launch and times one stop of it (api). The old workflow polled `kill -0` every 2 s:
on average 1 s late.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.core.options import ConnectOptions  # noqa: E402
from console.core.place import Proxmox  # noqa: E402
from console.core.session import Session  # noqa: E402

CT = 200
# The "save" writes a file in its output directory: a trainer without events.jsonl that exits having written
# nothing new there is reported as stopped without a checkpoint (console/core/control.py).
STAND_IN = r"""
import os, signal, sys, time
stop = []
signal.signal(signal.SIGINT, lambda *a: stop.append(1))
out = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(out, exist_ok=True)
print("training", flush=True)
while not stop:
    time.sleep(0.01)
time.sleep(0.3)
with open(os.path.join(out, "checkpoint-%d.bin" % time.time_ns()), "w") as f:
    f.write("saved")
"""


def watch_exit(pid: int) -> dict:
    """Record time.time() the moment ``pid`` exits (pidfd), from a thread."""
    out: dict = {}
    fd = os.pidfd_open(pid)

    def run() -> None:
        p = select.poll()
        p.register(fd, select.POLLIN)
        p.poll()
        out["t"] = time.time()
        os.close(fd)

    threading.Thread(target=run, daemon=True).start()
    return out


def start_stand_in(folder: Path, run_dir: str) -> subprocess.Popen:
    script = folder / "train_dflash_pipeline.py"
    script.write_text(STAND_IN)
    p = subprocess.Popen(
        [sys.executable, str(script), "--output-dir", run_dir],
        cwd=folder,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "training"
    return p


async def main(n: int, real: str | None) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-stop-"))
    server = subprocess.Popen(
        [sys.executable, "-m", "console.devhost", str(root), "--ct", str(CT), "--env", "OMP_NUM_THREADS=1"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        info = json.loads(server.stdout.readline())
        ct_dir = Path(info["containers"][0])
        opts = ConnectOptions(
            host="127.0.0.1",
            port=info["port"],
            user=info["user"],
            identity_files=[info["client_key"]],
            known_hosts=info["known_hosts"],
            config_files=[],
        )
        conn = [
            "127.0.0.1",
            "-p",
            str(info["port"]),
            "-l",
            info["user"],
            "-i",
            info["client_key"],
            "--known-hosts",
            info["known_hosts"],
            "-F",
            "/dev/null",
            "--ct",
            str(CT),
        ]
        api, cli = [], []
        for i in range(n):
            run_dir = str(ct_dir / f"run{i}")
            p = start_stand_in(ct_dir, run_dir)
            seen = watch_exit(p.pid)
            async with Session(opts, place=Proxmox(CT), run_dir=run_dir, telemetry=False, streams=False) as s:
                res = await s.stop_trainer(timeout=30)
                t_ret = time.time()
            assert res.code == 0, res
            p.wait()
            api.append(t_ret - seen["t"])

            p = start_stand_in(ct_dir, run_dir)
            seen = watch_exit(p.pid)
            c = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "dflash-console"),
                "stop",
                *conn,
                "--run-dir",
                run_dir,
                "--yes",
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            rc = await c.wait()
            t_ret = time.time()
            assert rc == 0, rc
            p.wait()
            cli.append(t_ret - seen["t"])
        out = {
            "n": n,
            "api_median_s": round(statistics.median(api), 4),
            "api_max_s": round(max(api), 4),
            "cli_median_s": round(statistics.median(cli), 4),
            "cli_max_s": round(max(cli), 4),
        }
        if real:
            out["real_tiny_trainer_api_s"] = await real_trainer(opts, ct_dir, Path(real))
        return out
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(root, ignore_errors=True)


async def real_trainer(opts: ConnectOptions, ct_dir: Path, tiny: Path) -> float:
    run_dir = ct_dir / "real"
    flags = [
        "--target-model",
        str(tiny / "target"),
        "--data-dir",
        str(tiny / "data"),
        "--output-dir",
        str(run_dir),
        "--target-gpus",
        "cpu",
        "--drafter-gpus",
        "cpu",
        "--block-size",
        "8",
        "--max-anchors",
        "64",
        "--token-budget",
        "1024",
        "--max-seq-len",
        "256",
        "--epochs",
        "1000",
    ]
    async with Session(opts, place=Proxmox(CT), run_dir=str(run_dir), telemetry=False, streams=False) as s:
        res = await s.launch(flags, code_dir=str(ROOT), env={"OMP_NUM_THREADS": "1"}, wait_s=180)
        assert res.code == 0, res.message
        for _ in range(600):
            if b'"kind": "step"' in (run_dir / "metrics.jsonl").read_bytes():
                break
            await asyncio.sleep(0.1)
        seen = watch_exit(res.trainer.pid)
        res = await s.stop_trainer(timeout=120)
        t_ret = time.time()
        assert res.code == 0, res.message
    return round(t_ret - seen["t"], 4)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10)
    ap.add_argument("--real", metavar="TINY_DIR")
    a = ap.parse_args()
    print(json.dumps(asyncio.run(main(a.n, a.real)), indent=1))

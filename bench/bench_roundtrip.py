"""Round-trip of one command in the container: today's workflow vs the console's helper.

    .venv/bin/python bench/bench_roundtrip.py [-n 30]

Starts a devhost (console/devhost: asyncssh server on 127.0.0.1 + pct stand-in) in a separate
process, then times the median of N runs of each way to run `pgrep -af train_dflash_pipeline.py`
in container 200:
  ssh-per-command   a new OpenSSH `ssh ... "pct exec 200 -- bash -lc '...'"` per command (today)
  conn-per-command  a new asyncssh connection + exec channel per command
  channel-per-cmd   a new exec channel per command on one live connection
  helper-run        the helper (started once via pct exec) spawning pgrep
  helper-find       the helper scanning /proc itself (what the console does instead of pgrep)
  helper-proc       the helper reading /proc/PID itself (what verify/is-alive need)
The machine is shared and busy: read the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from console.core.helper import Helper  # noqa: E402
from console.core.options import ConnectOptions  # noqa: E402
from console.core.place import Proxmox  # noqa: E402
from console.core.ssh import connect  # noqa: E402

CT = 200
PGREP = ["pgrep", "-af", "train_dflash_pipeline.py"]


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def timed(n: int, fn) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def main(n: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-rt-"))
    server = subprocess.Popen(
        [sys.executable, "-m", "console.devhost", str(root), "--ct", str(CT)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        info = json.loads(server.stdout.readline())
        opts = ConnectOptions(
            host="127.0.0.1",
            port=info["port"],
            user=info["user"],
            identity_files=[info["client_key"]],
            known_hosts=info["known_hosts"],
            config_files=[],
        )
        remote = shlex.join(["pct", "exec", str(CT), "--", "bash", "-lc", shlex.join(PGREP) + " || true"])
        results: dict[str, list[float]] = {}

        if shutil.which("ssh"):
            ssh = [
                "ssh",
                "-p",
                str(info["port"]),
                "-i",
                info["client_key"],
                "-F",
                "/dev/null",
                "-o",
                f"UserKnownHostsFile={info['known_hosts']}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                f"{info['user']}@127.0.0.1",
                remote,
            ]

            async def openssh() -> None:
                p = await asyncio.create_subprocess_exec(*ssh, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                out, err = await p.communicate()
                assert p.returncode == 0, err

            results["ssh-per-command"] = await timed(n, openssh)

        async def conn_per_cmd() -> None:
            c = await connect(opts)
            await c.run(remote, check=True)
            c.close()
            await c.wait_closed()

        results["conn-per-command"] = await timed(n, conn_per_cmd)
        conn = await connect(opts)

        async def channel() -> None:
            await conn.run(remote, check=True)

        results["channel-per-cmd"] = await timed(n, channel)
        t = time.perf_counter()
        helper = await Helper.start(conn, place=Proxmox(CT))
        start_s = time.perf_counter() - t
        me = os.getpid()

        async def helper_run() -> None:
            await helper.run(PGREP)

        async def helper_proc() -> None:
            await helper.proc(me)

        async def helper_find() -> None:
            await helper.call("find", patterns=[PGREP[-1]])

        results["helper-run"] = await timed(n, helper_run)
        results["helper-find"] = await timed(n, helper_find)
        results["helper-proc"] = await timed(n, helper_proc)
        await helper.close()
        conn.close()
        med = {k: round(median_ms(v), 2) for k, v in results.items()}
        base = med.get("ssh-per-command", med["conn-per-command"])
        return {
            "n": n,
            "median_ms": med,
            "helper_start_ms": round(start_s * 1000, 1),
            "speedup_vs_ssh_per_command": {k: round(base / v, 1) for k, v in med.items()},
        }
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30)
    print(json.dumps(asyncio.run(main(ap.parse_args().n)), indent=1))

"""The threads view's cost (issue 38): a synthetic run of ``--procs`` processes (a launcher and its
children) with ``--threads`` idle threads each, in a devhost container, sampled through the helper.

Prints: the ``threads`` round trip (median, p90), the helper's CPU per sample (its ticks), the console's
cost to turn a reply into rows (Sampler.feed + rows), and, with ``--screen S``, the console's main
thread's CPU share with the threads view open for S seconds (headless Textual: no real terminal).

    .venv/bin/python bench/bench_threads.py --procs 16 --threads 100 -n 30 --screen 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from console.core import threads  # noqa: E402
from console.core.events import TrainerInfo  # noqa: E402
from console.core.place import Proxmox  # noqa: E402

RUN = r"""
import json, os, subprocess, sys, threading, time
procs, nthreads = int(sys.argv[1]), int(sys.argv[2])
run = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(run, exist_ok=True)
ev = threading.Event()
for _ in range(nthreads - 1):
    threading.Thread(target=ev.wait, daemon=True).start()
kids = []
if os.environ.get("BENCH_CHILD") is None:
    env = dict(os.environ, BENCH_CHILD="1")
    kids = [subprocess.Popen([sys.executable, "-m", "trainer.pipeline", "1", str(nthreads), "--output-dir",
                              run], env=env, stdout=subprocess.PIPE, text=True) for _ in range(procs - 1)]
    assert all(k.stdout.readline().strip() == "ready" for k in kids)
    with open(f"/proc/{os.getpid()}/stat") as f:
        st = int(f.read().rsplit(")", 1)[1].split()[19])
    info = {"pid": os.getpid(), "start_time": st, "command": [sys.executable, "-m", "trainer.pipeline"],
            "interpreter": sys.executable, "output_dir": run}
    with open(os.path.join(run, "run.json"), "w") as f:
        json.dump(info, f)
print("ready", flush=True)
while not os.path.exists(os.path.join(run, "release")):
    time.sleep(0.2)
for k in kids:
    k.wait()
"""


def start_run(folder: Path, procs: int, nthreads: int) -> tuple[subprocess.Popen, Path]:
    pkg = folder / "pkg" / "trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "pipeline.py").write_text(RUN)
    run_dir = folder / "ct" / "200" / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", "trainer.pipeline", str(procs), str(nthreads), "--output-dir", str(run_dir)],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(pkg.parent)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert p.stdout.readline().strip() == "ready"
    return p, run_dir


def ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


async def helper_figures(host, trainer: TrainerInfo, n: int) -> None:
    from console.core.helper import Helper
    from console.core.ssh import connect
    from tests.support.core_util import options_for

    conn = await connect(options_for(host))
    hp = await Helper.start(conn, place=Proxmox(200))
    try:
        trips, feeds, sampler = [], [], threads.Sampler()
        t0 = ticks(hp.pid)
        for _ in range(n):
            a = time.perf_counter()
            reply = await threads.sample(hp, trainer, trainer.run_dir)
            b = time.perf_counter()
            snap = sampler.feed(reply)
            threads.rows(snap)
            feeds.append(time.perf_counter() - b)
            trips.append(b - a)
        cpu = (ticks(hp.pid) - t0) / os.sysconf("SC_CLK_TCK") / n
        total = sum(len(p.threads) for p in snap.procs)
        size = len(json.dumps(reply))
        q = statistics.quantiles(trips, n=10)
        print(f"{len(snap.procs)} processes, {total} threads; reply {size / 1024:.0f} KiB")
        print(f"threads round trip: median {statistics.median(trips) * 1e3:.1f} ms, p90 {q[-1] * 1e3:.1f} ms")
        print(f"helper CPU per sample: {cpu * 1e3:.1f} ms")
        print(f"console: reply -> rows {statistics.median(feeds) * 1e3:.1f} ms median")
    finally:
        await hp.close()
        conn.close()


def screen_share(host_thread, run_dir: Path, seconds: float) -> None:
    from console.app import ConsoleApp
    from console.core.session import Session
    from console.screens.threads import ThreadsScreen
    from tests.support.core_util import options_for

    async def go() -> None:
        s = Session(
            options_for(host_thread), place=Proxmox(200), run_dir=str(run_dir), telemetry=False, streams=False
        )
        app = ConsoleApp(s, readonly=True)
        async with app.run_test(size=(160, 48)) as pilot:
            while app.state.trainer is None:
                await pilot.pause(0.1)
            await pilot.press("t")
            scr = app.screen
            assert isinstance(scr, ThreadsScreen)
            while scr.samples < 2:
                await pilot.pause(0.1)
            main = threading.get_native_id()
            with open(f"/proc/self/task/{main}/stat") as f:
                t0 = int(f.read().rsplit(")", 1)[1].split()[11])
            w0, n0 = time.monotonic(), scr.samples
            await pilot.pause(seconds)
            with open(f"/proc/self/task/{main}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            used = (int(rest[11]) + int(rest[12]) - t0) / os.sysconf("SC_CLK_TCK")
            wall = time.monotonic() - w0
            print(f"screen: {scr.samples - n0} samples in {wall:.1f} s, main thread {used / wall:.3f} core")

    asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=100)
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--screen", type=float, default=0.0, metavar="S")
    a = ap.parse_args()
    from console.devhost.thread import DevHostThread

    with tempfile.TemporaryDirectory() as tmp, DevHostThread(Path(tmp) / "dh") as h:
        h.add_container(200)
        p, run_dir = start_run(Path(tmp) / "dh", a.procs, a.threads)
        try:
            info = json.loads((run_dir / "run.json").read_text())
            trainer = TrainerInfo(
                info["pid"], info["start_time"], info["command"], str(run_dir), "run.json", info
            )
            asyncio.run(helper_figures(h, trainer, a.n))
            if a.screen:
                screen_share(h, run_dir, a.screen)
        finally:
            (run_dir / "release").touch()
            p.wait(30)


if __name__ == "__main__":
    main()

"""A live screen recorded (connect --record) and replayed: at the moments captured during the live
run, the replay shows the same text. The live run is the real SSH server in-process and the
stand-in trainer; its records and log lines are appended by the test. The live screen and the
recorder share a clock the test can hold still while it captures."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.record import Recorder, read
from console.core.session import Session
from console.tui.replay_app import ReplayApp
from tests.support.core_util import cli, options_for, start_user_script
from tests.support.devhost import devhost_thread
from tests.support.screen_text import screen_text, until

SIZE = (130, 40)
CT = 200
pytestmark = pytest.mark.e2e


class Clock:
    """time.time(), unless held still."""

    def __init__(self) -> None:
        self.held: float | None = None

    def __call__(self) -> float:
        return self.held if self.held is not None else time.time()


def body(text: str) -> list[str]:
    """The screen without its first line (the connection bar: the replay's names the cursor) and its
    footer (the replay's keys)."""
    return text.splitlines()[1:-1]


def append(run_dir, n: int) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        for rec in (
            {"kind": "step", "step": n, "total_steps": 50, "loss": 2.0 / n, "accept_len_est": 1.0 + n / 10},
            {
                "kind": "throughput",
                "devices": [
                    {"device": "cpu", "uuid": None, "role": "drafter", "tok_s": 500.0 * n, "busy": 1}
                ],
                "queue": {"depth": n % 4, "capacity": 4},
            },
        ):
            f.write(json.dumps({"t": time.time(), **rec}) + "\n")
    with open(run_dir / "train.log", "a") as f:
        f.write(f"step {n} done\n")


async def test_replay_shows_what_the_live_screen_showed(tmp_path):
    path = tmp_path / "session.rec"
    clock = Clock()
    with devhost_thread(tmp_path / "dh", CT) as h:
        folder = h.container_dir(CT)
        run_dir = folder / "run"
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text("")
        (run_dir / "train.log").write_text("")
        proc = start_user_script(folder, str(run_dir))
        try:
            session = Session(
                options_for(h), place=Proxmox(CT), run_dir=str(run_dir), readonly=True, telemetry=False
            )
            recorder = Recorder(path, [{"label": "r", "where": f"127.0.0.1 · CT {CT}"}], clock=clock)
            session.subscribe(recorder.subscriber(0))
            app = ConsoleApp(session, readonly=True, target="t", clock=clock)
            captured = []
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, lambda: app.state.trainer is not None, 30, "the trainer")
                for n in range(1, 9):
                    append(run_dir, n)
                    await until(
                        pilot, lambda n=n: f"step {n} done" in app.log_view.lines, 30, f"step {n} on screen"
                    )
                    if n in (3, 8):
                        clock.held = time.time()
                        app.refresh_now(plots=True)
                        app._tick()
                        await pilot.pause(0.3)
                        captured.append((clock.held, screen_text(app)))
                        clock.held = None
                    await pilot.pause(0.2)
            recorder.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    (t1, live1), (t2, live2) = captured
    assert "step 3 done" in live1 and "step 8 done" not in live1 and "step 8 done" in live2
    assert body(live1) != body(live2)
    rec = read(path)
    assert rec.entries and not rec.torn
    replay = ReplayApp(rec)
    async with replay.run_test(size=SIZE) as pilot:
        replay.cursor.toggle_pause()
        for t, live in [*captured, captured[0]]:  # the last one: a jump back
            replay.seek(t)
            replay.refresh_now(plots=True)
            replay._tick()
            # the log pane flushes on its own timer: wait for the same text (or fail showing both)
            with contextlib.suppress(AssertionError):
                await until(pilot, lambda live=live: body(screen_text(replay)) == body(live), 10, "same")
            text = screen_text(replay)
            assert body(text) == body(live), f"live:\n{live}\nreplay:\n{text}"
            assert "REPLAY" in text.splitlines()[0] and "paused" in text.splitlines()[0]

    # status and logs read the record too
    r = cli("status", str(path))
    assert r.returncode == 0 and "step 8/50  loss 0.2500" in r.stdout, r.stdout + r.stderr
    assert "disconnected" in r.stdout  # the record ends with the console closing its link
    r = cli("logs", str(path), "-n", "2")
    assert r.stdout.splitlines() == ["step 7 done", "step 8 done"]


def test_a_record_stops_at_its_size_limit_and_says_so(tmp_path):
    from console.core.events import LogLines

    said = []
    r = Recorder(
        tmp_path / "r.rec", [{"label": "x", "where": "y"}], max_bytes=4096, on_stop=said.append, check_every=1
    )
    for i in range(5000):
        r.write(0, LogLines([f"line {i} {os.urandom(16).hex()}"]))
    assert r.stopped and "size limit (4096 bytes)" in r.stopped and said == [r.stopped]
    rec = read(tmp_path / "r.rec")
    assert 0 < len(rec.entries) < 5000 and rec.notes[-1][1] == r.stopped
    assert (tmp_path / "r.rec").stat().st_size < 4096 + 64 * 1024  # bounded (gzip's last block)


async def test_a_record_of_two_runs_replays_on_the_overview(tmp_path):
    from console.core.events import ConnState, LogLines, Record
    from console.screens.overview import OverviewScreen

    now = [1_000_000.0]
    r = Recorder(
        tmp_path / "two.rec",
        [{"label": "long", "where": "h1 · CT 200"}, {"label": "ablation", "where": "h2 · CT 300"}],
        clock=lambda: now[0],
    )
    for run in (0, 1):
        r.write(run, ConnState("connected", "ok"))
    for n in range(1, 31):  # a step a second; run 1 at twice the step of run 0
        now[0] += 1.0
        for run, step in ((0, n), (1, 2 * n)):
            r.write(run, Record({"t": now[0], "kind": "step", "step": step, "total_steps": 100, "loss": 1.0}))
            r.write(run, LogLines([f"run {run} step {step}"]))
    r.close()
    app = ReplayApp(read(tmp_path / "two.rec"))
    async with app.run_test(size=SIZE) as pilot:
        app.cursor.toggle_pause()
        app.seek(1_000_000.0 + 20)
        assert isinstance(app.screen, OverviewScreen)
        await until(
            pilot, lambda: "20 / 100" in screen_text(app) and "40 / 100" in screen_text(app), 10, "rows"
        )
        await pilot.press("2")
        await until(pilot, lambda: "run 1 step 40" in app.log_view.lines, 10, "run 2's log")
        assert "run 0 step 20" not in app.log_view.lines and "ablation · h2 · CT 300" in screen_text(app)
        await pilot.press("left")  # 10 s back: run 2 at step 20
        await until(
            pilot, lambda: app.state.step == 20 and "run 1 step 22" not in app.log_view.lines, 10, "back"
        )
        await pilot.press("o")
        assert isinstance(app.screen, OverviewScreen)
        await until(pilot, lambda: "10 / 100" in screen_text(app), 10, "run 1 back at step 10")


REPLAY_BIG = r"""
import asyncio, json, sys, time
from console.core.record import Streamed
from console.tui.replay_app import ReplayApp

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

async def main(path):
    before = rss_mb()
    t0 = time.monotonic()
    app = ReplayApp(Streamed(path), speed=1024.0)
    async with app.run_test(size=(130, 40)) as pilot:
        await pilot.pause(0.2)
        drawn = time.monotonic() - t0  # the screen is up, the record mostly unread
        peak = rss_mb()
        app.seek(app.recording.start + 1e9)  # to the end: every event folded, one line at a time
        await pilot.pause(0.2)
        peak = max(peak, rss_mb())
        out = {"drawn": drawn, "grew": peak - before, "last": app.log_view.lines[-1], "end": app.cursor.end}
        print(json.dumps(out), flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_a_record_that_unpacks_big_is_replayed_streaming(tmp_path):
    """A ~1 MB record of log batches that unpacks to 160 MB: the replay's screen is up at once and its
    memory stays far below the record's unpacked size (it was all read, and held, first)."""
    from console.core.events import LogLines

    path = tmp_path / "big.rec"
    t = [1000.0]
    rec = Recorder(path, [{"label": "big", "where": "w"}], max_bytes=1 << 30, clock=lambda: t[0])
    line = "step x " + "loss 0.5 " * 60  # ~550 bytes
    for i in range(150):
        t[0] += 1.0
        rec.write(0, LogLines([f"{i} {j} {line}" for j in range(2000)]))
    t[0] += 1.0
    rec.write(0, LogLines(["the last line"]))
    rec.close()
    assert path.stat().st_size < 4 << 20  # small on disk, ~160 MB unpacked
    r = subprocess.run(
        [sys.executable, "-c", REPLAY_BIG, str(path)], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["drawn"] < 30 and out["grew"] < 80, out  # MB; the record unpacks to ~160 MB
    assert out["last"] == "the last line" and out["end"] == 1151.0, out

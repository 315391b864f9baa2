"""The compare view opened from the overview, live and in a replay.

Live: one devhost (real SSH server in-process) with two containers: CT 200 holds a run that has ended
(its metrics.jsonl, no trainer), CT 201 a stand-in trainer (tests/support/core_util.py) whose records
the test appends; the compare view shows both and follows the live one. Replay: a recorded record of
three runs (tests/support/compare_runs.py): the view follows the cursor, also after a jump back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from console.core.compare import latest
from console.core.fleet import build_runs
from console.core.place import Proxmox
from console.core.record import read
from console.core.targets import Target
from console.screens.compare_help import CompareHelp
from console.screens.overview import OverviewScreen
from console.screens.stop_dialog import StopDialog
from console.tui.compare_screen import CompareScreen
from console.tui.fleet_app import FleetApp
from console.tui.replay_app import ReplayApp
from tests.support.compare_runs import run_records, write_record
from tests.support.core_util import options_for, start_user_script
from tests.support.devhost import devhost_thread
from tests.support.screen_text import screen_text, until

SIZE = (130, 40)
pytestmark = pytest.mark.e2e


def append(run_dir, n: int) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        for rec in (
            {"kind": "step", "step": n, "total_steps": 50, "loss": 3.0 / n, "accept_len_est": 1 + n / 10},
            {
                "kind": "throughput",
                "devices": [
                    {"device": "cpu", "uuid": None, "role": "drafter", "tok_s": 100.0 * n, "busy": 1}
                ],
                "queue": {"depth": 1, "capacity": 4},
            },
        ):
            f.write(json.dumps({"t": time.time(), **rec}) + "\n")


@pytest.fixture
def two_runs(tmp_path):
    with devhost_thread(tmp_path / "dh", 200, 201) as h:
        ended = h.container_dir(200) / "run"
        ended.mkdir()
        (ended / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run_records(1)))
        (ended / "train.log").write_text("ended\n")
        folder = h.container_dir(201)
        live = folder / "run"
        live.mkdir()
        (live / "metrics.jsonl").write_text("")
        (live / "train.log").write_text("live\n")
        proc = start_user_script(folder, str(live))
        try:
            targets = [
                Target(label, options_for(h), Proxmox(ct), str(d), label)
                for label, ct, d in (("ended \x1b]0;pwned\x07run", 200, ended), ("live-run", 201, live))
            ]
            yield build_runs(targets, telemetry=False), live
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def test_compare_from_the_live_overview(two_runs):
    fleet, live = two_runs
    for n in range(1, 4):
        append(live, n)
    app = FleetApp(fleet)
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot,
            lambda: fleet[0].state.step == 300 and fleet[1].state.step == 3 and fleet[1].state.trainer,
            60,
            "the ended run's 300 steps and the live run's 3",
        )
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("c")  # nothing marked: every run
        assert isinstance(app.screen, CompareScreen)
        await until(pilot, lambda: "step 3 / 50" in screen_text(app), 10, "the live run in the legend")
        text = screen_text(app)
        assert "compare 2 of 2 runs" in text and "step 300 / 1,000" in text and "x: step" in text
        assert "ended \ufffdrun" in text and "pwned" not in text  # the label, cleaned
        assert "stopped" in text and "running" in text

        append(live, 4)  # the live path: a new record reaches the open view
        await until(pilot, lambda: "step 4 / 50" in screen_text(app), 10, "step 4 in the compare view")
        assert latest(app.compare.runs[1]).loss == pytest.approx(0.75)

        await pilot.press("x", "e")
        await until(pilot, lambda: "s since the run's first record" in screen_text(app), 10, "by time")
        assert "x: time" in screen_text(app) and "smoothing: EMA 0.6" in screen_text(app)
        await pilot.press("1")  # hide the ended run
        await until(pilot, lambda: "hidden (1 shows it)" in screen_text(app), 10, "run 1 hidden")
        assert "compare 1 of 2 runs" in screen_text(app)

        await pilot.press("s")  # the run-changing keys do nothing here: no run is on screen
        await pilot.pause(0.2)
        assert isinstance(app.screen, CompareScreen) and not isinstance(app.screen, StopDialog)
        await pilot.press("question_mark")
        assert isinstance(app.screen, CompareHelp)
        help_text = screen_text(app)
        assert "Step/time" in help_text and "Smoothing" in help_text and "1-9" in help_text
        assert "Stop" not in help_text and "Overview" in help_text
        await pilot.press("escape", "escape")
        assert isinstance(app.screen, OverviewScreen)

        await pilot.press("down", "m", "c")  # the marked run alone
        assert isinstance(app.screen, CompareScreen) and app.screen.view.chosen == {1}
        await until(pilot, lambda: "compare 1 of 2 runs" in screen_text(app), 10, "the marked run")


async def test_compare_in_a_replay_follows_the_cursor(tmp_path):
    rec = read(write_record(tmp_path / "three.rec"))
    app = ReplayApp(rec)
    t0 = rec.start + 1.0  # tests/support/compare_runs.py's T0
    async with app.run_test(size=SIZE) as pilot:
        app.cursor.toggle_pause()
        app.seek(t0 + 200)
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("c")
        assert isinstance(app.screen, CompareScreen)
        # run 1 a step a second from T0, run 2 every 1.5 s from T0+30, run 3 every 2 s from T0+60
        steps = ("step 200 / 1,000", "step 113 / 1,000", "step 70 / 1,000")
        await until(pilot, lambda: all(s in screen_text(app) for s in steps), 10, "the three runs at T0+200")
        assert "REPLAY" in screen_text(app)

        await pilot.press("right")  # +10 s: the view moves with the cursor
        steps = ("step 210 / 1,000", "step 120 / 1,000", "step 75 / 1,000")
        await until(pilot, lambda: all(s in screen_text(app) for s in steps), 10, "the runs at T0+210")
        await pilot.press("left", "left")  # back 20 s: folded again from the start, nothing from later
        steps = ("step 190 / 1,000", "step 106 / 1,000", "step 65 / 1,000")
        await until(pilot, lambda: all(s in screen_text(app) for s in steps), 10, "the runs at T0+190")
        for i, run in enumerate(app.runs):
            assert latest(app.compare.runs[i]).step == run.state.step
            assert max(p[0] for p in app.compare.runs[i].loss.points()) == run.state.step
            assert latest(app.compare.runs[i]).tok_s == pytest.approx(run.state.tok_s)  # no later record's

        view = app.screen.view
        await pilot.press("x")
        await until(pilot, lambda: "x: time" in screen_text(app), 10, "by time")
        assert view.by == "time" and "s since the run's first record" in screen_text(app)
        await pilot.press("x")
        assert view.by == "step"
        for expected in ("EMA 0.6", "EMA 0.9", "none"):
            await pilot.press("e")
            await until(pilot, lambda e=expected: f"smoothing: {e}" in screen_text(app), 10, expected)
        await pilot.press("2", "3")
        await until(pilot, lambda: "compare 1 of 3 runs" in screen_text(app), 10, "runs 2 and 3 hidden")
        await pilot.press("a")
        await until(pilot, lambda: "compare 3 of 3 runs" in screen_text(app), 10, "all again")
        await pilot.press("o")  # the app's overview key works here too
        assert isinstance(app.screen, OverviewScreen)

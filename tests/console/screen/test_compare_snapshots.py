"""Snapshots (pytest-textual-snapshot) at 130x40 of the compare view over three runs of fixed data
(tests/support/compare_runs.py), replayed from a record with the cursor paused at its end and the
clock's zone fixed (the replay's bar names the cursor's local time). Regenerate after a deliberate
change with ``pytest tests/console/screen/test_compare_snapshots.py --snapshot-update`` and look at the SVGs."""

import time

import pytest

from console.core.record import read
from console.tui.compare_screen import CompareScreen
from console.tui.replay_app import ReplayApp
from tests.support.compare_runs import write_record

SIZE = (130, 40)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def run_before(*keys: str):
    async def run(pilot) -> None:
        app = pilot.app
        app.cursor.toggle_pause()
        app.seek(app.cursor.end)
        await pilot.pause()
        await pilot.press("c", *keys)
        assert isinstance(app.screen, CompareScreen)
        await pilot.pause()
        app.screen.redraw(True)
        await pilot.pause()

    return run


def test_compare_by_step(snap_compare, tmp_path, utc):
    app = ReplayApp(read(write_record(tmp_path / "three.rec")))
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before())


def test_compare_by_time_smoothed(snap_compare, tmp_path, utc):
    app = ReplayApp(read(write_record(tmp_path / "three.rec")))
    assert snap_compare(app, terminal_size=SIZE, run_before=run_before("x", "e"))

"""Launch, stop and quit from the screen, against the in-process SSH server and the real tiny trainer.

What issue 34 (item 0) tripped over: a launch from the screen left its dialog open on success, and a
modal dialog keeps every app key from the app, so the ``s`` pressed once the first figures showed did
nothing, silently (and the ``y`` after it stopped nothing). After a stop the dialog kept ``q`` from the
app the same way. Here: the launch dialog closes and the screen says what started, ``s`` as soon as the
figures show opens the stop dialog, ``y`` stops the trainer, ``q`` on the finished dialog quits.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from console.screens.launch_dialog import LaunchDialog
from console.screens.stop_dialog import StopDialog
from tests.console.screen.test_app_live import alive
from tests.support.core_util import options_for
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until
from tests.support.trainer_run import ROOT, tiny_flags

CT = 200
SIZE = (130, 40)
pytestmark = pytest.mark.e2e


host = devhost_fixture(CT)


@pytest.fixture
def leftovers():
    """Trainers a failing test would leave running: killed at the end."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_launch_then_s_at_the_first_figures_then_y_then_q(host, tiny_assets, leftovers):
    run_dir = host.container_dir(CT) / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    app = ConsoleApp(
        Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False), target="devhost"
    )
    quits: list[int] = []
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot, lambda: app.state.trainer_known and app.state.conn.state == "connected", 30, "connected"
        )
        await pilot.press("l")
        dlg = app.screen
        assert isinstance(dlg, LaunchDialog)
        dlg.query_one("#flags").value = shlex.join(tiny_flags(tiny_assets, run_dir, "--epochs", "1000"))
        dlg.query_one("#python").value = sys.executable
        dlg.query_one("#code_dir").value = str(ROOT)
        await pilot.pause()  # the flags field grows to show every flag: the button moves down
        await pilot.click("#launch")
        try:
            await until(
                pilot, lambda: not isinstance(app.screen, LaunchDialog), 240, "the launch dialog to close"
            )
        finally:
            if app.state.trainer is not None:
                leftovers.append(app.state.trainer.pid)
        launched = [e.text for e in app.state.events if e.text.startswith("launched pid ")]
        assert len(launched) == 1 and "launched, PID" not in launched[0], launched  # said once, in the events
        await until(
            pilot,
            lambda: (
                app.state.trainer is not None and app.state.step is not None and "│ step " in screen_text(app)
            ),
            240,
            "the first figures",
        )
        pid = app.state.trainer.pid
        leftovers.append(pid)
        await pilot.press("s")  # at once: the key must reach the app
        await until(pilot, lambda: isinstance(app.screen, StopDialog), 5, "the stop dialog")
        stop = app.screen
        await pilot.press("y")
        await until(pilot, lambda: stop.done, 120, "the stop")
        assert stop.result.code == 0, screen_text(app)
        app.exit = lambda *a, **kw: quits.append(1)  # (the real exit would end run_test at once)
        await pilot.press("q")  # on the finished dialog: the app's quit
        await until(pilot, lambda: quits, 5, "q to quit")
    assert not alive(pid)

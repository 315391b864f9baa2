"""The screen's ``r`` means what the CLI's ``restart`` does (issue 34, item 3; issue 33, item 8): with no
trainer running it offers the relaunch of run.json's command with ``--resume auto`` behind a
confirmation, shows the interpreter, code directory and command first, and a code directory outside the
deployed ones needs a typed ``trust`` (``y`` alone runs nothing). The real session over the in-process
SSH server; a fake ``trainer`` package that leaves a mark when it runs (tests/support/fake_code.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from textual.widgets import Input

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from console.screens.restart_dialog import RestartDialog
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture
from tests.support.fake_code import other_code, run_json_for
from tests.support.screen_text import screen_text, until

pytestmark = pytest.mark.e2e

SIZE = (130, 40)


host = devhost_fixture()


@pytest.fixture
def short_dir():
    """A folder with a short path. The dialog keeps "code directory: PATH" on one line only while it fits
    the dialog (a longer path moves whole to the next line), and pytest-xdist's tmp paths are longer."""
    d = Path(tempfile.mkdtemp(prefix="c", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def test_r_without_a_trainer_offers_the_relaunch_and_asks_trust_for_other_code(host, short_dir):
    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / "r"
    run_dir.mkdir(parents=True)
    code = other_code(short_dir / "code")
    run_json_for(run_dir, ct_dir, code)
    session = Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False)
    app = ConsoleApp(session, target=f"devhost · CT {CT}")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.trainer_known, 30, "the look for a trainer")
        assert app.state.trainer is None
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, RestartDialog), 30, "the restart dialog")
        dlg = app.screen
        await until(pilot, lambda: "--resume auto" in screen_text(app), 10, "the restart's command")
        text = screen_text(app)
        assert "Launch the run again?" in text and "--resume auto" in text
        assert f"interpreter: {sys.executable}" in text and f"code directory: {code}" in text
        assert "command: " in text and "! the code directory" in text
        await pilot.press("y")  # y alone does not cover what only run.json vouches for
        await pilot.pause(0.3)
        assert dlg.started_at is None and not (run_dir / "RAN").exists()
        dlg.query_one("#trust", Input).focus()
        await pilot.press(*"trust", "enter")
        await until(pilot, lambda: dlg.done, 120, "the relaunch")
        assert (run_dir / "RAN").read_text().endswith("--resume auto"), screen_text(app)
        assert "restarted: launched pid" in screen_text(app)
        await until(pilot, lambda: "Run launched again" in screen_text(app), 5, "the title to say so")
        text = screen_text(app)  # what happened, not the words of the moment it began
        assert "Launching the run again" not in text and "no trainer found" not in text, text
        assert f"PID {dlg.result.trainer.pid} (launched)" in text
        assert " ".join(text.split()).count("restarted: launched pid") == 1, text  # said once


async def test_the_launch_dialogs_run_json_prefill_needs_trust_for_other_code(host, short_dir):
    """Issue 55: the launch dialog prefills run.json's code dir; Tab, Enter does not run a planted
    ``trainer/`` on run.json's word: the restart's rules list it, and ``trust`` must be typed."""
    from console.screens.launch_dialog import LaunchDialog

    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / "l"
    run_dir.mkdir(parents=True)
    code = other_code(short_dir / "planted")
    run_json_for(run_dir, ct_dir, code)
    session = Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False)
    app = ConsoleApp(session, target=f"devhost · CT {CT}")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.trainer_known and session.run, 30, "the run's run.json")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, LaunchDialog), 30, "the launch dialog")
        dlg = app.screen
        await pilot.press("enter")  # the flags field has focus: Enter launches
        await until(pilot, lambda: "! the code directory" in screen_text(app), 30, "the concerns")
        assert code in screen_text(app) and not dlg.busy and not (run_dir / "RAN").exists()
        dlg.query_one("#trust", Input).focus()
        await pilot.press(*"trust", "enter")
        await until(pilot, lambda: (run_dir / "RAN").exists(), 120, "the launch")

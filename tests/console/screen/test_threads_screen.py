"""The threads view (``t``) through the real SSH server against a stand-in run of real processes
(tests/support/threads_standin.py): a hostile thread name shown cleaned and as plain text (no markup), a
child that exits while the view is open said in it, folding a process, and ``p`` saying plainly that
py-spy is not in the container. The real trainer's view: test_threads_live.py."""

from __future__ import annotations

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from console.screens.threads import ThreadsScreen
from tests.support.core_util import CT, alive, options_for, wait_until
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until
from tests.support.threads_standin import (
    HOSTILE_SHOWN,
    no_pyspy_env,
    python_without_pyspy,
    threads_standin,
)

pytestmark = pytest.mark.e2e

SIZE = (150, 40)


host = devhost_fixture(env=no_pyspy_env)


@pytest.fixture
def run(host, tmp_path):
    run_dir = host.container_dir(CT) / "run"
    python = python_without_pyspy(tmp_path / "py")
    with threads_standin(host.container_dir(CT), run_dir, python=python) as (p, child):
        yield p, child, run_dir


async def test_threads_view_hostile_name_exit_fold_and_no_pyspy(host, run):
    p, child, run_dir = run
    session = Session(
        options_for(host), place=Proxmox(CT), run_dir=str(run_dir), readonly=True, telemetry=False
    )
    app = ConsoleApp(session, readonly=True, target="devhost")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.trainer is not None, 30, "the trainer")
        await pilot.press("t")  # read-only: the view is there all the same
        scr = app.screen
        assert isinstance(scr, ThreadsScreen)
        await until(pilot, lambda: scr.samples >= 2, 30, "two samples")
        await until(pilot, lambda: "dflash-spin" in screen_text(app), 10, "the table")
        text = screen_text(app)
        assert HOSTILE_SHOWN in text  # cleaned, and "[b]" shown as it is (no markup applied)
        assert "\x1b" not in text and "]0;pwn" not in text
        assert "dflash-launch" in text and "target0" in text and "trainer" in text
        assert f"Threads of the trainer pid {p.pid}" in text

        (run_dir / "child-exit").touch()  # the child exits while the view is open
        wait_until(lambda: not alive(child), 20, "the child's exit")
        await until(pilot, lambda: f"pid {child} (target0) exited" in screen_text(app), 20, "the exit said")
        assert scr.snap.find(child) is None

        await pilot.press("home")  # the trainer's row (the only process now): fold its threads
        assert scr.selected().key == f"p{p.pid}"
        await pilot.press("enter")
        await until(pilot, lambda: "dflash-spin" not in screen_text(app), 10, "the threads folded")
        await pilot.press("enter")
        await until(pilot, lambda: "dflash-spin" in screen_text(app), 10, "the threads unfolded")

        await pilot.press("p")
        await until(pilot, lambda: scr.dump is not None, 30, "the py-spy answer")
        assert not scr.dump.ok and not scr.dump.found
        await until(pilot, lambda: "py-spy is not in the container" in screen_text(app), 10, "it said so")
        await pilot.press("escape")
        assert not isinstance(app.screen, ThreadsScreen)
    assert alive(p.pid)  # the view only looked

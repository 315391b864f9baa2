"""A trainer without the run-directory contract (the user's own script, found by its command line) on the
screen: the empty log pane says where the console looks for the log, and the stop dialog promises no
checkpoint it cannot know of."""

from __future__ import annotations

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from tests.support.core_util import CT, options_for, start_user_script
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until

pytestmark = pytest.mark.e2e
host = devhost_fixture()


async def test_the_screen_says_what_it_cannot_know_of_a_trainer_without_the_contract(host):
    folder = host.container_dir(CT)
    p = start_user_script(folder, "runs/mine")
    run_dir = str(folder / "runs" / "mine")
    try:
        session = Session(options_for(host), place=Proxmox(CT), run_dir=run_dir, telemetry=False)
        app = ConsoleApp(session, target="devhost")
        async with app.run_test(size=(130, 40)) as pilot:
            await until(pilot, lambda: app.state.trainer is not None, 60, "the script found")
            shown = lambda: "following  0 lines (no train.log yet: " in screen_text(app)  # noqa: E731
            await until(pilot, shown, 30, "the empty log pane's hint")
            assert app.log_view.empty_hint.endswith(f"writes it in {run_dir})")
            await pilot.press("s")
            said = "none seen: this trainer writes no records the console reads"
            await until(pilot, lambda: said in screen_text(app), 30, "the stop dialog's checkpoint line")
            assert "a stop writes one" not in screen_text(app)
            await pilot.press("n")
    finally:
        p.kill()
        p.wait(10)

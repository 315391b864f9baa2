"""Several runs on one devhost (two containers, no trainer needed): leaving the overview for a run and
coming back with ``o`` brings back the same live overview, drawn on the terminal; help lists the keys
of the screen it is opened on (the run's ``o``, the overview's Enter, m, c, 1-9)."""

from __future__ import annotations

import pytest

from console.core.fleet import build_runs
from console.core.place import Proxmox
from console.core.targets import Target
from console.screens.help import HelpScreen
from console.screens.overview import OverviewScreen
from console.tui.fleet_app import FleetApp
from tests.support.core_util import options_for
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until

SIZE = (130, 40)
pytestmark = pytest.mark.e2e

two_cts = devhost_fixture(200, 201)


def _app(h) -> FleetApp:
    targets = [Target(f"run{ct}", options_for(h), Proxmox(ct), "run", f"run{ct}", False) for ct in (200, 201)]
    return FleetApp(build_runs(targets, telemetry=False))


def _help_keys(app) -> dict[str, str]:
    assert isinstance(app.screen, HelpScreen)
    return {key: title for key, title, _tip in app.screen.rows}


async def test_o_brings_back_the_same_live_overview_and_draws_it(two_cts):
    app = _app(two_cts)
    async with app.run_test(size=SIZE) as pilot:
        overview = app.overview
        table = overview.query_one("#table")
        await until(pilot, lambda: "run201" in screen_text(app), 30, "the overview's rows")
        await pilot.press("1")
        await until(pilot, lambda: not isinstance(app.screen, OverviewScreen), 10, "run 1's screen")
        # opening a run keeps the overview alive (a screen taken down and pushed again never repainted
        # the terminal: the run's screen stayed on it while the keys went to the overview)
        assert overview.is_running and table.is_attached
        drawn = []
        display = app._display
        app._display = lambda screen, update: (drawn.append(screen), display(screen, update))[1]
        await pilot.press("o")
        assert app.screen is overview and overview.query_one("#table") is table
        await until(pilot, lambda: overview in drawn, 10, "the overview drawn on the terminal")
        assert "run200" in screen_text(app) and "Open run" in screen_text(app)
        await pilot.press("2")
        assert app.current == 1


async def test_help_lists_the_keys_of_the_screen_it_is_opened_on(two_cts):
    app = _app(two_cts)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "run201" in screen_text(app), 30, "the overview's rows")
        await pilot.press("question_mark")
        keys = _help_keys(app)
        assert {"Enter", "m", "c", "o", "1-9", "q"} <= set(keys), keys
        assert keys["c"] == "Compare" and keys["o"] == "Sort"
        assert "s" not in keys and "n / N" not in [k for k, _ in app.screen.extra]  # no run, no log here
        await pilot.press("escape", "1", "question_mark")
        keys = _help_keys(app)
        assert keys["o"] == "Overview" and keys["c"] == "Checkpoints and disk", keys
        assert {"s", "r", "l", "d", "t", "/", "q"} <= set(keys)
        text = screen_text(app)
        assert "back to the overview of every run" in text and "next / previous match" in text

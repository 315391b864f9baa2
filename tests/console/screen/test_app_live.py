"""The screen against the in-process SSH server (console/devhost) and the real tiny trainer.

One trainer, launched through the console's own launch path, is shared by the module: the reading
tests run first and the last test stops it through the stop dialog (file order is kept by pytest).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from console.app import ConsoleApp
from console.core.options import ConnectOptions
from console.core.place import Proxmox
from console.core.session import ReadOnlyError, Session
from console.screens.stop_dialog import StopDialog
from tests.support.core_util import options_for
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until
from tests.support.trainer_run import FAULT_SITE, ROOT, tiny_flags

CT = 200
SIZE = (120, 36)
pytestmark = pytest.mark.e2e


host = devhost_fixture(CT, scope="module")


@pytest.fixture(scope="module")
def trainer(host, tiny_assets):
    """A tiny trainer in container 200, launched through Session.launch; killed at the end if alive.

    Its first checkpoint save (the stop's: no periodic saves) pauses after writing its files until
    ``run_dir/../release`` exists (tests/support/faults.py, on the trainer's PYTHONPATH), so that the last
    test can run a stop into its timeout first."""
    run_dir = host.container_dir(CT) / "run"
    release = host.container_dir(CT) / "release"
    env = {
        "OMP_NUM_THREADS": "1",
        "DFLASH_TEST_PAUSE_AT": "files_written",
        "DFLASH_TEST_PAUSE_UNTIL": str(release),
        "PYTHONPATH": FAULT_SITE,  # the tests' fault module (tests/support/faults.py): the trainer reads no hook
    }

    async def launch():
        async with Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False) as s:
            res = await s.launch(
                tiny_flags(tiny_assets, run_dir, "--epochs", "1000"), code_dir=str(ROOT), env=env, wait_s=120
            )
            assert res.code == 0, res.message
            return res.trainer

    info = asyncio.run(launch())
    yield run_dir, info
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def make_app(host, run_dir: Path, readonly: bool = False) -> ConsoleApp:
    session = Session(
        options_for(host), place=Proxmox(CT), run_dir=str(run_dir), readonly=readonly, telemetry=False
    )
    return ConsoleApp(session, readonly=readonly, target=f"devhost · CT {CT}")


async def test_table_graphs_and_log_fill_from_the_live_trainer(host, trainer):
    run_dir, info = trainer
    app = make_app(host, run_dir)
    async with app.run_test(size=SIZE) as pilot:
        st = app.state
        await until(
            pilot,
            lambda: (
                st.trainer is not None
                and st.step is not None
                and len(st.loss_hist) >= 2
                and len(st.tok_hist) >= 2
                and (st.tok_s or 0) > 0
            ),
            60,
            "steps and throughput",
        )
        await pilot.pause(0.7)  # one plot refresh period
        text = screen_text(app)
        assert f"trainer PID {info.pid}" in text and "● CONNECTED" in text
        rows = {r.role: r for r in st.rows()}
        assert rows["drafter"].label == "cpu" and rows["target"].label == "cpu"
        assert "drafter" in text and "target" in text
        shown = re.search(rf"step +([\d,]+) / {st.total_steps:,}", text)
        assert shown and 1 <= int(shown.group(1).replace(",", "")) <= st.step
        assert app.w_toks._seen is not None and app.w_loss._seen[0] >= 2  # the graphs hold live points
        assert "loss" in text and "tok/s" in text
        await until(pilot, lambda: any(ln.startswith("step ") for ln in app.log_view.lines), 10, "log lines")


async def test_readonly_hides_every_changing_action(host, trainer):
    run_dir, info = trainer
    app = make_app(host, run_dir, readonly=True)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.trainer is not None, 30, "the trainer")
        await until(pilot, lambda: "Quit" in screen_text(app), 30, "the footer drawn")  # under load it lags
        text = screen_text(app)
        assert "READ-ONLY" in text and "Quit" in text
        for label in ("Stop", "Restart", "Launch", "Deploy"):
            assert f" {label} " not in text.splitlines()[-1]
        await pilot.press("s", "r", "l", "d")
        assert len(app.screen_stack) == 1
        with pytest.raises(ReadOnlyError):
            await app.session.stop_trainer()
    assert alive(info.pid)  # untouched


async def test_a_dropped_server_shows_and_then_clears(host, trainer):
    run_dir, _ = trainer
    app = make_app(host, run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot, lambda: "● CONNECTED" in screen_text(app) and app.state.step is not None, 30, "connected"
        )
        down = asyncio.ensure_future(asyncio.to_thread(host.restart, 2.0))  # down for 2 s, same port
        await until(
            pilot,
            lambda: "RECONNECTING" in (t := screen_text(app)) and "retry in" in t,
            10,
            "the drop on screen",
        )
        await down
        await until(pilot, lambda: "● CONNECTED" in screen_text(app), 30, "reconnected, on screen")
        step = app.state.step
        await until(pilot, lambda: (app.state.step or 0) > (step or 0), 30, "new steps after the drop")


async def test_a_host_that_is_down_at_start_is_retried_until_it_is_up(tmp_path):
    from console.devhost.server import DevHost

    h = DevHost(tmp_path)
    await h.start()
    await h.stop()  # keys and port kept; nothing listens now
    h.add_container(CT)
    opts = ConnectOptions(
        host=h.host,
        port=h.port,
        user=h.user,
        identity_files=[str(h.client_key_path)],
        known_hosts=str(h.known_hosts_path),
        config_files=[],
    )
    app = ConsoleApp(Session(opts, place=Proxmox(CT), telemetry=False), target="devhost")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(
                pilot,
                lambda: "RECONNECTING" in (t := screen_text(app)) and "retry in" in t and "cannot reach" in t,
                20,
                "the failed first connect on screen",
            )
            await h.start()
            await until(pilot, lambda: "● CONNECTED" in screen_text(app), 30, "the host coming up on screen")
    finally:
        await h.stop()


async def test_deploy_key_deploys_beside_the_running_trainer(host, trainer):
    run_dir, info = trainer
    app = make_app(host, run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.trainer is not None, 30, "the trainer")
        await pilot.press("d")
        await until(
            pilot, lambda: any(e.text.startswith("deployed to ") for e in app.state.events), 60, "the deploy"
        )
        where = next(e.text for e in app.state.events if e.text.startswith("deployed to ")).split(" ", 2)[2]
        await until(pilot, lambda: "deployed to" in screen_text(app), 10, "the deploy in the panel's events")
        assert (Path(where) / "trainer" / "pipeline.py").is_file()
        await pilot.press("l")  # a launch (and a restart) from here runs the code just deployed
        assert app.screen.query_one("#code_dir").value == where
        await pilot.press("escape")
    assert alive(info.pid)  # a deploy never touches the running trainer


def _figures_shown(app) -> bool:
    """The training panel's step row holds the trainer's step (the first figures are on screen)."""
    return app.state.step is not None and re.search(r"│ step +[\d,]+ / ", screen_text(app)) is not None


async def test_s_opens_the_stop_dialog_as_soon_as_the_first_figures_show_every_time(host, trainer):
    """Item 0 of issue 34: 20 fresh connections in a row, ``s`` pressed the moment the figures appear;
    each time the dialog opens and Escape closes it without stopping anything."""
    run_dir, info = trainer
    for attempt in range(20):
        app = make_app(host, run_dir)
        async with app.run_test(size=(130, 40)) as pilot:
            await until(pilot, lambda app=app: _figures_shown(app), 60, f"the first figures ({attempt})")
            await pilot.press("s")
            await until(
                pilot, lambda app=app: isinstance(app.screen, StopDialog), 5, f"the dialog ({attempt})"
            )
            assert f"PID {info.pid}" in screen_text(app) and app.focused.id == "no"
            await pilot.press("escape")
            assert not isinstance(app.screen, StopDialog), attempt
    assert alive(info.pid)


async def test_stop_dialog_times_out_then_counts_down_to_exited(host, trainer):
    run_dir, info = trainer
    app = make_app(host, run_dir)
    app.stop_timeout = 4.0
    async with app.run_test(size=SIZE) as pilot:
        await until(
            pilot, lambda: app.state.trainer is not None and app.state.step is not None, 30, "trainer"
        )
        await pilot.press("s")
        dlg = app.screen
        assert isinstance(dlg, StopDialog) and app.focused.id == "no"
        assert f"PID {info.pid}" in screen_text(app)
        await pilot.press("y")
        # the save is held (see the fixture): the stop gives up at its timeout and says what to do
        await until(pilot, lambda: dlg.done, 60, "the stop to time out")
        await until(pilot, lambda: "it was left running" in screen_text(app), 10, "the stop's verdict shown")
        text = screen_text(app)
        assert dlg.result.code == 3, text
        assert "still running after 4 s; it was left running, not killed" in text
        assert f"kill -KILL {info.pid}" in text and "✔ SIGINT sent" in text
        assert alive(info.pid)
        await pilot.press("escape")

        app.stop_timeout = 90.0  # asked again: the trainer is still saving from the first SIGINT
        await pilot.press("s")
        dlg = app.screen
        await pilot.press("y")
        await until(pilot, lambda: "signal_sent" in dlg.phases, 30, "the second signal")
        (run_dir.parent / "release").touch()  # now the held save may finish
        await until(pilot, lambda: dlg.done, 90, "the second stop to finish")
        await until(pilot, lambda: "✔ checkpoint saved" in screen_text(app), 10, "the stop's end shown")
        text = screen_text(app)
        assert "exited" in dlg.phases and dlg.result.code == 0, text
        assert "✔ trainer exited" in text and "✔ checkpoint saved" in text
        latest = (run_dir / "checkpoints" / "latest").read_text().strip()
        assert (run_dir / "checkpoints" / Path(latest).name).is_dir()
        await pilot.press("escape")
        assert not isinstance(app.screen, StopDialog)
        await until(pilot, lambda: app.state.trainer is None, 10, "the trainer gone")
    assert not alive(info.pid)


async def test_launch_after_the_run_ended_is_prefilled_from_its_run_json(host, tmp_path):
    """No trainer runs, but the run directory holds the ended run's run.json: `l` offers its flags and
    interpreter (it said "prefilled from nothing" when the trainer had ended before the console connected)."""
    import json
    import shlex
    import sys

    from console.screens.flags_area import FlagsArea
    from console.screens.launch_dialog import LaunchDialog

    run_dir = tmp_path / "ended"
    run_dir.mkdir()
    argv = ["--target-model", "tiny/target", "--output-dir", str(run_dir), "--lr", "1e-2"]
    record = {"pid": 2**22 - 1, "start_time": 1, "argv": argv, "interpreter": sys.executable}
    (run_dir / "run.json").write_text(json.dumps(record))
    app = make_app(host, run_dir)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.session.run is not None, 30, "run.json read by the session")
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, LaunchDialog), 10, "the launch dialog")
        await until(
            pilot, lambda: "prefilled from the last run's run.json" in screen_text(app), 10, "the prefill"
        )
        assert app.screen.query_one("#flags", FlagsArea).value == shlex.join(argv)

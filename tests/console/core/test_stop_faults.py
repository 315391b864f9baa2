"""A stop under faults, against the in-process SSH server and a stand-in trainer that keeps the run-dir
contract (tests/support/standin.py): every phase shown in order however the events arrive, and a stop
that outlives the link (here the trainer is gone when the link comes back; the CLI's test of a trainer
still saving after a server restart is in tests/console/cli/test_cli_faults.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from console.app import ConsoleApp
from console.core.events import ActionPhase, Outcome
from console.core.place import Proxmox
from console.core.session import Session
from console.core.state import ConsoleState
from console.screens.stop_dialog import StopDialog
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until
from tests.support.standin import start_contract_trainer

pytestmark = pytest.mark.e2e

host = devhost_fixture(asynchronous=True)


def _reap(p) -> str:
    if p.poll() is None:
        p.kill()
    p.wait(10)
    return p.stdout.read()


async def test_fast_save_every_phase_in_order_in_the_session_and_the_dialog(host):
    """All of the stop's events land in metrics.jsonl in one write and the trainer exits at once."""
    folder = host.container_dir(CT)
    p = start_contract_trainer(folder, folder / "run", STANDIN_MODE="fast")
    dlg = StopDialog("stop", ConsoleState(), runner=None)
    phases: list[ActionPhase] = []

    def on_phase(ph: ActionPhase) -> None:
        phases.append(ph)
        dlg.on_phase(ph)

    try:
        async with Session(
            options_for(host), place=Proxmox(CT), run_dir=str(folder / "run"), telemetry=False
        ) as s:
            res = await s.stop_trainer(timeout=30, on_phase=on_phase)
    finally:
        out = _reap(p)
    assert res.code == Outcome.OK, res
    names = [ph.phase for ph in phases]
    assert names == ["verifying", "signal_sent", "signal_sent", "saving", "saved", "exited"], names
    assert phases[3].detail == "saving checkpoint at step 7"
    dlg.done, dlg.result = True, res
    text = dlg.phases_text().plain
    assert "(not seen)" not in text, text
    for label in ("check PID", "SIGINT sent", "saving checkpoint", "checkpoint saved", "trainer exited"):
        assert f"✔ {label}" in text, text
    assert "signals 1" in out


async def test_link_down_until_the_trainer_exited_screen_reports_it_from_the_run_dir(host, tmp_path):
    """The screen's stop: SIGINT, the save is held, the server goes down; the save ends and the trainer
    exits while nobody is connected; the server comes back: the dialog reports the saved checkpoint
    (events and latest read from the run directory), and the trainer got exactly one SIGINT."""
    folder = host.container_dir(CT)
    release = tmp_path / "release"
    p = start_contract_trainer(folder, folder / "run", STANDIN_MODE="hold", STANDIN_RELEASE=str(release))
    session = Session(options_for(host), place=Proxmox(CT), run_dir=str(folder / "run"), telemetry=False)
    app = ConsoleApp(session, target=f"devhost · CT {CT}")
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.state.trainer is not None, 30, "the trainer found")
            await pilot.press("s")
            dlg = app.screen
            assert isinstance(dlg, StopDialog)
            await pilot.press("y")
            await until(pilot, lambda: "saving" in dlg.phases, 30, "the save begun")
            await host.stop()  # the link drops mid-save
            await until(
                pilot, lambda: any(ph.phase == "reconnecting" for ph in dlg.extra), 30, "the drop seen"
            )
            release.touch()
            assert await asyncio.to_thread(p.wait, 30) == 0  # saved and gone while the link is down
            await host.start()
            await until(pilot, lambda: dlg.done, 60, "the stop's outcome")
            await pilot.pause(0.2)
            text = screen_text(app)
            assert dlg.result.code == Outcome.OK, text
            assert "stopped while the link was down" in dlg.result.message
            assert "step_00000007" in dlg.result.message and "from the run directory" in dlg.result.message
            assert "✔ checkpoint saved" in text and "(not seen)" not in text and "✔ link back" in text, text
            back = [ph.detail for ph in dlg.extra if ph.phase == "reconnected"]
            assert back and "exited while the link was down" in back[-1]
    finally:
        out = _reap(p)
    assert "signals 1" in out


def _run_json(run) -> dict:
    return json.loads((run / "run.json").read_text())


async def test_a_run_json_swapped_to_name_her_own_trainer_is_no_success(host):
    """The real trainer trains in RUN; a writer of RUN starts her own trainer-like process there (its
    run.json names it, its events claim a save). The stop signals hers, as the identity rule allows,
    and says the real one still runs: never "stopped"."""
    folder = host.container_dir(CT)
    run = folder / "run"
    real = start_contract_trainer(folder, run, STANDIN_MODE="fast")
    hers = start_contract_trainer(folder / "hers", run, STANDIN_MODE="fast")
    assert _run_json(run)["pid"] == hers.pid
    phases: list[ActionPhase] = []
    try:
        async with Session(options_for(host), place=Proxmox(CT), run_dir=str(run), telemetry=False) as s:
            res = await s.stop_trainer(timeout=30, on_phase=phases.append)
        assert res.code != Outcome.OK, res
        assert f"still running with --output-dir {run}: pid {real.pid}" in res.message, res.message
        assert "the run is not stopped" in res.message
        assert any(f"also running with --output-dir {run}: pid {real.pid}" in ph.detail for ph in phases)
        assert real.poll() is None  # the real trainer was not signalled, and trains on
    finally:
        _reap(hers)
        _reap(real)


async def test_run_json_rewritten_before_the_signal_refuses_the_stop(host):
    """The console found the trainer through run.json; run.json is rewritten before the stop's signal:
    the stop is refused, nothing is signalled."""
    folder = host.container_dir(CT)
    run = folder / "run"
    real = start_contract_trainer(folder, run, STANDIN_MODE="fast")
    try:
        async with Session(
            options_for(host), place=Proxmox(CT), run_dir=str(run), telemetry=False, rescan_s=600
        ) as s:
            assert s.trainer is not None and s.trainer.pid == real.pid
            forged = {**_run_json(run), "pid": 1, "start_time": 1}
            (run / "run.json").write_text(json.dumps(forged))
            res = await s.stop_trainer(timeout=30)
        assert res.code == Outcome.REFUSED, res
        assert "run.json was rewritten since the trainer was found: run.json now names pid 1" in res.message
        assert "nothing was signalled" in res.message and real.poll() is None
    finally:
        _reap(real)


async def test_run_json_rewritten_during_the_stop_is_said_and_no_success(host, tmp_path):
    """run.json is rewritten while the trainer saves: the verdict is about the signalled process (it did
    save and exit), and says run.json changed; it is not reported as a success."""
    folder = host.container_dir(CT)
    run = folder / "run"
    release = tmp_path / "release"
    p = start_contract_trainer(folder, run, STANDIN_MODE="hold", STANDIN_RELEASE=str(release))
    saving = asyncio.Event()

    def on_phase(ph: ActionPhase) -> None:
        if ph.phase == "saving":
            saving.set()

    try:
        async with Session(options_for(host), place=Proxmox(CT), run_dir=str(run), telemetry=False) as s:
            stop = asyncio.ensure_future(s.stop_trainer(timeout=60, on_phase=on_phase))
            await asyncio.wait_for(saving.wait(), 30)
            (run / "run.json").write_text(json.dumps({**_run_json(run), "pid": 1, "start_time": 1}))
            release.touch()
            res = await asyncio.wait_for(stop, 60)
        assert res.code != Outcome.OK, res
        assert "checkpoint" in res.message and f"pid {p.pid} exited" in res.message
        assert (
            "run.json was rewritten during the stop: run.json now names pid 1 (start time 1)" in res.message
        )
    finally:
        assert "signals 1" in _reap(p)

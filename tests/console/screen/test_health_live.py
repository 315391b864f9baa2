"""Health end to end: the real tiny trainer in the devhost's container, watched by the screen; killed
with SIGKILL, the screen raises a critical alert within a second of the exit (bar, toast, bell) and
``status --check`` exits 2. On the way: its checkpoint list read through the helper, and
``status --check`` OK (0) while it runs and UNKNOWN (3) where it cannot look."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest
from textual.widgets import DataTable, Input

from console.app import ConsoleApp
from console.core.checkpoints import scan
from console.core.place import Proxmox
from console.core.session import Session
from console.screens.alerts import AlertsScreen
from console.screens.checkpoints_dialog import CheckpointsScreen
from console.screens.health_hooks import HealthHooks
from tests.support.core_util import cli, conn_args, options_for
from tests.support.devhost import devhost_thread
from tests.support.screen_text import screen_text, until
from tests.support.trainer_run import ROOT, tiny_flags

CT = 200
pytestmark = pytest.mark.e2e


@pytest.fixture
def host(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no operator's config in the way
    with devhost_thread(tmp_path / "devhost", CT) as h:
        yield h


async def test_sigkill_raises_a_critical_alert_within_a_second_and_check_exits_2(host, tiny_assets, tmp_path):
    run_dir = host.container_dir(CT) / "run"
    session = Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False)
    hooks = HealthHooks(disk_interval_s=0.5)
    app = ConsoleApp(session, target="devhost", health=hooks)
    pid = None
    try:
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: session.connected, 30, "connected")
            res = await session.launch(
                tiny_flags(tiny_assets, run_dir, "--epochs", "1000", "--save-every", "1"),
                code_dir=str(ROOT),
                env={"OMP_NUM_THREADS": "1"},
                wait_s=120,
            )
            assert res.code == 0, res.message
            pid = res.trainer.pid
            st = app.state
            await until(
                pilot,
                lambda: st.ckpt_step is not None and st.disk is not None and st.disk.latest is not None,
                90,
                "a periodic checkpoint and a disk scan that lists it",
            )
            # the checkpoint list of the real run directory, through the helper
            info = await scan(session.helper, str(run_dir), session.run)
            assert info.free_bytes > 0 and info.total_bytes >= info.free_bytes and info.keep == 2
            latest = info.latest_entry
            assert latest is not None and latest.complete and latest.bytes > 0 and latest.step >= 1
            assert latest.path == str(run_dir / "checkpoints" / latest.name)
            named = [c for c in info.checkpoints if c.step is not None]  # (a save may be under way: .tmp-)
            # the trainer keeps 2, pruning the oldest just after the newest is complete: a scan in between sees 3
            assert all(c.complete for c in named) and len(named) <= 3
            assert st.health.alerts() == [] and hooks.rang == 0  # a healthy run: quiet

            r = await asyncio.to_thread(cli, "status", *conn_args(host), "--run-dir", str(run_dir), "--check")
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.startswith("DFLASH OK: trainer PID") and r.stdout.count("\n") == 1

            t_kill = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            await until(pilot, lambda: "trainer_exit" in st.health.active, 10, "the alert")
            took = time.monotonic() - t_kill
            assert took < 1.0, f"alert {took:.2f} s after the exit"
            print(f"alert {took:.3f} s after SIGKILL")
            a = st.health.active["trainer_exit"]
            assert a.level == "critical" and "without a stop request" in a.message
            await pilot.pause(0.1)
            app.refresh_now()
            await pilot.pause()
            text = screen_text(app)
            assert "CRITICAL" in text and "trainer exited without a stop request" in text
            assert hooks.rang == 1 and any("CRITICAL" in str(n.title) for n in app._notifications)

            # `a` lists it; Enter acknowledges it: off the bar, still in the list
            await pilot.press("a")
            assert isinstance(app.screen, AlertsScreen)
            await pilot.press("enter")
            assert a.acked
            await pilot.press("escape")
            app.refresh_now()
            await pilot.pause()
            assert "CRITICAL" not in screen_text(app).splitlines()[0]

            # `c`: the checkpoints of the real run dir; `y` copies the latest one's drafter here
            await pilot.press("c")
            assert isinstance(app.screen, CheckpointsScreen)
            table = app.screen.query_one(DataTable)
            await until(pilot, lambda: table.row_count >= 1, 40, "checkpoint rows")
            text = screen_text(app)
            assert "latest" in text and "free" in text and "keeps the newest 2" in text
            latest = (run_dir / "checkpoints" / "latest").read_text().strip()
            assert str(int(latest.split("_")[1])) in text
            await pilot.press("y")
            dest = tmp_path / "mine" / "drafter"
            app.screen.query_one(Input).value = str(dest)
            await pilot.press("enter")
            await until(
                pilot, lambda: app.copy_jobs.jobs and not app.copy_jobs.jobs[-1].running, 60, "the copy"
            )
            job = app.copy_jobs.jobs[-1]
            assert job.ok, job.text
            ck = run_dir / "checkpoints" / latest
            src = ck / "export" if (ck / "export").is_dir() else ck / "drafter"  # the drafter to serve
            want = {p.relative_to(src): p.read_bytes() for p in src.rglob("*") if p.is_file()}
            got = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
            assert want and got == want
            await pilot.press("escape")

        r = await asyncio.to_thread(cli, "status", *conn_args(host), "--run-dir", str(run_dir), "--check")
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stdout.startswith("DFLASH CRITICAL: trainer exited without a stop request")
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_check_is_unknown_without_a_run_or_a_connection(host, tmp_path):
    r = cli("status", *conn_args(host), "--run-dir", str(tmp_path / "empty"), "--check")
    assert r.returncode == 3 and r.stdout.startswith("DFLASH UNKNOWN: no trainer found"), r.stdout
    args = conn_args(host)
    args[args.index("-p") + 1] = "1"  # nothing listens there
    r = cli("status", *args, "--check")
    assert r.returncode == 3 and r.stdout.startswith("DFLASH UNKNOWN: cannot check"), r.stdout
    cfg = tmp_path / "config" / "dflash-console" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text("[health]\nnope = 1\n")
    r = cli("status", *conn_args(host), "--check")
    assert r.returncode == 3 and "no setting 'nope'" in r.stdout, r.stdout

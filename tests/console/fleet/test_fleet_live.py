"""Several runs at once against real SSH servers in-process: one devhost serving two containers
(one SSH connection for both) and a second devhost as a second host. The trainers are the stand-in
for the user's own script (tests/support/core_util.py: runs until SIGINT, found through /proc by its
--output-dir); the records the screen shows are appended to each run's metrics.jsonl by the test."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest

from console.core.fleet import build_runs
from console.core.options import ConnectOptions
from console.core.place import Proxmox
from console.core.targets import Target
from console.screens.overview import OverviewScreen
from console.tui.fleet_app import FleetApp, FleetStopDialog
from tests.support.core_util import alive, cli, conn_args, options_for, start_user_script
from tests.support.devhost import devhost_thread
from tests.support.screen_text import screen_text, until

SIZE = (150, 40)
pytestmark = pytest.mark.e2e


@pytest.fixture
def hosts(tmp_path):
    procs = []
    runs = {}
    with devhost_thread(tmp_path / "a", 200, 201) as a, devhost_thread(tmp_path / "b", 300) as b:
        try:
            for h, ct in ((a, 200), (a, 201), (b, 300)):
                folder = h.container_dir(ct)
                run_dir = folder / "run"
                run_dir.mkdir()
                (run_dir / "metrics.jsonl").write_text("")
                (run_dir / "train.log").write_text(f"log of {ct}\n")
                p = start_user_script(folder, str(run_dir))
                procs.append(p)
                runs[ct] = (h, run_dir, p)
            yield a, b, runs
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


def step(run_dir, n: int, loss: float) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        rec = {"t": time.time(), "kind": "step", "step": n, "total_steps": 100, "loss": loss}
        f.write(json.dumps(rec) + "\n")
        tp = {
            "t": time.time(),
            "kind": "throughput",
            "devices": [{"device": "cpu", "uuid": None, "role": "drafter", "tok_s": 1000.0 + n, "busy": 1}],
            "queue": {"depth": 1, "capacity": 4},
        }
        f.write(json.dumps(tp) + "\n")


def target(h, ct: int, run_dir, label: str, readonly: bool = False) -> Target:
    opts: ConnectOptions = options_for(h)
    return Target(label, opts, Proxmox(ct), str(run_dir), label, readonly)


async def test_overview_switching_stop_and_a_lost_host(hosts):
    a, b, runs = hosts
    targets = [target(runs[ct][0], ct, runs[ct][1], f"run{ct}", readonly=ct == 300) for ct in (200, 201, 300)]
    fleet = build_runs(targets, telemetry=False)
    app = FleetApp(fleet)
    for ct, n in ((200, 3), (201, 5), (300, 7)):
        step(runs[ct][1], n, 1.0 / n)
    async with app.run_test(size=SIZE) as pilot:
        assert isinstance(app.screen, OverviewScreen)
        await until(
            pilot,
            lambda: all(r.state.trainer is not None and r.state.step is not None for r in fleet),
            60,
            "three runs with trainers and steps",
        )
        # the two containers of host a share one SSH connection; host b has its own
        link_a, link_b = fleet[0].session.link, fleet[2].session.link
        assert fleet[1].session.link is link_a and link_a is not link_b
        assert link_a.opened == 1 and link_b.opened == 1
        await until(
            pilot,
            lambda: all(f"{n} / 100" in screen_text(app) for n in (3, 5, 7)),
            10,
            "the three rows' steps",
        )
        text = screen_text(app)
        for ct, n in ((200, 3), (201, 5), (300, 7)):
            assert f"run{ct}" in text and f"127.0.0.1 · CT {ct}" in text and f"{n} / 100" in text, text
        assert text.count("running") == 3

        # 2 opens the second run's full screen: its PID, its log; o comes back; 1 opens the first
        await pilot.press("2")
        await until(pilot, lambda: "log of 201" in app.log_view.lines, 10, "run 201's log")
        text = screen_text(app)
        assert f"trainer PID {runs[201][2].pid}" in text and "CT 201" in text
        assert "log of 200" not in app.log_view.lines
        await pilot.press("o")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("down", "enter")  # the cursor's row (sorted by #): run 2 again
        assert app.current == 1 and app.session is fleet[1].session
        await pilot.press("o", "1")
        assert app.current == 0
        assert f"trainer PID {runs[200][2].pid}" in screen_text(app)

        # a stop on the second run names its host, container and PID and leaves the first running
        await pilot.press("o", "2", "s")
        dlg = app.screen
        assert isinstance(dlg, FleetStopDialog)
        text = screen_text(app)
        assert "127.0.0.1 · CT 201" in text and f"PID {runs[201][2].pid}" in text
        await pilot.press("y")
        await until(pilot, lambda: dlg.done, 30, "the stop to end")
        assert runs[201][2].wait(10) == 0
        assert alive(runs[200][2].pid) and alive(runs[300][2].pid)
        await pilot.press("escape", "o")
        await until(pilot, lambda: fleet[1].state.trainer is None, 10, "run 201 without trainer")

        # the third run is read-only (per target): its screen says so and s does nothing there
        await pilot.press("3")
        assert app.readonly and "READ-ONLY" in screen_text(app).splitlines()[0]
        await pilot.press("s")
        assert not isinstance(app.screen, FleetStopDialog)
        await pilot.press("o", "1")  # the first again: writable
        assert app.current == 0 and not app.readonly
        await pilot.press("o")

        # host b goes away: its row says so, host a's runs keep updating
        b.stop()
        await until(pilot, lambda: fleet[2].state.conn.state != "connected", 30, "host b lost")
        step(runs[200][1], 42, 0.5)
        await until(pilot, lambda: fleet[0].state.step == 42, 30, "run 200 still updating")
        await until(pilot, lambda: "42 / 100" in screen_text(app), 10, "run 200's new step in its row")
        text = screen_text(app)
        row_b = next(line for line in text.splitlines() if "run300" in line)
        assert "connecting" in row_b  # reconnecting / connecting, retried on its own
        assert fleet[0].state.conn.state == "connected"


def test_status_of_several_targets_one_line_each_and_json_array(hosts, tmp_path, monkeypatch):
    a, b, runs = hosts
    cfg = tmp_path / "cfg" / "dflash-console"
    cfg.mkdir(parents=True)
    h = b.host
    cfg.joinpath("config.toml").write_text(
        "[targets.far]\n"
        f'host = "127.0.0.1"\nport = {h.port}\nuser = "{h.user}"\nkey = "{h.client_key_path}"\n'
        f'known_hosts = "{h.known_hosts_path}"\ncontainer = 300\nrun_dir = "{runs[300][1]}"\nlabel = "far run"\n'
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    step(runs[201][1], 9, 0.25)
    args = conn_args(a, ct=None)
    # a relative --run-dir is taken from each container's home: each finds its own trainer
    mine = ("--ct", "200", "--ct", "201", "--run-dir", "run")
    r = cli("status", *args, *mine, "far", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert isinstance(out, list) and [o["ct"] for o in out] == [200, 201, 300]
    assert [o["trainer"]["pid"] for o in out] == [runs[ct][2].pid for ct in (200, 201, 300)]
    assert out[2]["target"] == "far run" and out[1]["last_step"]["step"] == 9

    b.stop()  # one host unreachable: its line says so, the others are there; exit 1
    r = cli("status", *args, *mine, "far")
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and len(lines) == 3, r.stdout + r.stderr
    assert f"pid {runs[200][2].pid}" in lines[0] and "step 9/100" in lines[1]
    assert lines[2].startswith("far run (127.0.0.1 · CT 300): unreachable")

    # one target: one JSON object, as before
    r = cli("status", *args, "--ct", "200", "--run-dir", "run", "--json")
    assert r.returncode == 0 and isinstance(json.loads(r.stdout), dict)

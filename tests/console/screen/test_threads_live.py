"""The threads view (``t``) and its CLI twin (``dflash-console threads``) against the real tiny trainer run
as ``--launch multi`` (a launcher, a target and a drafter worker process) in the devhost's container:
every process with its role, the trainer's named threads (trainer/thread_names.py), CPU% that
moves, and a real ``py-spy dump`` (the test extra) of a process, from the screen and from the CLI on a
``readonly = true`` target. One trainer for the module; killed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from console.app import ConsoleApp
from console.core.place import Proxmox
from console.core.session import Session
from console.core.threads import rows
from console.screens.threads import SHOWN, ThreadsScreen
from tests.support.core_util import CT, alive, cli, conn_args, options_for, wait_until
from tests.support.devhost import devhost_fixture
from tests.support.screen_text import screen_text, until
from tests.support.trainer_run import Trainer, tiny_flags, wait_for_step

pytestmark = pytest.mark.e2e
SIZE = (160, 48)
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# the trainer's names for its threads: the launcher's main thread and control threads, each worker's
# main thread (its process's name too), its meter, control and parent watch; the drafter's receiver
LAUNCHER = {"dflash-launch", "control-accept", "dflash-control"}
WORKER = {"dflash-meter", "dflash-control", "parent-watch"}
PYSPY = str(Path(sys.executable).parent / "py-spy")  # the test extra's: the operator's py-spy here


host = devhost_fixture(scope="module")


@pytest.fixture(scope="module")
def trainer(host, tiny_assets):
    run_dir = host.container_dir(CT) / "run"
    t = Trainer(tiny_flags(tiny_assets, run_dir, "--launch", "multi", "--epochs", "1000"), **ENV)
    try:
        wait_for_step(run_dir, 1, t, 240)
        yield run_dir, t
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(t.proc.pid, signal.SIGKILL)  # its workers die with it (PR_SET_PDEATHSIG)
        t.proc.wait(30)


def _threads_json(host, run_dir) -> dict:
    r = cli("threads", *conn_args(host), "--run-dir", str(run_dir), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_cli_names_every_process_and_thread_and_cpu_moves(host, trainer):
    run_dir, t = trainer
    st = _threads_json(host, run_dir)
    procs = {q["role"]: q for q in st["processes"]}
    assert st["trainer_pid"] == t.proc.pid and procs["launcher"]["pid"] == t.proc.pid
    assert {"launcher", "target0", "drafter0"} <= set(procs), procs.keys()
    names = {role: {th["name"] for th in q["threads"]} for role, q in procs.items()}
    assert names["launcher"] >= LAUNCHER, names["launcher"]
    assert WORKER | {"dflash-target0"} <= names["target0"], names["target0"]
    assert WORKER | {"dflash-drafter0", "dflash-recv-0"} <= names["drafter0"], names["drafter0"]
    assert procs["drafter0"]["name"] == "dflash-drafter0"  # the process as top and ps show it

    def busy() -> bool:  # some worker thread's ticks grew over the CLI's two samples
        st = _threads_json(host, run_dir)
        return any((th["cpu_pct"] or 0) > 0 for q in st["processes"] for th in q["threads"])

    wait_until(busy, 120, "a thread with CPU% above 0")


def test_cli_dump_on_a_readonly_target(host, trainer, tmp_path, monkeypatch):
    """py-spy dump only reads: a ``readonly = true`` target allows it (and still refuses a stop)."""
    run_dir, t = trainer
    d = host.host
    cfg = tmp_path / "cfg" / "dflash-console"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text(
        f'[targets.ro]\nhost = "127.0.0.1"\nport = {d.port}\nuser = "{d.user}"\nkey = "{d.client_key_path}"\n'
        f'known_hosts = "{d.known_hosts_path}"\ncontainer = {CT}\nrun_dir = "{run_dir}"\nreadonly = true\n'
        f'pyspy = "{PYSPY}"\n'
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    drafter = next(q for q in _threads_json(host, run_dir)["processes"] if q["role"] == "drafter0")
    r = cli("threads", "ro", "--dump", str(drafter["pid"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"Process {drafter['pid']}: ") and "trainer.worker" in r.stdout.splitlines()[0]
    assert '"MainThread"' in r.stdout and "trainer/runtime/device_worker.py" in r.stdout
    assert cli("stop", "ro", "--yes").returncode == 7  # the changing commands stay refused
    assert alive(t.proc.pid)


async def test_screen_shows_the_run_live_and_a_dump(host, trainer):
    run_dir, t = trainer
    session = Session(
        options_for(host),
        place=Proxmox(CT),
        run_dir=str(run_dir),
        readonly=True,
        telemetry=False,
        pyspy=PYSPY,
    )
    app = ConsoleApp(session, readonly=True, target="devhost")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.state.trainer is not None, 60, "the trainer")
        await pilot.press("t")
        scr = app.screen
        assert isinstance(scr, ThreadsScreen)

        def moving() -> bool:
            return scr.snap is not None and any((r.cpu_pct or 0) > 0 for r in rows(scr.snap) if not r.process)

        await until(pilot, moving, 60, "a thread with CPU% above 0")
        if any(len(p.threads) > SHOWN + 1 for p in scr.snap.procs):  # the drafter has 14 here
            await until(pilot, lambda: "more threads" in screen_text(app), 10, "the busiest 10 and a row")
        await pilot.press("a")  # every thread
        await until(pilot, lambda: "dflash-recv-0" in screen_text(app), 10, "every thread drawn")
        assert "more threads" not in screen_text(app)
        text = screen_text(app)
        for shown in ("launcher", "target0", "drafter0", "dflash-launch", "dflash-meter", "control-accept"):
            assert shown in text, shown
        assert f"Threads of the trainer pid {t.proc.pid}: 3 process(es)" in text

        await pilot.press("home")  # the busiest process's group row
        sel = scr.selected()
        assert sel is not None and sel.process
        await pilot.press("p")
        await until(pilot, lambda: scr.dump is not None, 60, "the dump")
        assert scr.dump.ok, scr.dump.text
        assert scr.dump.text.startswith(f"Process {sel.pid}: ") and "Thread " in scr.dump.text
        await until(pilot, lambda: f"py-spy dump of pid {sel.pid}" in screen_text(app), 10, "the dump shown")
        await pilot.press("escape")
        assert not isinstance(app.screen, ThreadsScreen)
    assert alive(t.proc.pid)

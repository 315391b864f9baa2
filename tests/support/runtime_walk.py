"""The walk every runtime is tested with (tests/console/runtimes/): the real CLI against a devhost whose
``podman``/``docker``/``lxc-attach``/``srun`` are the real ones, the real tiny trainer inside.

launch (the bundled trainer deployed into the place) → status names the trainer → threads → deploy → restart onto the
deployed code with resume → stop cleanly (checkpoint saved, exit 0, the exit seen at once) → no trainer;
and a wrong name is one line, exit 2, naming the command tried.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.core_util import cli, conn_args, wait_until
from tests.support.trainer_run import TRAINER_ENV, events, steps, tiny_flags

ENV = TRAINER_ENV


def walk(
    host,
    place: list[str],
    json_key: str,
    run_dir: Path,
    tiny: Path,
    alive: Callable[[int], bool],
    value=None,
    launched: Callable[[dict], None] = lambda run: None,
    restart_says: str = "",
) -> None:
    """The walk above in ``place`` (its CLI flags); ``alive(pid)`` asks the place whether its pid lives;
    ``status --json`` names the place as ``json_key: value`` (the flag's value by default); ``launched(run)``
    checks the place's own view of each start (run.json's fields); ``restart_says``: a line of restart's plan."""
    args = [*conn_args(host, ct=None), *place]
    flags = tiny_flags(tiny, run_dir, "--epochs", "1000", "--seed", "7")
    r = cli("launch", *args, "--python", sys.executable, "--", *flags, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert alive(run["pid"]) and run["argv"] == flags
    launched(run)
    wait_until(lambda: steps(run_dir), 120, "a training step")

    r = cli("status", *args, "--run-dir", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["trainer"]["pid"] == run["pid"]  # the pid inside the place
    assert st[json_key] == (value or place[1])

    r = cli("threads", *args, "--run-dir", str(run_dir), "--json")  # read inside the place's own /proc
    assert r.returncode == 0, r.stdout + r.stderr
    assert run["pid"] in [p["pid"] for p in json.loads(r.stdout)["processes"]], r.stdout[:2000]

    r = cli("deploy", *args, "--run-dir", str(run_dir), timeout=120)  # checked with the run's interpreter
    assert f"and {sys.executable} imports torch" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr
    code_dir = re.search(r"(/\S+/\.dflash-console/code/[0-9a-f]+)", r.stdout).group(1)
    r = cli("restart", *args, "--run-dir", str(run_dir), "--yes", "--code-dir", code_dir, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[saved]" in r.stdout and "[exited]" in r.stdout and restart_says in r.stdout
    run2 = json.loads((run_dir / "run.json").read_text())
    assert run2["pid"] != run["pid"] and not alive(run["pid"]) and alive(run2["pid"])
    assert run2["code_dir"] == code_dir and run2["argv"] == [*flags, "--resume", "auto"]
    launched(run2)
    saved = [e for e in events(run_dir) if e["name"] == "checkpoint_saved"][-1]
    started = [e for e in events(run_dir) if e["name"] == "started"]
    assert started[-1]["pid"] == run2["pid"] and started[-1]["step"] == saved["step"] >= 1  # resumed

    r = cli("stop", *args, "--run-dir", str(run_dir), "--yes", "--timeout", "120", timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    last = [e for e in events(run_dir) if e["name"] == "checkpoint_saved"][-1]
    assert f"step {last['step']}" in r.stdout and not alive(run2["pid"])
    assert [e["name"] for e in events(run_dir)][-1] == "stopped"
    assert cli("stop", *args, "--run-dir", str(run_dir), "--yes").returncode == 4  # no trainer now


def wrong_name(host, flag: str, name: str, says: str) -> None:
    """``status`` in a place that is not there: exit 2, one line naming the place and the command tried."""
    r = cli("status", *conn_args(host, ct=None), flag, name)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "(ran: " in lines[0], r.stderr
    assert "<helper bootstrap>" in lines[0] and "stdin" not in lines[0], (
        "the bootstrap's code is not the user's"
    )


def runtime_fixtures(make: Callable[[Path, Path], object]):
    """(runtime, host) module fixtures: ``make(folder, run_root)`` starts the runtime (closed at the end),
    and a devhost whose sessions see its environment (DOCKER_HOST, CONTAINERS_CONF, SLURM_CONF...)."""
    import pytest

    from tests.support.devhost import devhost_thread

    @pytest.fixture(scope="module")
    def runtime(tmp_path_factory, tiny_assets):
        rt = make(tmp_path_factory.mktemp("runtime"), tiny_assets.parent)
        try:
            yield rt
        finally:
            rt.close()

    @pytest.fixture(scope="module")
    def host(tmp_path_factory, runtime):
        with devhost_thread(tmp_path_factory.mktemp("devhost"), env={**ENV, **runtime.env}) as h:
            yield h

    return runtime, host


def missing_program(tmp_path: Path, flag: str, name: str, program: str) -> None:
    """The runtime's program is not on the host: one line naming it, exit 2."""
    from tests.support.devhost import devhost_thread

    with devhost_thread(tmp_path / "bare", env={"PATH": "/nonexistent"}) as h:
        wrong_name(h, flag, name, program)

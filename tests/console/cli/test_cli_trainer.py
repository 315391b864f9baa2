"""The real tiny trainer driven by ``dflash-console`` (a subprocess) through the devhost's container:
launch (deploying the bundled trainer), status, logs, restart (resumes from the stop's checkpoint),
stop (checkpoint saved, exit 0, process gone). The run dir holds spaces, quotes, $() and ;."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.support.core_util import CT, alive, cli, conn_args, wait_until
from tests.support.devhost import devhost_fixture
from tests.support.trainer_run import TRAINER_ENV, events, startup, steps, tiny_flags

pytestmark = pytest.mark.e2e
NASTY = "run 'q' \"dq\" $(touch PWNED) ; touch PWNED2"
ENV = TRAINER_ENV


host = devhost_fixture(scope="module", env=ENV)


def test_launch_status_logs_restart_stop(host, tiny_assets):
    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / NASTY
    flags = tiny_flags(tiny_assets, run_dir, "--epochs", "1000", "--seed", "7")
    args = conn_args(host)
    pids = []
    try:
        r = cli("launch", *args, "--", *flags, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        run = json.loads((run_dir / "run.json").read_text())
        pids.append(run["pid"])
        assert alive(run["pid"])
        assert run["argv"] == flags and run["output_dir"] == str(run_dir)  # reached the remote intact
        assert run["cwd"] == str(ct_dir)  # launched inside the container
        code_dir = run["code_dir"]
        assert code_dir.startswith(str(ct_dir / ".dflash-console" / "code") + "/")  # the deployed copy
        # one name, one path: the folder that holds the trainer package, as launch said and PYTHONPATH has
        assert (Path(code_dir) / "trainer" / "pipeline.py").is_file() and run["env"]["PYTHONPATH"] == code_dir
        assert f"(code {code_dir})" in r.stdout
        assert (run_dir / "train.log").exists()
        assert [e["name"] for e in events(run_dir)][:1] == ["started"]
        # launch follows the start-up to the first step: one plain line a phase (no terminal), in order
        said = [ln[len("start-up: ") :] for ln in r.stdout.splitlines() if ln.startswith("start-up: ")]
        order = ["starting", "building the drafter", "loading the target", "target loaded", "waiting for"]
        idx = [next(i for i, ln in enumerate(said) if ln.startswith(p)) for p in order]
        assert idx == sorted(idx), said
        assert said[-1].startswith("first step ") and "compile cache cold" in said[-1], said
        assert startup(run_dir, phase="first_step")  # launch returned after it

        r = cli("status", *args, "--run-dir", str(run_dir), "--json")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["trainer"]["pid"] == run["pid"] and st["trainer"]["source"] == "run.json"
        assert st["drafter"] == {"arch": "dflash", "name": "DFlash 1", "block_size": 8}  # from run.json argv
        su = st["startup"]
        assert su["active"] is False and su["phase"] == "trained" and su["first_step_s"] > 0
        assert su["cache"] == "cold" and su["expected_s"] is None  # a first start: nothing to go by
        wait_until(lambda: steps(run_dir), 120, "a training step")
        r = cli("status", *args, "--run-dir", str(run_dir))
        assert r.returncode == 0 and f"pid {run['pid']}" in r.stdout and "step " in r.stdout
        assert "drafter: DFlash 1 (block 8)" in r.stdout.splitlines()

        # restart: a clean stop, then the same run again with --resume auto
        r = cli("restart", *args, "--run-dir", str(run_dir), "--yes", "--timeout", "120", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "[saved]" in r.stdout and "[exited]" in r.stdout
        # the second start of the run: estimated from the first, its compile cache reused
        said = [ln for ln in r.stdout.splitlines() if ln.startswith("start-up: ")]
        assert said and said[-1].startswith("start-up: first step ") and "(last start " in said[-1], said
        assert "compile cache warm" in said[-1]
        assert any("first step in ~" in ln for ln in said), said  # an estimate while it started
        assert not alive(pids[0])
        run2 = json.loads((run_dir / "run.json").read_text())
        pids.append(run2["pid"])
        assert run2["pid"] != run["pid"] and alive(run2["pid"])
        assert run2["argv"] == [*flags, "--resume", "auto"] and run2["code_dir"] == code_dir
        evs = events(run_dir)
        saved = [e for e in evs if e["name"] == "checkpoint_saved"][-1]
        started = [e for e in evs if e["name"] == "started"]
        assert len(started) == 2 and started[-1]["pid"] == run2["pid"]
        assert started[-1]["step"] == saved["step"] >= 1  # resumed from the stop's checkpoint

        # stop: checkpoint saved, exit 0, process gone
        r = cli("stop", *args, "--run-dir", str(run_dir), "--yes", "--timeout", "120", timeout=200)
        assert r.returncode == 0, r.stdout + r.stderr
        assert not alive(run2["pid"])
        last = [e for e in events(run_dir) if e["name"] == "checkpoint_saved"][-1]
        assert last["step"] >= saved["step"] and f"step {last['step']}" in r.stdout
        latest = (run_dir / "checkpoints" / "latest").read_text().strip()
        assert (run_dir / "checkpoints" / latest).is_dir() and last["path"].endswith(latest)
        assert [e["name"] for e in events(run_dir)][-1] == "stopped"

        # logs: the last lines of train.log, as they are on the remote
        r = cli("logs", *args, "--run-dir", str(run_dir), "-n", "4")
        assert r.returncode == 0
        assert r.stdout.splitlines() == (run_dir / "train.log").read_text().splitlines()[-4:]
        assert cli("stop", *args, "--run-dir", str(run_dir), "--yes").returncode == 4
        for d in (ct_dir, ct_dir / "runs", run_dir, host.root / "home"):
            assert not (d / "PWNED").exists() and not (d / "PWNED2").exists()
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

"""A run directory written by someone else, through ``dflash-console`` as a real subprocess against the
devhost (a real SSH server and the pct stand-in): a run.json that names a process that is not the trainer
(another user's python loop, PID 1, a trainer of another run) is refused and nothing is signalled; a
run.json, train.log or metrics.jsonl that is a FIFO ends ``status``, ``status --check`` and ``logs`` with a
clear error at once, and no helper is left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from console.core.helper_program.identity import identity, proc_info
from tests.support.core_util import (
    CT,
    USER_SCRIPT,
    alive,
    cli,
    conn_args,
    start_time,
    start_user_script,
    wait_until,
)
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e

NOBODY = 65534
LOOP = "import time\nwhile True: time.sleep(0.05)"


host = devhost_fixture(scope="module")


def _cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]


def _write_run_json(run: Path, pid: int, owner: int | None = None) -> None:
    """run.json naming ``pid`` exactly as /proc shows it (its start time and command line), owned by
    ``owner``: what someone who can write the run directory can forge."""
    run.mkdir(parents=True, exist_ok=True)
    cmd = _cmdline(pid)
    info = {
        "pid": pid,
        "start_time": start_time(pid),
        "command": cmd,
        "argv": cmd[1:],
        "output_dir": str(run),
    }
    (run / "run.json").write_text(json.dumps(info))
    if owner is not None:
        os.chown(run, owner, owner)
        os.chown(run / "run.json", owner, owner)


def _start_loop(**kw) -> subprocess.Popen:
    """A python loop; as another user, a system python they can run (ours may lie in root's home)."""
    python = "/usr/bin/python3" if kw and os.access("/usr/bin/python3", os.X_OK) else sys.executable
    p = subprocess.Popen([python, "-c", LOOP], start_new_session=True, **kw)
    wait_until(lambda: _cmdline(p.pid)[-1:] == [LOOP], 30, "the loop's command line")
    return p


def test_run_json_naming_another_users_python_loop_is_refused(host, tmp_path):
    """run.json (owned by that user, as they would write it) names their own unrelated python process
    with its exact start time and command line: `stop --yes` refuses, naming what it found."""
    other = {"user": NOBODY, "group": NOBODY} if os.geteuid() == 0 else {}
    victim = _start_loop(cwd="/", **other)
    try:
        run = tmp_path / "run"
        _write_run_json(run, victim.pid, NOBODY if other else None)
        r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "10")
        assert r.returncode == 5, r.stdout + r.stderr
        assert f"pid {victim.pid}" in r.stderr and "not the trainer's" in r.stderr, r.stderr
        assert "time.sleep" in r.stderr  # its command line, as found
        time.sleep(0.3)
        assert alive(victim.pid) and victim.poll() is None  # nothing was sent to it
    finally:
        victim.kill()
        victim.wait()


def test_run_json_naming_pid_1_is_refused(host, tmp_path):
    run = tmp_path / "run"
    _write_run_json(run, 1)
    # the rule itself first: were PID 1 taken for the trainer, the stop below would signal it
    exact = {"trainer": True, "start_time": start_time(1), "argv_rest": _cmdline(1)[1:]}
    assert identity(proc_info(1), exact)[0] == "other"
    r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "10")
    assert r.returncode == 5, r.stdout + r.stderr
    assert "pid 1 is the container's init" in r.stderr, r.stderr
    assert alive(1)


def test_run_json_naming_the_trainer_of_another_run_is_refused(host, tmp_path):
    """A real trainer (the workflow's script), but its --output-dir is another run: not this run's."""
    folder = host.container_dir(CT)
    p = start_user_script(folder, str(tmp_path / "elsewhere"))
    try:
        run = tmp_path / "run"
        _write_run_json(run, p.pid)
        r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "10")
        assert r.returncode == 5, r.stdout + r.stderr
        assert f"its --output-dir is {tmp_path / 'elsewhere'}, not {run}" in r.stderr, r.stderr
        time.sleep(0.3)
        assert p.poll() is None  # still training: no SIGINT reached it
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_trainer_of_the_run_json_owner_is_stopped_and_that_is_said(host, tmp_path):
    """The workflow's script run by another user, who wrote its run.json: theirs is the trainer (the
    helper runs as root), so the stop goes on, and says whose process it signals."""
    folder = Path(tempfile.mkdtemp(prefix="dflash-other-"))
    try:
        folder.chmod(0o755)
        (folder / "train_dflash_pipeline.py").write_text(USER_SCRIPT)
        run = folder / "run"
        run.mkdir()
        os.chown(run, NOBODY, NOBODY)
        argv = ["/usr/bin/python3", "-u", str(folder / "train_dflash_pipeline.py"), "--output-dir", str(run)]
        p = subprocess.Popen(argv, cwd="/", user=NOBODY, group=NOBODY, stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "training"
            _write_run_json(run, p.pid, NOBODY)
            r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "30")
            assert f"[verifying] pid {p.pid} runs as uid {NOBODY} (nobody), its run.json's owner" in r.stdout
            assert p.wait(30) == 0 and "saved" in p.stdout.read()  # it got its SIGINT and saved
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _helpers_in(folder: Path) -> list[int]:
    """Helpers (python3 -c PROGRAM) running in ``folder``: this devhost's container."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            continue
        if b"dflash-console-helper" in cmd and cwd == str(folder) and alive(int(name)):
            out.append(int(name))
    return out


@pytest.fixture
def no_helper_left(host):
    """After the test: no helper of this container is left running (each one left is killed, then the
    test fails)."""
    folder = host.container_dir(CT)
    before = set(_helpers_in(folder))
    yield
    try:
        wait_until(lambda: not set(_helpers_in(folder)) - before, 30, "the helpers to exit")
    finally:
        for pid in set(_helpers_in(folder)) - before:
            os.kill(pid, 9)


def test_fifo_run_json_ends_status_and_check_with_a_clear_error(host, tmp_path, no_helper_left):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "run.json")
    t0 = time.monotonic()
    r = cli("status", *conn_args(host), "--run-dir", str(run), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{run / 'run.json'} is a FIFO, not a regular file: refused" in r.stderr, r.stderr
    r = cli("status", *conn_args(host), "--run-dir", str(run), "--check", timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.startswith("DFLASH UNKNOWN: cannot check:") and "is a FIFO" in r.stdout, r.stdout
    assert time.monotonic() - t0 < 60


def test_fifo_logs_and_metrics_end_logs_and_check_with_a_clear_error(host, tmp_path, no_helper_left):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "train.log")
    os.mkfifo(run / "metrics.jsonl")
    r = cli("logs", *conn_args(host), "--run-dir", str(run), "-n", "5", timeout=60)
    assert r.returncode == 1 and f"{run / 'train.log'} is a FIFO" in r.stderr, r.stdout + r.stderr
    r = cli("status", *conn_args(host), "--run-dir", str(run), "--check", timeout=60)
    assert r.returncode == 3 and f"{run / 'metrics.jsonl'} is a FIFO" in r.stdout, r.stdout + r.stderr

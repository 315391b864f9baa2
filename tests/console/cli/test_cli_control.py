"""``dflash-console`` as a real subprocess against the devhost, without the real trainer:
refusals, exit codes, a user's own trainer script, deploy, host keys, usage."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from console.core.deploy import bundled_trainer_dir
from tests.support.core_util import CLI, CT, alive, cli, conn_args, start_time, start_user_script
from tests.support.devhost import devhost_fixture
from tests.support.trainer_run import ROOT

pytestmark = pytest.mark.e2e

host = devhost_fixture(scope="module")


def test_stale_run_json_pid_is_refused_and_not_signalled(host, tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run = tmp_path / "run"
        run.mkdir()
        (run / "run.json").write_text(
            json.dumps(
                {
                    "pid": sleeper.pid,
                    "start_time": start_time(sleeper.pid),
                    "output_dir": str(run),
                    "command": [sys.executable, "-m", "trainer.pipeline", "--output-dir", str(run)],
                    "argv": ["--output-dir", str(run)],
                    "interpreter": sys.executable,
                }
            )
        )
        r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes")
        assert r.returncode == 5, r.stderr
        assert f"pid {sleeper.pid}" in r.stderr and "no longer the trainer" in r.stderr
        assert alive(sleeper.pid) and sleeper.poll() is None  # nothing was sent to it
    finally:
        sleeper.kill()
        sleeper.wait()


def test_no_trainer_is_exit_4(host, tmp_path):
    assert cli("stop", *conn_args(host), "--run-dir", str(tmp_path), "--yes").returncode == 4
    r = cli("status", *conn_args(host), "--run-dir", str(tmp_path), "--json")
    assert r.returncode == 4
    st = json.loads(r.stdout)
    assert st["trainer"] is None and st["run_dir"] == str(tmp_path)
    assert st["gpus"] is None and "nvidia-smi" in st["gpu_detail"]  # said, not crashed


def test_user_script_found_by_cmdline_verified_and_stopped(host):
    folder = host.container_dir(CT)
    p = start_user_script(folder, "runs/mine")  # relative: resolved against the process's cwd
    try:
        run_dir = str(folder / "runs" / "mine")
        r = cli("status", *conn_args(host), "--run-dir", run_dir, "--json")
        assert r.returncode == 0, r.stderr
        tr = json.loads(r.stdout)["trainer"]
        assert tr["pid"] == p.pid and tr["source"] == "cmdline" and tr["run_dir"] == run_dir
        # launching into its run dir is refused; it keeps running
        r = cli("launch", *conn_args(host), "--", "--output-dir", run_dir, "--data-dir", "x")
        assert r.returncode == 1 and f"pid {p.pid}" in r.stderr
        # it keeps no train.log: `logs` says where it looked, not an empty success
        r = cli("logs", *conn_args(host), "--run-dir", run_dir)
        assert r.returncode == 1 and f"no {run_dir}/train.log" in r.stderr and not r.stdout, r.stderr
        assert p.poll() is None
        # without --yes and without a terminal: refused, still running
        r = cli("stop", *conn_args(host), "--run-dir", run_dir)
        assert r.returncode == 1 and "--yes" in r.stderr and p.poll() is None
        r = cli("stop", *conn_args(host), "--run-dir", run_dir, "--yes", "--timeout", "30")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "[saving]" in r.stdout and "[exited]" in r.stdout
        assert p.wait(5) == 0
        assert p.stdout.read().split() == ["saving", "saved"]  # it got SIGINT and finished its save
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_trainer_that_ignores_sigint_is_refused_once_on_stderr(host):
    """The refusal is the outcome: said once, on stderr (it went to stdout as a phase line as well)."""
    p = start_user_script(host.container_dir(CT), "runs/deaf", ignore_sigint=True)
    try:
        r = cli("stop", *conn_args(host), "--run-dir", "runs/deaf", "--yes", "--timeout", "30")
        assert r.returncode == 5, r.stdout + r.stderr
        assert r.stderr.count(f"pid {p.pid} ignores SIGINT") == 1, r.stderr
        assert "ignores SIGINT" not in r.stdout and "[verifying]" in r.stdout, r.stdout
        assert p.poll() is None  # nothing was signalled
    finally:
        p.kill()
        p.wait()


def test_deploy_writes_a_versioned_compiled_copy_once(host):
    r = cli("deploy", *conn_args(host))
    assert r.returncode == 0, r.stderr
    code_dir = r.stdout.split(" to ", 1)[1].split(" (", 1)[0]
    from pathlib import Path

    code = Path(code_dir)
    assert code.parent == host.container_dir(CT) / ".dflash-console" / "code"
    src = bundled_trainer_dir()
    for f in src.glob("*.py"):
        assert (code / "trainer" / f.name).read_bytes() == f.read_bytes()
    assert list((code / "trainer" / "__pycache__").glob("pipeline.*.pyc"))  # compile-checked there
    manifest = (code / ".complete").stat()
    r2 = cli("deploy", *conn_args(host))
    assert r2.returncode == 0 and code_dir in r2.stdout
    assert (code / ".complete").stat().st_mtime_ns == manifest.st_mtime_ns  # not written over
    assert sorted(p.name for p in code.parent.iterdir()) == [code.name, "last"]  # no temporary dir left
    assert "a restart of a run that runs deployed code runs this one" in r2.stdout  # and names it last


def test_a_deploy_removes_what_a_deploy_cut_off_by_a_dropped_link_left(host, tmp_path):
    """A deploy whose link dropped leaves ``.tmp-HASH-RANDOM`` behind; the next deploy removes those of
    its own making that no deploy is still writing (unchanged for 10 minutes), never through a link,
    and nothing else."""
    from pathlib import Path

    base = host.container_dir(CT) / ".dflash-console" / "code"
    base.mkdir(parents=True, exist_ok=True)
    old = time.time() - 3600

    def folder(name: str, age: float | None = old) -> Path:
        p = base / name
        (p / "trainer").mkdir(parents=True)
        (p / "trainer" / "pipeline.py").write_text("# half written\n")
        if age is not None:
            os.utime(p, (age, age))
        return p

    stale = folder(".tmp-0123456789abcdef-01234567")
    busy = folder(".tmp-0123456789abcdef-89abcdef", age=None)  # a deploy under way right now
    theirs = folder(".tmp-old-copy")  # not a name deploy makes
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    link = base / ".tmp-fedcba9876543210-76543210"
    link.symlink_to(outside)
    os.utime(link, (old, old), follow_symlinks=False)
    try:
        r = cli("deploy", *conn_args(host), "--python", sys.executable)  # not another test's run's
        assert r.returncode == 0, r.stderr
        assert not stale.exists()
        assert busy.exists() and theirs.exists() and (outside / "keep").is_dir() and link.is_symlink()
    finally:  # the module's other deploy test sees the folder as a deploy leaves it
        link.unlink(missing_ok=True)
        for p in (stale, busy, theirs):
            shutil.rmtree(p, ignore_errors=True)


def test_unknown_or_changed_host_key_is_refused_with_its_fingerprint(host, tmp_path):
    other = tmp_path / "known_hosts"
    other.write_text(
        f"[127.0.0.1]:{host.port} ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIFm0d3Jvbmcga2V5IGZvciB0ZXN0cyBvbmx5IDAwMDAw\n"
    )
    empty = tmp_path / "empty"
    empty.write_text("")
    for kh in (other, empty):
        args = conn_args(host)
        args[args.index("--known-hosts") + 1] = str(kh)
        r = cli("status", *args, "--run-dir", str(tmp_path))
        assert r.returncode == 1
        assert host.host_fingerprint in r.stderr and "not trusted" in r.stderr, r.stderr


def test_usage_errors_are_exit_2(host, tmp_path):
    assert cli("launch", *conn_args(host)).returncode == 2  # no trainer flags
    assert cli("stop", *conn_args(host), "--bogus").returncode == 2
    assert cli("status", *conn_args(host), "--", "--x").returncode == 2
    r = cli(
        "launch",
        *conn_args(host),
        "--run-dir",
        str(tmp_path / "a"),
        "--",
        "--output-dir",
        str(tmp_path / "b"),
    )
    assert r.returncode == 2 and "differ" in r.stderr


def test_logs_follow_across_a_server_restart(host, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    log = run / "train.log"
    log.write_text("".join(f"old {i}\n" for i in range(10)))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen(
        [*CLI, "logs", *conn_args(host), "--run-dir", str(run), "-f", "-n", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert [p.stdout.readline() for _ in range(3)] == ["old 7\n", "old 8\n", "old 9\n"]
        with log.open("a") as f:
            f.write("new 0\nnew ")
            f.flush()
            assert p.stdout.readline() == "new 0\n"
            host.restart(pause=0.3)  # the link drops while a line is half written
            f.write("1\n")
            f.flush()
            for i in range(2, 5):
                f.write(f"new {i}\n")
        assert [p.stdout.readline() for _ in range(4)] == [f"new {i}\n" for i in range(1, 5)]
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(10)
    assert "retrying" in p.stderr.read()


def test_logs_follow_ends_when_its_reader_goes_away(host, tmp_path):
    """`logs -f | head -n 2`: once head has gone, logs ends at the next line instead of failing forever."""
    run = tmp_path / "run"
    run.mkdir()
    log = run / "train.log"
    log.write_text("a\nb\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r, w = os.pipe()
    p = subprocess.Popen(
        [*CLI, "logs", *conn_args(host), "--run-dir", str(run), "-f", "-n", "2"],
        stdout=w,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    os.close(w)
    try:
        with os.fdopen(r) as reader:
            assert [reader.readline() for _ in range(2)] == ["a\n", "b\n"]
        with log.open("a") as f:  # the reader is closed: the next lines meet a broken pipe
            for i in range(3):
                f.write(f"new {i}\n")
                f.flush()
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert "Traceback" not in err, err


def test_deploy_and_launch_refuse_an_interpreter_without_torch(host, tmp_path):
    """The container's interpreter must import torch and transformers: deploy says so (naming --python)
    and writes nothing; launch starts nothing (it used to spawn and die with ModuleNotFoundError)."""
    bare = tmp_path / "bare-python"  # this interpreter without its site-packages: no torch
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    ct_dir = host.container_dir(CT)
    before = (
        sorted((ct_dir / ".dflash-console" / "code").glob("*"))
        if (ct_dir / ".dflash-console").exists()
        else []
    )
    r = cli("deploy", *conn_args(host), "--python", str(bare))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "import torch, transformers" in r.stderr and "--python PATH" in r.stderr and "torch" in r.stderr
    after = (
        sorted((ct_dir / ".dflash-console" / "code").glob("*"))
        if (ct_dir / ".dflash-console").exists()
        else []
    )
    assert after == before and "deployed" not in r.stdout
    run = ct_dir / "runs" / "bare"
    r = cli(
        "launch", *conn_args(host), "--python", str(bare), "--", "--output-dir", str(run), "--data-dir", "x"
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "--python PATH" in r.stderr and "ModuleNotFoundError" in r.stderr
    assert not (run / "train.log").exists()  # nothing was started

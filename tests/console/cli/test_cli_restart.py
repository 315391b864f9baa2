"""``restart`` shows what it will run and does not take run.json's word alone (issue 33, item 8; issue 34,
item 5): the interpreter, code directory and command are printed first; a code directory outside the
deployed ones or an interpreter that is not the running trainer's needs ``--trust-run-json`` besides
``--yes``. Real files, a real fake ``trainer`` package that leaves a mark when it runs
(tests/support/fake_code.py), the real CLI over the in-process SSH server; the stand-in contract trainer
(tests/support/standin.py) as the running one."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from tests.support.core_util import CLI, CT, alive, cli, conn_args
from tests.support.devhost import devhost_fixture
from tests.support.fake_code import other_code, run_json_for
from tests.support.standin import start_contract_trainer
from tests.support.trainer_run import ROOT

pytestmark = pytest.mark.e2e

host = devhost_fixture(scope="module")


def test_code_dir_outside_the_deployed_ones_needs_trust_run_json(host, tmp_path):
    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / "other-code"
    run_dir.mkdir(parents=True)
    code = other_code(tmp_path / "code")
    run_json_for(run_dir, ct_dir, code)
    args = [*conn_args(host), "--run-dir", str(run_dir), "--detach"]
    r = cli("restart", *args, "--yes", timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "--trust-run-json" in r.stderr and "nothing was done" in r.stderr
    shown = r.stdout.splitlines()
    assert f"  interpreter: {sys.executable}" in shown
    assert f"  code directory: {code} (run.json)" in shown
    cmd = f"  command: {sys.executable} -m trainer.pipeline --output-dir {run_dir} --resume auto"
    assert cmd in shown, r.stdout
    assert any(ln.startswith("  ! the code directory") and code in ln for ln in shown), r.stdout
    assert not (run_dir / "RAN").exists()  # --yes alone ran nothing

    r = cli("restart", *args, "--yes", "--trust-run-json", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (run_dir / "RAN").read_text().endswith("--resume auto")  # trusted: it ran that code
    assert r.stdout.count("restarted: launched pid") == 1, r.stdout  # the outcome once, not twice


def test_an_interpreter_that_is_not_the_running_trainers_needs_trust_run_json(host, tmp_path):
    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / "other-python"
    run_dir.mkdir(parents=True)
    p = start_contract_trainer(tmp_path, run_dir, STANDIN_MODE="fast")
    try:
        shim = tmp_path / "python"
        shim.write_text(f'#!/bin/sh\ntouch {tmp_path / "SHIM_RAN"}\nexec {sys.executable} "$@"\n')
        shim.chmod(0o755)
        run = json.loads((run_dir / "run.json").read_text())
        (run_dir / "run.json").write_text(json.dumps({**run, "interpreter": str(shim)}))
        r = cli("restart", *conn_args(host), "--run-dir", str(run_dir), "--yes", timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"trainer pid {p.pid}" in r.stdout and f"  interpreter: {shim}" in r.stdout
        assert any(
            ln.startswith(f"  ! the interpreter {shim}") and f"pid {p.pid}" in ln
            for ln in r.stdout.splitlines()
        ), r.stdout
        assert "--trust-run-json" in r.stderr
        assert alive(p.pid) and p.poll() is None  # refused before the stop: not signalled
        assert not (tmp_path / "SHIM_RAN").exists()
    finally:
        if p.poll() is None:
            os.kill(p.pid, 9)
        p.wait(10)


def _on_a_terminal(args: list[str], typed: str) -> tuple[int, str]:
    """Run the CLI with a terminal as stdin and stderr, ``typed`` already typed; (exit code, stdout)."""
    master, slave = pty.openpty()
    try:
        os.write(master, typed.encode())
        p = subprocess.run(
            [*CLI, *args],
            stdin=slave,
            stderr=slave,
            stdout=subprocess.PIPE,
            text=True,
            timeout=180,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
    finally:
        os.close(slave)
        os.close(master)
    return p.returncode, p.stdout


def test_on_a_terminal_y_is_not_enough_trust_must_be_typed(host, tmp_path):
    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / "typed"
    run_dir.mkdir(parents=True)
    run_json_for(run_dir, ct_dir, other_code(tmp_path / "code"))
    args = ["restart", *conn_args(host), "--run-dir", str(run_dir), "--detach"]
    code, out = _on_a_terminal(args, "y\nyes\n")
    assert code == 1 and "! the code directory" in out
    assert not (run_dir / "RAN").exists()
    code, out = _on_a_terminal(args, "y\ntrust\n")
    assert code == 0, out
    assert (run_dir / "RAN").exists()


def test_deploy_then_restart_plans_the_new_code(host):
    """Issue 54, item 1: after ``deploy``, ``restart`` of a run on an older deployment plans the new
    deployment's code (and says why), not run.json's."""
    from tests.support.fake_code import fake_deployment

    ct_dir = host.container_dir(CT)
    old = fake_deployment(ct_dir / ".dflash-console" / "code", "5" * 16)
    run_dir = ct_dir / "runs" / "redeployed"
    run_dir.mkdir(parents=True)
    run_json_for(run_dir, ct_dir, old)
    r = cli("deploy", *conn_args(host), "--python", sys.executable, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    new = r.stdout.split(" to ", 1)[1].split(" (", 1)[0]
    r = cli("restart", *conn_args(host), "--run-dir", str(run_dir), timeout=120)  # no terminal: asks, stops
    assert r.returncode == 1 and "without --yes" in r.stderr, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("  code directory: "))
    assert line.startswith(f"  code directory: {new} (deployed last: ") and f"run.json had {old}" in line
    assert not (run_dir / "RAN").exists()

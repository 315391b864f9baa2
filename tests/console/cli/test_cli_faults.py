"""``dflash-console stop`` under faults, as a real subprocess against the devhost: a save faster than any
poll, a checkpoint that fails (full disk), and the SSH server restarted while the real trainer saves."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from tests.support.core_util import CLI, CT, cli, conn_args
from tests.support.devhost import devhost_fixture
from tests.support.standin import start_contract_trainer
from tests.support.trainer_run import ROOT, Trainer, env, tiny_flags, wait_for_step

pytestmark = pytest.mark.e2e

host = devhost_fixture(scope="module")


def _phases(stdout: str) -> list[str]:
    return [ln.split("]", 1)[0] + "]" for ln in stdout.splitlines() if ln.startswith("[")]


def test_fast_save_prints_every_phase_in_order(host, tmp_path):
    run = host.container_dir(CT) / "fast"
    p = start_contract_trainer(tmp_path, run, STANDIN_MODE="fast")
    try:
        r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "30")
    finally:
        p.wait(10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _phases(r.stdout) == [
        "[verifying]",
        "[signal_sent]",
        "[signal_sent]",
        "[saving]",
        "[saved]",
        "[exited]",
    ], r.stdout
    assert "[saving] saving checkpoint at step 7" in r.stdout


def test_a_failed_checkpoint_is_exit_6_and_said(host, tmp_path):
    run = host.container_dir(CT) / "fail"
    p = start_contract_trainer(tmp_path, run, STANDIN_MODE="fail")
    try:
        r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "30")
    finally:
        p.wait(10)
    assert r.returncode == 6, r.stdout + r.stderr
    assert "[saving] saving checkpoint at step 7" in r.stdout and "[error]" not in r.stdout
    assert r.stderr.count("checkpoint at step 7 failed") == 1, r.stderr  # said once, with the outcome
    assert r.stderr.startswith(
        "dflash-console: checkpoint failed: checkpoint at step 7 failed: [Errno 28]"
    ), r.stderr
    assert "exit code 4" in r.stderr and f"latest still names {run}/checkpoints/step_00000005" in r.stderr


def test_a_planted_latest_reaches_stops_message_clean(host, tmp_path):
    """``checkpoints/latest`` is the run directory's: its bytes (OSC 52, OSC 0, a screen clear, C1, a
    bidi override) are cleaned before stop's final message says them, and are not taken for a name."""
    run = host.container_dir(CT) / "planted"
    p = start_contract_trainer(tmp_path, run, STANDIN_MODE="fail")
    hostile = b"step_9\x1b]52;c;aGVsbG8=\x07\x1b]0;pwned\x07\x1b[2J\xc2\x9b6n\xe2\x80\xae\xff"
    (run / "checkpoints" / "latest").write_bytes(hostile)
    try:
        r = cli("stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "30")
    finally:
        p.wait(10)
    assert r.returncode == 6, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert not [c for c in out if (ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F], repr(out)
    assert "\u202e" not in out and "52;c" not in out and "pwned" not in out
    assert "latest still names 'step_9" in r.stderr and "(not a checkpoint's name)" in r.stderr, r.stderr


@pytest.mark.e2e
def test_stop_survives_a_server_restart_mid_save(host, tiny_assets, tmp_path):
    """SIGINT, the real trainer's save is held, the SSH server is killed and restarted: the CLI
    reconnects, finds the same trainer (PID + start time), follows the save to the exit and reports it;
    the trainer got one SIGINT."""
    run = host.container_dir(CT) / "held"
    release = tmp_path / "release"
    t = Trainer(
        tiny_flags(tiny_assets, run, "--epochs", "50", "--save-every-minutes", "0"),
        DFLASH_TEST_PAUSE_AT="files_written",
        DFLASH_TEST_PAUSE_UNTIL=str(release),
    )
    lines: list[str] = []
    proc = None
    try:
        wait_for_step(run, 1, t)
        proc = subprocess.Popen(
            [*CLI, "stop", *conn_args(host), "--run-dir", str(run), "--yes", "--timeout", "120"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env(),
            cwd=ROOT,
        )
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
        reader.start()
        t.wait_line("DFLASH_TEST_PAUSE files_written", timeout=60)
        _wait(lambda: any(ln.startswith("[saving]") for ln in lines), "the CLI's [saving]")
        host.restart(0.5)  # every connection dropped, the helper ended; back on the same port
        _wait(lambda: any(ln.startswith("[reconnected]") for ln in lines), "the CLI's reconnect")
        release.touch()
        assert proc.wait(120) == 0, "".join(lines)
        reader.join(5)
        assert t.wait(60) == 0, t.output
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        t.kill()
    out = "".join(lines)
    order = _phases(out)
    assert order.index("[reconnecting]") < order.index("[reconnected]") < order.index("[saved]"), out
    assert order[-1] == "[exited]" and "still the trainer" in out and "not signalled again" in out
    assert "stopped: checkpoint" in out and "step_" in out
    assert t.output.count("SIGINT received") == 1, t.output
    assert "ignored until the save ends" not in t.output


def _wait(pred, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")

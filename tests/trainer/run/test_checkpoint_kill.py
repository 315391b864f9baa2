"""SIGKILL at each stage of the checkpoint writer never leaves `latest` naming a broken checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.trainer_run import ROOT, Trainer, env, events, steps, tiny_flags
from trainer.run import checkpoint

WRITER = """
import os, sys
from trainer.run import checkpoint
def payload(d):
    os.makedirs(os.path.join(d, "drafter"))
    with open(os.path.join(d, "drafter", "model.safetensors"), "wb") as f:
        f.write(os.urandom(300_000))
    with open(os.path.join(d, "state.pt"), "wb") as f:
        f.write(b"s" * 5000)
for step in (1, 2):
    checkpoint.save(sys.argv[1], step, payload, {"cursor": step})
print("DONE", flush=True)
"""


def _named_by_latest(root) -> str:
    return (root / "latest").read_text().strip()


@pytest.mark.parametrize("stage", checkpoint.STAGES)
def test_sigkill_during_second_save(tmp_path, stage):
    root = tmp_path / "checkpoints"
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=env(DFLASH_TEST_PAUSE_AT=stage, DFLASH_TEST_PAUSE_SAVE="2"),
    )
    try:
        line = p.stdout.readline()
        assert line.startswith(f"DFLASH_TEST_PAUSE {stage} "), line
        os.kill(p.pid, signal.SIGKILL)
    finally:
        p.kill()
        p.wait(10)
    name = _named_by_latest(root)
    assert checkpoint.is_complete(str(root / name)), (
        f"latest names a broken checkpoint after a kill at {stage}"
    )
    expected = "step_00000002" if stage == "latest_written" else "step_00000001"
    assert name == expected
    assert checkpoint.latest(str(root)) == str(root / name)
    # what a restart cleans up: temp folders / temp latest; complete checkpoints stay
    checkpoint.remove_partial(str(root))
    left = sorted(os.listdir(root))
    assert all(n == "latest" or checkpoint.is_complete(str(root / n)) for n in left), left


def test_truncated_file_is_not_complete(tmp_path):
    root = tmp_path / "c"

    def payload(d):
        with open(os.path.join(d, "state.pt"), "wb") as f:
            f.write(b"x" * 100)

    path, nbytes = checkpoint.save(str(root), 7, payload, {})
    assert checkpoint.is_complete(path) and nbytes > 100
    with open(os.path.join(path, "state.pt"), "r+b") as f:
        f.truncate(50)
    assert not checkpoint.is_complete(path)
    assert checkpoint.latest(str(root)) is None


@pytest.mark.e2e
def test_trainer_killed_mid_save_restarts_from_previous_checkpoint(tiny_assets, tmp_path):
    out = tmp_path / "run"
    flags = tiny_flags(tiny_assets, out, "--max-steps", "6", "--save-every", "2")
    t = Trainer(flags, DFLASH_TEST_PAUSE_AT="synced", DFLASH_TEST_PAUSE_SAVE="2")
    t.wait_line("DFLASH_TEST_PAUSE synced")  # step 4's checkpoint fully written, not yet renamed
    t.kill()
    root = out / "checkpoints"
    assert _named_by_latest(root) == "step_00000002"
    assert checkpoint.is_complete(str(root / "step_00000002"))
    assert any(".tmp-" in n for n in os.listdir(root))
    # run.json still names the killed pid: a restart must not take it for a live trainer
    assert json.loads((out / "run.json").read_text())["pid"] == t.proc.pid
    # restart, then SIGTERM it as soon as it runs (maybe before its first step): it stops cleanly
    t2 = Trainer([*flags, "--resume", "auto"])
    t2.wait_line("trainer ")
    t2.signal(signal.SIGTERM)
    assert t2.wait() == 0, t2.output
    assert "removed an unfinished checkpoint folder" in t2.output
    assert not any(".tmp-" in n for n in os.listdir(root))
    started = [e for e in events(out) if e["name"] == "started"]
    assert [e["step"] for e in started] == [0, 2]
    names = [e["name"] for e in events(out)]
    assert names[names.index("started", 1) :] == [
        "started",
        "stop_requested",
        "checkpoint_saving",
        "checkpoint_saved",
        "stopped",
    ]
    ev = events(out)
    assert ev[-4]["signal"] == "SIGTERM" and ev[-1]["reason"] == "signal" and ev[-1]["exit_code"] == 0
    assert ev[-3]["expected_s"] is not None  # the killed run's first save took a known time
    k = ev[-2]["step"]
    assert k >= 2 and _named_by_latest(root) == f"step_{k:08d}"
    assert checkpoint.is_complete(str(root / f"step_{k:08d}"))
    if k > 2:
        assert [s["step"] for s in steps(out)][-(k - 2) :] == list(range(3, k + 1))

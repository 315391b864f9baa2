"""A full disk during a save, periodic saves, and how many checkpoints are kept.

The full disk is a real small tmpfs (a 256 KiB one where ``unshare -rm`` may mount one, for the writer alone;
one mounted here under the real trainer's run directory), and the tests' fault ``DFLASH_TEST_ENOSPC_SAVE``
(tests/support/faults.py) for the real trainer: half of each payload file is written, then ``OSError(ENOSPC)``
is raised from inside the writer, as a failing ``write`` does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.tmpfs import tmpfs
from tests.support.trainer_run import ROOT, Trainer, env, events, tiny_flags, wait_for_record
from trainer.run import checkpoint
from trainer.run.flags import SAVE_EVERY_MINUTES, build_parser

WRITER = """
import json, os, sys
from trainer.run import checkpoint
def payload(d):
    with open(os.path.join(d, "state.pt"), "wb") as f:
        f.write(b"s" * 50_000)
out = []
for step in (1, 2, 3, 4):
    try:
        checkpoint.save(sys.argv[1], step, payload, {}, keep=2)
        out.append([step, "ok", checkpoint.latest(sys.argv[1]), checkpoint.list_steps(sys.argv[1])])
    except OSError as e:
        out.append([step, e.errno, checkpoint.latest(sys.argv[1]), checkpoint.list_steps(sys.argv[1])])
print(json.dumps(out))
"""


def test_full_disk_removes_the_partial_save_and_keeps_latest(tmp_path):
    root = tmp_path / "checkpoints"
    r = subprocess.run(
        [sys.executable, "-c", WRITER, str(root)],
        cwd=ROOT,
        env=env(DFLASH_TEST_ENOSPC_SAVE="3"),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    import json

    out = json.loads(r.stdout)
    s = lambda n: str(root / checkpoint.step_dir_name(n))  # noqa: E731
    assert out[0] == [1, "ok", s(1), ["step_00000001"]]
    assert out[1] == [2, "ok", s(2), ["step_00000001", "step_00000002"]]
    # save 3 hit a full disk: nothing of it is left, latest and both complete checkpoints stay
    assert out[2] == [3, 28, s(2), ["step_00000001", "step_00000002"]]
    # the next save works and only then is the older one pruned (keep=2)
    assert out[3] == [4, "ok", s(4), ["step_00000002", "step_00000004"]]
    assert sorted(os.listdir(root)) == ["latest", "step_00000002", "step_00000004"]


def _can_mount_tmpfs(tmp_path) -> bool:
    d = tmp_path / "probe"
    d.mkdir()
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {d}"],
        capture_output=True,
        timeout=30,
    )
    return r.returncode == 0


def test_a_real_full_tmpfs_removes_the_partial_save_and_keeps_latest(tmp_path):
    """The same on a real full filesystem: a 256 KiB tmpfs (mounted in a user + mount namespace,
    `unshare -rm`) holds two 100 KB checkpoints; the third save fails with ENOSPC from the kernel."""
    if not shutil.which("unshare") or not _can_mount_tmpfs(tmp_path):
        pytest.skip("no tmpfs can be mounted here (unshare -rm refused)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    writer = WRITER.replace("(1, 2, 3, 4)", "(1, 2, 3)").replace("50_000", "100_000")
    script = tmp_path / "writer.py"
    script.write_text(writer)
    r = subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            f"mount -t tmpfs -o size=256k tmpfs {mnt} && exec {sys.executable} {script} {mnt}/checkpoints",
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    s = lambda n: f"{mnt}/checkpoints/{checkpoint.step_dir_name(n)}"  # noqa: E731
    assert out[1] == [2, "ok", s(2), ["step_00000001", "step_00000002"]]
    assert out[2] == [3, 28, s(2), ["step_00000001", "step_00000002"]]  # ENOSPC; nothing of it left


def test_new_flags_have_defaults_so_old_run_json_argv_restarts():
    old_argv = ["--target-model", "t", "--data-dir", "d", "--output-dir", "o", "--save-every", "20"]
    a = build_parser().parse_args(old_argv)
    assert a.save_every_minutes == SAVE_EVERY_MINUTES > 0 and a.keep_checkpoints == 2
    a = build_parser().parse_args([*old_argv, "--save-every-minutes", "0.5", "--keep-checkpoints", "5"])
    assert a.save_every_minutes == 0.5 and a.keep_checkpoints == 5
    for bad in (["--save-every-minutes", "-1"], ["--save-every-minutes", "nan"], ["--keep-checkpoints", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*old_argv, *bad])


@pytest.mark.e2e
def test_trainer_survives_a_full_disk_and_a_failed_final_save_exits_4(tiny_assets, tmp_path):
    """Saves 2 and 4 of the process hit a full disk: the periodic one is reported and training goes on,
    the next periodic save works, the stop's save fails: exit 4, latest still the last complete one."""
    out = tmp_path / "run"
    flags = tiny_flags(tiny_assets, out, "--epochs", "50", "--save-every", "2", "--keep-checkpoints", "3")
    t = Trainer(flags, DFLASH_TEST_ENOSPC_SAVE="2,4")
    try:
        err = wait_for_record(out, "error event", lambda r: r.get("name") == "error", t)
        assert "checkpoint at step 4 failed" in err["message"] and "No space left" in err["message"]
        assert "MB free" in err["message"]
        wait_for_record(out, "the retry", lambda r: r.get("name") == "checkpoint_saved" and r["step"] == 6, t)
        t.signal()
        rc = t.wait()
    finally:
        t.kill()
    assert rc == 4, t.output
    ev = [(e["name"], e.get("step")) for e in events(out)]
    assert ev[-1] == ("stopped", None) and events(out)[-1]["reason"] == "checkpoint_failed"
    assert events(out)[-1]["exit_code"] == 4
    saved = [s for n, s in ev if n == "checkpoint_saved"]
    assert saved == [2, 6]
    failed = [e for e in events(out) if e["name"] == "error"]
    assert [e["step"] for e in failed] == [4, ev[ev.index(("stop_requested", None)) + 1][1]]
    root = out / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_00000006"
    assert sorted(n for n in os.listdir(root) if n.startswith("step_")) == ["step_00000002", "step_00000006"]
    assert "training goes on; the next save tries again" in t.output


@pytest.mark.e2e
def test_periodic_saves_by_time_keep_only_the_newest(tiny_assets, tmp_path):
    """--save-every-minutes saves on its own (no stop_requested before it); --keep-checkpoints 1
    keeps exactly the newest complete one, pruned only after the newer one is complete."""
    out = tmp_path / "run"
    flags = tiny_flags(
        tiny_assets, out, "--epochs", "50", "--save-every-minutes", "0.005", "--keep-checkpoints", "1"
    )
    t = Trainer(flags)
    try:
        saved: set[int] = set()

        def second_save(r: dict) -> bool:
            if r.get("name") == "checkpoint_saved":
                saved.add(r["step"])
            return len(saved) >= 2

        wait_for_record(out, "two timed saves", second_save, t)
        t.signal()
        rc = t.wait()
    finally:
        t.kill()
    assert rc == 0, t.output
    names = [e["name"] for e in events(out)]
    first_stop = names.index("stop_requested")
    assert names[:first_stop].count("checkpoint_saved") >= 2  # periodic, by time
    root = out / "checkpoints"
    steps_left = sorted(n for n in os.listdir(root) if n.startswith("step_"))
    assert steps_left == [(root / "latest").read_text().strip()]
    assert checkpoint.is_complete(str(root / steps_left[0]))


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("size", "writer"),
    [
        ("128k", "safetensors"),
        ("448k", "torch.save"),
    ],  # the drafter's weights do not fit / the state.pt does not
)
def test_a_real_full_disk_fails_the_save_not_the_run(tiny_assets, tmp_path, size, writer):
    """The run directory on a real tmpfs too small for one checkpoint (626 KB): the writers' own errors (safetensors'
    SafetensorError, torch.save's RuntimeError) are a failed save like any OSError: the periodic save's error
    event, training goes on; the stop's save fails too: exit 4, reason checkpoint_failed, nothing partial left."""
    with tmpfs(tmp_path / "disk", size) as disk:
        out = disk / "run"
        t = Trainer(tiny_flags(tiny_assets, out, "--epochs", "50", "--save-every", "2"))
        try:
            err = wait_for_record(out, "error event", lambda r: r.get("name") == "error", t)
            assert err["step"] == 2 and "checkpoint at step 2 failed: [Errno 28]" in err["message"], err
            wait_for_record(out, "a step after it", lambda r: r.get("kind") == "step" and r["step"] >= 3, t)
            t.signal()
            rc = t.wait()
        finally:
            t.kill()
        assert rc == 4, t.output
        last = events(out)[-1]
        assert (last["name"], last["reason"], last["exit_code"]) == ("stopped", "checkpoint_failed", 4)
        assert "training goes on; the next save tries again" in t.output
        assert "Traceback" not in t.output
        assert [n for n in os.listdir(out / "checkpoints") if n.startswith("step_")] == []  # nothing partial
        assert not (out / "checkpoints" / "latest").exists()


@pytest.mark.e2e
def test_the_environment_holds_no_test_hook(tiny_assets, tmp_path):
    """A DFLASH_TEST_* variable in a production trainer's environment (run.json's env, carried by a restart) does
    nothing: the trainer reads none; only the tests' own module (tests/support/faults.py) acts on them."""
    out = tmp_path / "run"
    e = {
        "DFLASH_TEST_ENOSPC_SAVE": "1,2,3",
        "DFLASH_TEST_NAN_STEPS": "1,2,3,4,5",
        "DFLASH_TEST_PAUSE_AT": "synced",
    }
    t = subprocess.Popen(
        [sys.executable, "-m", "trainer.pipeline", *tiny_flags(tiny_assets, out, "--max-steps", "4")],
        cwd=ROOT,
        env={**env(), **e},  # not env(**e): that adds the tests' fault module to the path
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output, _ = t.communicate(timeout=180)
    assert t.returncode == 0, output
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    assert "DFLASH_TEST_PAUSE" not in output and not [e for e in events(out) if e["name"] == "error"]

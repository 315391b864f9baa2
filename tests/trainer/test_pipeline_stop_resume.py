"""Stop cleanly and resume exactly: the real trainer on the tiny target, stopped by real signals."""

from __future__ import annotations

import json
import signal

import pytest

from tests.support.trainer_run import (
    Trainer,
    events,
    run,
    run_in_process,
    session_members,
    startup,
    steps,
    tiny_flags,
    wait_for_step,
)

pytestmark = pytest.mark.e2e

N = 10  # optimizer steps of the reference run
EXTRA = (
    "--max-steps",
    str(N),
    "--grad-accum",
    "2",
    "--noise-start",
    "0.2",
    "--noise-end",
    "0.05",
    "--noise-type",
    "gaussian",
    "--seed",
    "3",
    "--est-anchors",  # measuring blocks on (their own generator, seeded per micro-batch): resume stays exact
    "12",
    "--est-holdout",  # in held-out sequences, one ending each micro-batch (a function of its index)
    "4",
)


def test_sigint_saves_and_resume_matches_uninterrupted_run(tiny_assets, tmp_path):
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    ref = Trainer(tiny_flags(tiny_assets, ref_dir, *EXTRA))  # runs alongside the interrupted one
    # the stop's checkpoint write is held until `release` exists, so that a second SIGINT lands during the save
    release = tmp_path / "release"
    cut = Trainer(
        tiny_flags(tiny_assets, cut_dir, *EXTRA),
        DFLASH_TEST_PAUSE_AT="files_written",
        DFLASH_TEST_PAUSE_UNTIL=str(release),
    )
    wait_for_step(cut_dir, 3, cut)
    cut.signal(signal.SIGINT)
    cut.wait_line("DFLASH_TEST_PAUSE files_written")
    cut.signal(signal.SIGINT)
    cut.wait_line("SIGINT received while a checkpoint is being written: ignored until the save ends")
    assert cut.proc.poll() is None  # still saving
    release.touch()
    assert cut.wait() == 0, cut.output
    assert ref.wait() == 0, ref.output

    # events in order, exit 0, nothing left of the process group
    names = [e["name"] for e in events(cut_dir)]
    assert names == ["started", "stop_requested", "checkpoint_saving", "checkpoint_saved", "stopped"], names
    ev = {e["name"]: e for e in events(cut_dir)}
    assert ev["stop_requested"]["signal"] == "SIGINT"
    assert ev["checkpoint_saving"]["expected_s"] is None  # first save of the run
    assert ev["stopped"] == {**ev["stopped"], "reason": "signal", "exit_code": 0}
    assert session_members(cut.proc.pid) == []
    k = ev["checkpoint_saved"]["step"]
    assert 3 <= k < N, k

    # latest names a complete, loadable checkpoint of step k
    ckpt = cut_dir / "checkpoints" / (cut_dir / "checkpoints" / "latest").read_text().strip()
    assert str(ckpt) == ev["checkpoint_saved"]["path"]
    assert json.loads((ckpt / "manifest.json").read_text())["step"] == k
    from trainer.model import load_drafter

    drafter, cfg = load_drafter(ckpt / "drafter")
    assert cfg.block_size == 8 and sum(p.numel() for p in drafter.parameters()) > 0

    # resumed: the remaining steps equal the uninterrupted run's bit for bit
    rc, out = run(tiny_flags(tiny_assets, cut_dir, *EXTRA, "--resume", "auto"))
    assert rc == 0, out
    ref_steps = {s["step"]: s for s in steps(ref_dir)}
    # the second start of the run: its estimate is the first start's, its compile cache is reused
    firsts = startup(cut_dir, phase="first_step")
    assert len(firsts) == 2 and firsts[1]["expected_s"] == pytest.approx(firsts[0]["seconds"], abs=1e-3)
    assert [r["state"] for r in startup(cut_dir, phase="compile_cache")] == ["cold", "warm"]
    starts = [e for e in events(cut_dir) if e["name"] == "started"]
    assert starts[0]["expected_first_step_s"] is None
    assert starts[1]["expected_first_step_s"] == pytest.approx(firsts[0]["seconds"], abs=1e-3)
    assert sorted(ref_steps) == list(range(1, N + 1))
    after = [s for s in steps(cut_dir) if s["step"] > k]
    resumed = after[-(N - k) :]
    assert [s["step"] for s in resumed] == list(range(k + 1, N + 1))
    for s in resumed:
        r = ref_steps[s["step"]]
        assert s["accept_len_est_anchors"] == r["accept_len_est_anchors"] == "heldout_runs"
        assert (s["accept_len_est_step"], s["accept_len_est_uniform"]) == (
            r["accept_len_est_step"],
            r["accept_len_est_uniform"],
        )
        assert (s["loss"], s["grad_norm"], s["lr"], s["acc"], s["tokens"], s["accept_len_est"]) == (
            r["loss"],
            r["grad_norm"],
            r["lr"],
            r["acc"],
            r["tokens"],
            r["accept_len_est"],  # its running mean's window travels in the checkpoint
        ), s["step"]
    started = [e for e in events(cut_dir) if e["name"] == "started"]
    assert started[-1]["step"] == k
    # the resumed run's first save knows how long the last one took
    saving = [e for e in events(cut_dir) if e["name"] == "checkpoint_saving"]
    assert saving[-1]["expected_s"] is not None and saving[-1]["expected_s"] > 0

    # the same run in this process (tests/support/trainer_run.py run_in_process, which the variants of this flow
    # use) gives the real process's steps bit for bit
    here = tmp_path / "here"
    assert run_in_process(tiny_flags(tiny_assets, here, *EXTRA)) == 0
    fields = ("loss", "grad_norm", "lr", "acc", "tokens", "accept_len_est", "accept_len_est_uniform")
    assert [[s[f] for f in fields] for s in steps(here)] == [
        [ref_steps[i][f] for f in fields] for i in ref_steps
    ]

    # a resume under another data plan is refused, naming the flag: its cursor counts the old plan's micro-batches
    latest = (cut_dir / "checkpoints" / "latest").read_text()
    rc, out = run(tiny_flags(tiny_assets, cut_dir, *EXTRA, "--max-steps", str(N + 2), "--est-holdout", "2"))
    assert rc == 2, out
    assert "--est-holdout: checkpoint" in out and "trained with --est-holdout 4, not 2" in out, out
    assert [s["step"] for s in steps(cut_dir)][-1] == N  # no step taken
    assert (cut_dir / "checkpoints" / "latest").read_text() == latest

"""``--arch dflash2`` through the real trainer on the tiny target, in this process (the flow itself runs in
real processes in tests/trainer/test_pipeline_stop_resume.py): it trains, stops on SIGINT, and resumes
exactly (the uninterrupted run's steps bit for bit); its checkpoints hold the DFlash 2 layout."""

from __future__ import annotations

import json
import math
import shutil

from tests.support.trainer_run import dflash2_flags, events, run_in_process, steps, tiny_flags

N = 6
SELECTOR_FIELDS = ("selector_loss", "selector_recall", "selector_acc")
EXTRA = (*dflash2_flags(N), "--use-soft-labels")


def test_dflash2_trains_stops_and_resumes_exactly(tiny_assets, tmp_path, capfd):
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    assert run_in_process(tiny_flags(tiny_assets, ref_dir, *EXTRA)) == 0, capfd.readouterr()
    assert run_in_process(tiny_flags(tiny_assets, cut_dir, *EXTRA), stop_after_step=2) == 0, (
        capfd.readouterr()
    )
    saved = [e for e in events(cut_dir) if e["name"] == "checkpoint_saved"]
    k = saved[-1]["step"]
    assert 2 <= k < N, k
    ckpt = cut_dir / "checkpoints" / (cut_dir / "checkpoints" / "latest").read_text().strip()
    for sub in ("drafter", "export"):
        c = json.loads((ckpt / sub / "config.json").read_text())
        assert c["architectures"] == ["DFlash2DraftModel"], sub
        assert {c["dflash_config"][f] for f in ("selector_rank", "selector_top_k")} == {8, 4}
        assert (c["dflash_config"]["conv_kernel_size"], c["dflash_config"]["conv_group_size"]) == (2, 16)

    assert run_in_process(tiny_flags(tiny_assets, cut_dir, *EXTRA, "--resume", "auto")) == 0, (
        capfd.readouterr()
    )
    ref_steps = {s["step"]: s for s in steps(ref_dir)}
    assert sorted(ref_steps) == list(range(1, N + 1))
    resumed = [s for s in steps(cut_dir) if s["step"] > k][-(N - k) :]
    assert [s["step"] for s in resumed] == list(range(k + 1, N + 1))
    for s in resumed:
        r = ref_steps[s["step"]]
        assert (s["loss"], s["grad_norm"], s["acc"]) == (r["loss"], r["grad_norm"], r["acc"]), s["step"]
        assert [s[f] for f in SELECTOR_FIELDS] == [r[f] for f in SELECTOR_FIELDS], s["step"]
        est = ("accept_len_est", "accept_len_est_uniform")  # both running means travel in the checkpoint
        assert [s[f] for f in est] == [r[f] for f in est], s["step"]
    for s in ref_steps.values():  # the selector's own figures; the step loss is the drafter's plus its loss
        sel_loss, recall, acc = (s[f] for f in SELECTOR_FIELDS)
        assert all(math.isfinite(v) for v in (sel_loss, recall, acc)), s
        assert 0.0 < sel_loss <= s["loss"] + 1e-9, s
        assert 0.0 <= acc <= recall <= 1.0, s  # a teacher-forced hit needs the label among the candidates
    for s in ref_steps.values():  # soft labels give the target's logits: the estimate is judged by its argmax
        assert s["accept_len_est_vs"] == "target", s
        assert 1.0 <= s["accept_len_est"] <= 8.0 and 1.0 <= s["accept_len_est_uniform"] <= 8.0, s
    first, last = ref_steps[1], ref_steps[N]
    assert last["loss"] < first["loss"]  # it learns
    # an explicit --arch dflash: a DFlash 1 drafter cannot resume a DFlash 2 checkpoint (on a copy of the
    # run's checkpoints)
    arch_dir = tmp_path / "arch"
    shutil.copytree(cut_dir / "checkpoints", arch_dir / "checkpoints")
    # the data plan's and the labels' flags stay (a resume under another plan or other labels is refused)
    plan = ("--seed", "3", "--use-soft-labels")
    capfd.readouterr()
    rc = run_in_process(
        tiny_flags(tiny_assets, arch_dir, *plan, "--max-steps", str(N + 2), "--arch", "dflash")
    )
    output = "".join(capfd.readouterr())
    assert rc != 0 and "different drafter config" in output, output
    assert "arch" in output
    # the same flags minus --arch and the DFlash 2 fields: the checkpoint's come back (a restart needs none)
    rc = run_in_process(tiny_flags(tiny_assets, cut_dir, *plan, "--max-steps", str(N + 1)))
    assert rc == 0, capfd.readouterr()
    assert [s["step"] for s in steps(cut_dir)][-1] == N + 1
    ckpt = cut_dir / "checkpoints" / (cut_dir / "checkpoints" / "latest").read_text().strip()
    c = json.loads((ckpt / "drafter" / "config.json").read_text())
    assert c["architectures"] == ["DFlash2DraftModel"] and c["dflash_config"]["selector_rank"] == 8
    resolved = json.loads((cut_dir / "run.json").read_text())["drafter"]  # what the console shows
    assert (resolved["arch"], resolved["block_size"]) == ("dflash2", 8)

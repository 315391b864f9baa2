"""A hybrid target (tiny Qwen3.5 in the multimodal checkpoint layout) through ``python -m trainer.pipeline``:
packed rows, a clean SIGINT stop and an exact resume with the settings it was launched with; what is
refused up front. The runs are in this process (the stop-and-resume flow itself runs in real processes in
tests/trainer/test_pipeline_stop_resume.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.support.trainer_run import events, run_in_process, steps, tiny_flags

N = 6
EXTRA = ("--max-steps", str(N), "--token-budget", "512", "--seed", "5", "--noise-start", "0.1")
LAUNCHED = ("--num-draft-layers", "2")


def test_vl_layout_trains_packed_stops_and_resumes_exactly(tiny_hybrid, tmp_path, capfd):
    """Launched with 2 draft layers (not the family's 5: as a run launched before these defaults), stopped by
    SIGINT, then resumed WITHOUT the flag: it restarts with the 2 layers it was launched with, and its
    remaining steps equal an uninterrupted run's bit for bit."""
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    assert run_in_process(tiny_flags(tiny_hybrid, ref_dir, *EXTRA, *LAUNCHED)) == 0, capfd.readouterr()
    rc = run_in_process(tiny_flags(tiny_hybrid, cut_dir, *EXTRA, *LAUNCHED), stop_after_step=2)
    assert rc == 0, capfd.readouterr()
    names = [e["name"] for e in events(cut_dir)]
    assert names == ["started", "stop_requested", "checkpoint_saving", "checkpoint_saved", "stopped"], names
    k = next(e for e in events(cut_dir) if e["name"] == "checkpoint_saved")["step"]
    assert 2 <= k < N
    ref_steps = {s["step"]: s for s in steps(ref_dir)}
    assert sorted(ref_steps) == list(range(1, N + 1))
    assert max(s["tokens"] for s in ref_steps.values()) > 300  # packed: several documents a row
    capfd.readouterr()
    rc = run_in_process(tiny_flags(tiny_hybrid, cut_dir, *EXTRA, "--resume", "auto"))
    out = "".join(capfd.readouterr())
    assert rc == 0, out
    assert "2 layer(s), block 8" in out and "resuming from" in out, out
    resumed = [s for s in steps(cut_dir) if s["step"] > k][-(N - k) :]
    assert [s["step"] for s in resumed] == list(range(k + 1, N + 1))
    for s in resumed:
        r = ref_steps[s["step"]]
        assert (s["loss"], s["grad_norm"], s["acc"], s["tokens"]) == (
            r["loss"],
            r["grad_norm"],
            r["acc"],
            r["tokens"],
        ), s["step"]


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="flash-linear-attention is installed")
def test_hybrid_on_cuda_without_fla_fails_at_start_naming_the_package(tiny_hybrid, tmp_path, capfd):
    flags = tiny_flags(tiny_hybrid, tmp_path / "run")
    flags[flags.index("--target-gpus") + 1] = "0"
    flags[flags.index("--drafter-gpus") + 1] = "0"
    rc = run_in_process(flags)
    out = "".join(capfd.readouterr())
    assert rc == 2, out
    assert "error: --target-gpus:" in out and "flash-linear-attention" in out, out
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_linear_attention_target_without_per_document_capture_is_one_document_per_row(
    tiny_hybrid, tmp_path, capfd
):
    target = tmp_path / "next"
    target.mkdir()
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "layer_types": types}))
    flags = tiny_flags(tiny_hybrid, tmp_path / "run")
    flags[flags.index("--target-model") + 1] = str(target)
    rc = run_in_process(flags)
    out = "".join(capfd.readouterr())
    assert rc == 2, out
    assert "error: --max-batch-size:" in out and "one document per row" in out and "qwen3_next" in out, out

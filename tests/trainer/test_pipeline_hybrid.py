"""A hybrid target (tiny Qwen3.5 in the multimodal checkpoint layout) through ``python -m trainer.pipeline``:
packed rows, a clean SIGINT stop and an exact resume with the settings it was launched with; what is
refused up front."""

from __future__ import annotations

import importlib.util
import json
import signal

import pytest

from tests.support.trainer_run import Trainer, events, run, steps, tiny_flags, wait_for_step

N = 6
EXTRA = ("--max-steps", str(N), "--token-budget", "512", "--seed", "5", "--noise-start", "0.1")
LAUNCHED = ("--num-draft-layers", "2")


def test_vl_layout_trains_packed_stops_and_resumes_exactly(tiny_hybrid, tmp_path):
    """Launched with 2 draft layers (not the family's 5: as a run launched before these defaults), stopped by
    SIGINT, then resumed WITHOUT the flag: it restarts with the 2 layers it was launched with, and its
    remaining steps equal an uninterrupted run's bit for bit."""
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    ref = Trainer(tiny_flags(tiny_hybrid, ref_dir, *EXTRA, *LAUNCHED))
    cut = Trainer(tiny_flags(tiny_hybrid, cut_dir, *EXTRA, *LAUNCHED))
    wait_for_step(cut_dir, 2, cut)
    cut.signal(signal.SIGINT)
    assert cut.wait() == 0, cut.output
    assert ref.wait() == 0, ref.output
    names = [e["name"] for e in events(cut_dir)]
    assert names == ["started", "stop_requested", "checkpoint_saving", "checkpoint_saved", "stopped"], names
    k = next(e for e in events(cut_dir) if e["name"] == "checkpoint_saved")["step"]
    assert 2 <= k < N
    ref_steps = {s["step"]: s for s in steps(ref_dir)}
    assert sorted(ref_steps) == list(range(1, N + 1))
    assert max(s["tokens"] for s in ref_steps.values()) > 300  # packed: several documents a row
    rc, out = run(tiny_flags(tiny_hybrid, cut_dir, *EXTRA, "--resume", "auto"))
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
def test_hybrid_on_cuda_without_fla_fails_at_start_naming_the_package(tiny_hybrid, tmp_path):
    flags = tiny_flags(tiny_hybrid, tmp_path / "run")
    flags[flags.index("--target-gpus") + 1] = "0"
    flags[flags.index("--drafter-gpus") + 1] = "0"
    rc, out = run(flags)
    assert rc == 2, out
    assert "error: --target-gpus:" in out and "flash-linear-attention" in out, out
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_linear_attention_target_without_per_document_capture_is_one_document_per_row(tiny_hybrid, tmp_path):
    target = tmp_path / "next"
    target.mkdir()
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    (target / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "layer_types": types}))
    flags = tiny_flags(tiny_hybrid, tmp_path / "run")
    flags[flags.index("--target-model") + 1] = str(target)
    rc, out = run(flags)
    assert rc == 2, out
    assert "error: --max-batch-size:" in out and "one document per row" in out and "qwen3_next" in out, out

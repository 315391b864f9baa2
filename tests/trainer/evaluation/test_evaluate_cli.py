"""``python -m trainer.evaluate`` end to end on the tiny target: a saved drafter in the published layout
(block_size only inside dflash_config, no num_target_layers), the JSON report, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.trainer_run import ROOT, env

pytestmark = pytest.mark.e2e  # each test starts a real process


def test_evaluate_json_on_a_published_layout_drafter(tiny_assets, tmp_path):
    import torch
    from transformers import AutoConfig

    from trainer.drafting.config import DraftConfig
    from trainer.model import DFlashDrafter, save_drafter

    cfg = DraftConfig.from_target_config(
        AutoConfig.from_pretrained(tiny_assets / "target"), num_draft_layers=1, block_size=4
    )
    torch.manual_seed(0)
    out = tmp_path / "drafter"
    save_drafter(DFlashDrafter(cfg).to(torch.bfloat16), cfg, out)
    c = json.loads((out / "config.json").read_text())
    c["dflash_config"]["block_size"] = c.pop("block_size")
    del c["num_target_layers"]
    (out / "config.json").write_text(json.dumps(c))
    argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", str(tiny_assets / "target"),
            "--drafter", str(out), "--prompts", str(tiny_assets / "data"), "--num-prompts", "3",
            "--max-new-tokens", "24", "--json", "--save-outputs", str(tmp_path / "gen" / "out.jsonl")]  # fmt: skip
    r = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["prompts"] == 3 and rep["block_size"] == 4 and rep["temperature"] == 0
    assert rep["greedy_match"] is True and rep["greedy_mismatches"] == 0
    assert 1.0 <= rep["mean_accept_len"] < 1.5
    assert sum(rep["histogram"]) == rep["verify_steps"] and len(rep["per_position"]) == 3
    # the spread over prompts: each prompt's own figures rebuild the pooled mean
    assert rep["prompt_steps"] and len(rep["prompt_steps"]) == 3 == len(rep["prompt_accept_len"])
    pooled = (
        sum(m * n for m, n in zip(rep["prompt_accept_len"], rep["prompt_steps"], strict=True))
        / rep["verify_steps"]
    )
    assert abs(pooled - rep["mean_accept_len"]) < 1e-9 and rep["mean_accept_len_se"] >= 0
    assert rep["spec_tok_s"] > 0 and rep["target_tok_s"] > 0 and rep["speedup"] > 0
    assert rep["rewind_forwards"] == 0  # a KV-cache target is cropped, never run again
    # --save-outputs: prompt + output per line, in the training data's format, the output's tokens trained
    from trainer.data.dataset import load_dir

    ds = load_dir(str(tmp_path / "gen"), 4096)
    assert len(ds) == 3
    lines = [json.loads(x) for x in (tmp_path / "gen" / "out.jsonl").read_text().splitlines()]
    assert sum(sum(x["loss_mask"]) for x in lines) == rep["new_tokens"]
    for x in lines:
        n = sum(x["loss_mask"])
        assert 1 <= n <= 24 and x["loss_mask"] == [0] * (len(x["input_ids"]) - n) + [1] * n

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2, "x"]}\n')
    r = subprocess.run([*argv[:8], str(bad)], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"{bad}:1: input_ids must be a list of integers" in r.stderr


def test_evaluate_in_bf16_on_the_cpu(tiny_assets, tmp_path):
    """``--dtype bf16``: the CPU evaluation in a server's dtype (vLLM's CPU Gated DeltaNet runs bf16 only);
    both decoders in bf16, still lossless against the target's own bf16 greedy output."""
    from tests.support.model_util import saved_random_drafter

    drafter = saved_random_drafter(tiny_assets / "target", tmp_path / "drafter")
    argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", str(tiny_assets / "target"),
            "--drafter", str(drafter), "--prompts", str(tiny_assets / "data"), "--num-prompts",
            "2", "--max-new-tokens", "16", "--json", "--dtype", "bf16"]  # fmt: skip
    r = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["device"] == "cpu" and rep["dtype"] == "bfloat16" and rep["greedy_match"] is True
    r = subprocess.run([*argv[:-1], "fp16"], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--dtype: invalid choice: 'fp16'" in r.stderr

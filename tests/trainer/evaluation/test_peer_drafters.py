"""``trainer.evaluate`` on the peers' exports (tests/data/peers/: real SpecForge and speculators output for the
tiny target): the loader builds each as the drafter it is, with the file's weights, and the evaluation runs
(greedy output identical to the target's). In this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainer.evaluation.load import EvalError, load_drafter_any
from trainer.evaluation.run import main as evaluate_main

PEERS = Path(__file__).resolve().parents[2] / "data" / "peers"
NAMES = ["specforge-0.2.0-dflash", "speculators-0.9.0-dflash", "speculators-0.9.0-dflash2"]


@pytest.mark.parametrize("name", NAMES)
def test_the_evaluator_loads_a_peers_drafter_with_its_weights(tiny_assets, name):
    drafter, cfg = load_drafter_any(str(PEERS / name), str(tiny_assets / "target"), "cpu", torch.float32)
    assert cfg.num_target_layers == 6 and cfg.target_layer_ids == [3] and cfg.mask_token_id == 127
    assert cfg.arch == ("dflash2" if name.endswith("dflash2") else "dflash")
    want = load_file(str(PEERS / name / "model.safetensors"))
    got = drafter.state_dict()
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k].float(), got[k]) for k in want)


def test_evaluate_runs_on_speculators_dflash2_and_refuses_what_it_cannot_build(tiny_assets, tmp_path, capsys):
    base = ["--target-model", str(tiny_assets / "target"), "--prompts", str(tiny_assets / "data"),
            "--num-prompts", "2", "--max-new-tokens", "12", "--json"]  # fmt: skip
    assert evaluate_main([*base, "--drafter", str(PEERS / NAMES[2])]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["prompts"] == 2 and rep["block_size"] == 8 and rep["greedy_match"] is True
    bad = tmp_path / "sliding"
    bad.mkdir()
    (bad / "config.json").write_text((PEERS / "speculators-0.9.0-dflash-sliding" / "config.json").read_text())
    (bad / "model.safetensors").write_bytes((PEERS / NAMES[1] / "model.safetensors").read_bytes())
    with pytest.raises(EvalError, match="sliding_window_non_causal is false with sliding layers"):
        load_drafter_any(str(bad), str(tiny_assets / "target"), "cpu", torch.float32)

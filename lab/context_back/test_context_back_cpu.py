"""lab/context_back/context_back_cpu.py: its two drafters start as one function and train on the same batches and anchors,
so their first losses agree and only what context-back adds parts them; its per-slot figures are the conditional
acceptance of each slot over every anchor."""

from __future__ import annotations

import json

import pytest
import torch

from lab.context_back import context_back_cpu as cb
from lab.est_seen import PROMPT, SEQ
from tests.support.model_util import tiny_target
from trainer.drafting.head import FrozenHead


def test_per_slot_is_each_slots_acceptance_given_the_one_before():
    chains = [[0, 1, 7], [2, 0]]  # accepted slots per anchor (0 .. 7 of block 8's 7 drafted slots)
    got = cb.per_slot(chains)
    assert len(got) == cb.BLOCK - 1
    assert got[0] == 3 / 5 and got[1] == 2 / 3 and got[2] == 1 / 2 and got[6] == 1.0


def test_both_drafters_start_alike_and_train_on_the_same_batches(tmp_path):
    target = tiny_target()
    target.save_pretrained(tmp_path / "target")
    plain, wide = cb.make_drafters(str(tmp_path / "target"), 2)
    assert wide.back == 2 and wide.fc.in_features == 3 * plain.fc.in_features
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 250, (6, SEQ), generator=g)
    rows = [(r.tolist(), [0] * PROMPT + [1] * (SEQ - PROMPT)) for r in ids]
    cache = cb.cache_states(target, rows, list(plain.cfg.target_layer_ids), batch=4)
    assert cache[0].dtype == torch.bfloat16 and cache[0].shape == (6, SEQ, plain.fc.in_features)
    head = FrozenHead.from_model(target)
    losses = cb.train([plain, wide], head, cache, steps=3, batch=2, seed=1, log=lambda msg: None)
    assert [len(x) for x in losses] == [3, 3]
    assert abs(losses[0][0] - losses[1][0]) < 1e-5  # one function at the start, on the same batch and anchors
    assert losses[0][1:] != losses[1][1:]  # then the positions before reach the context-back one


def test_each_prompt_is_walked_and_two_targets_runs_pair_by_prompt(tmp_path):
    rep = cb.prompt_report([[0, 1, 0, 2], [7, 0]])
    # prompt 1: steps at anchors 0 (accepts 0, +1), 1 (1 + 1), 3 (2 + 1): 6 tokens in 3 steps; prompt 2: 8 in 1
    assert rep == {"prompts": 2, "prompt_steps": [3, 1], "prompt_accept_len": [2.0, 8.0]}
    other = cb.prompt_report([[0, 3, 0, 2], [7, 0]])
    runs = []
    for i, (p, c) in enumerate(((rep, rep), (rep, other))):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps({"args": {"seed": 1, "prompts": 2}, "plain": p, "context_back_2": c}))
        runs.append(str(path))
    got = cb.compare(*runs)
    assert got["plain_over_plain"]["ratio"] == 1.0
    assert got["context_back_2_over_context_back_2"]["ratio"] > 1.0  # B's context-back drafter walks further
    alone = tmp_path / "alone.json"  # a --context-back-only run pairs with the plain drafter of another run
    alone.write_text(json.dumps({"args": {"seed": 1, "prompts": 2}, "context_back_2": other}))
    assert list(cb.compare(runs[0], str(alone))) == [
        "context_back_2_over_plain",
        "context_back_2_over_context_back_2",
    ]
    assert cb.compare(runs[0], str(alone))["context_back_2_over_plain"]["ratio"] > 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"args": {"seed": 2, "prompts": 2}, "plain": rep}))
    with pytest.raises(SystemExit, match="other prompts"):
        cb.compare(runs[0], str(bad))
    # the same seed on two Pythons' standard libraries draws other prompts: refused once both runs say so
    for name, sha in (("here", "a" * 64), ("there", "b" * 64)):
        (tmp_path / f"{name}.json").write_text(
            json.dumps({"args": {"seed": 1, "prompts": 2}, "corpus": {"sha256": sha}, "plain": rep})
        )
    with pytest.raises(SystemExit, match="corpora"):
        cb.compare(str(tmp_path / "here.json"), str(tmp_path / "there.json"))
    assert (
        cb.compare(str(tmp_path / "here.json"), str(tmp_path / "here.json"))["plain_over_plain"]["ratio"]
        == 1.0
    )

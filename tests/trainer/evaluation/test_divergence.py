"""Greedy divergences told apart: a near tie of the target's two best tokens against a token the target never
preferred (trainer/evaluation/divergence.py), on the tiny target (fp32, CPU), and pooled over shards."""

from __future__ import annotations

import pytest
import torch

from trainer.evaluation.divergence import NEAR_TIE, divergence, first_difference
from trainer.evaluation.report import pool
from trainer.evaluation.spec_decode import CachedTarget, target_generate


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([], [4]) == 0


@pytest.fixture(scope="module")
def greedy(tiny_assets):
    from tests.support.model_util import tiny_prompts
    from trainer.evaluation.load import load_target_model

    model = load_target_model(str(tiny_assets / "target"), "cpu", torch.float32)
    target = CachedTarget(model, [1])
    prompt = tiny_prompts(tiny_assets, 1)[0]
    return model, target, prompt, target_generate(target, prompt, 12).tokens


def _logits_at(model, ids: list[int]) -> torch.Tensor:
    """The model's own last-position logits (a plain forward, not the engine)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


@pytest.mark.parametrize("pick", ["runner_up", "last"])
def test_the_gap_is_the_targets_own_lead_of_its_token_over_the_drafted_one(greedy, pick):
    model, target, prompt, base = greedy
    k = 5
    row = _logits_at(model, prompt + base[:k])
    order = torch.argsort(row, descending=True).tolist()
    assert order[0] == base[k]  # the greedy token leads
    other = order[1] if pick == "runner_up" else order[-1]
    spec = base[:k] + [other] + base[k + 1 :]
    d = divergence(target, prompt, base, spec)
    want = float(row[base[k]] - row[other])
    assert d["at"] == k and (d["base_token"], d["spec_token"]) == (base[k], other)
    assert d["gap"] == pytest.approx(want, rel=1e-4, abs=1e-5) and d["gap"] > 0
    assert d["rel_gap"] == pytest.approx(abs(want) / float(row.abs().max()), rel=1e-4)
    assert d["near_tie"] == (d["rel_gap"] <= NEAR_TIE)
    if pick == "last":  # the token the target likes least is never a tie
        assert not d["near_tie"]


def test_equal_outputs_and_an_early_stop(greedy):
    _model, target, prompt, base = greedy
    assert divergence(target, prompt, base, list(base)) is None
    assert divergence(target, prompt, base, base[:4]) == {"at": 4, "ended": "spec"}


def _shard(n: int, divergences: list[dict]) -> dict:
    return {
        "histogram": [n],
        "block_size": 4,
        "prompt_accept_len": [1.0] * n,
        "prompt_steps": [1] * n,
        "prompts": n,
        "new_tokens": n,
        "rewind_forwards": 0,
        "greedy_mismatches": len(divergences),
        "greedy_divergences": divergences,
        "drafter": "d",
        "target": "t",
        "temperature": 0.0,
        "max_new_tokens": 1,
        "spec_tok_s": 1.0,
        "target_tok_s": 1.0,
        "seconds": 1.0,
    }


def test_pooled_shards_keep_each_divergence_with_its_prompt_in_the_pooled_order():
    tie = {"prompt": 1, "at": 3, "gap": 0.01, "rel_gap": 0.001, "near_tie": True}
    far = {"prompt": 0, "at": 7, "gap": 2.0, "rel_gap": 0.2, "near_tie": False}
    got = pool([_shard(3, [tie]), _shard(2, [far])])
    assert got["greedy_mismatches"] == 2 and got["greedy_mismatches_near_tie"] == 1
    assert [d["prompt"] for d in got["greedy_divergences"]] == [1, 3]
    assert got["greedy_mismatch_max_rel_gap"] == 0.2


def test_the_text_report_says_how_many_differing_prompts_were_near_ties():
    from trainer.evaluation.report import format_report

    tie = {"prompt": 0, "at": 3, "gap": 0.01, "rel_gap": 0.001, "near_tie": True}
    far = {"prompt": 1, "at": 7, "gap": 2.0, "rel_gap": 0.2, "near_tie": False}
    r = {**pool([_shard(3, [tie, far])]), "device": "cuda:0", "speedup": 1.0}
    assert "NO (2 prompt(s) differ; 1 at a near tie, largest gap 2.0e-01 of the top logit)" in format_report(
        r
    )

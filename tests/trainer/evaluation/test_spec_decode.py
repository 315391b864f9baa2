"""The decoding loop's bookkeeping, through oracle drafters (doubles of the proposal interface) and the real
drafter, on the tiny target (trainer.tiny; fp32 on CPU)."""

from __future__ import annotations

import pytest
import torch

from trainer.evaluation.drafter_cache import DrafterProposer, Proposal
from trainer.evaluation.report import summarize
from trainer.evaluation.spec_decode import CachedTarget, speculative_generate, target_generate

BS = 8
NEW = 40


class Oracle:
    """Proposes the target's own greedy continuation ``ref`` (prompt + tokens), right on the first ``right``
    drafted positions of every block and wrong (another token) after them."""

    def __init__(self, ref: list[int], right: int, vocab: int):
        self.ref, self.right, self.vocab = ref, right, vocab
        self.block_size = BS

    def reset(self) -> None:
        pass

    def propose(self, tokens, new_features, temperature, generator):
        assert tokens == self.ref[: len(tokens)], "the loop's accepted tokens left the greedy path"
        start = len(tokens)
        out = []
        for k in range(BS - 1):
            t = self.ref[start + k]
            out.append(t if k < self.right else (t + 1) % self.vocab)
        return Proposal(torch.tensor(out))


@pytest.fixture(scope="module")
def setup(tiny_assets):
    from tests.support.model_util import tiny_prompts
    from trainer.evaluation.load import load_target_model

    torch.manual_seed(0)
    model = load_target_model(str(tiny_assets / "target"), "cpu", torch.float32)
    target = CachedTarget(model, [1, 3])
    prompts = tiny_prompts(tiny_assets, 3)
    refs = [p + target_generate(target, p, NEW + 2 * BS).tokens for p in prompts]
    return model, target, prompts, refs


@pytest.mark.parametrize("right", [BS - 1, 0, 2, 5])
def test_an_oracle_right_on_j_positions_gets_exactly_j_plus_1(setup, right):
    model, target, prompts, refs = setup
    lens = []
    for p, ref in zip(prompts, refs, strict=True):
        g = speculative_generate(target, Oracle(ref, right, model.config.vocab_size), p, NEW)
        assert g.tokens == ref[len(p) : len(p) + NEW]
        lens += g.accept_lens
    s = summarize(lens, BS)
    assert s["mean_accept_len"] == right + 1  # the perfect oracle (right = BS - 1): the block size
    assert s["histogram"][right] == len(lens)
    assert s["per_position"] == [1.0] * right + [0.0] * (BS - 1 - right)


def test_real_random_drafter_accepts_about_one_and_keeps_the_greedy_output(setup):
    from tests.support.model_util import tiny_drafter

    model, target, prompts, refs = setup
    drafter, _ = tiny_drafter(target_config=model.config, block_size=BS, target_layer_ids=[1, 3])
    prop = DrafterProposer(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    lens = []
    for p, ref in zip(prompts, refs, strict=True):
        g = speculative_generate(target, prop, p, NEW)
        assert g.tokens == ref[len(p) : len(p) + NEW]  # token for token the target's greedy output
        lens += g.accept_lens
    assert 1.0 <= summarize(lens, BS)["mean_accept_len"] < 1.1


def test_sampling_runs_the_real_drafter_and_stops_at_eos(setup):
    from tests.support.model_util import tiny_drafter

    model, target, prompts, _ = setup
    drafter, _ = tiny_drafter(target_config=model.config, block_size=BS, target_layer_ids=[1, 3])
    prop = DrafterProposer(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    g = speculative_generate(target, prop, prompts[0], NEW, 1.0, torch.Generator().manual_seed(0))
    assert len(g.tokens) == NEW and all(1 <= n <= BS for n in g.accept_lens)
    eos = g.tokens[5]
    g2 = speculative_generate(target, prop, prompts[0], NEW, 1.0, torch.Generator().manual_seed(0), {eos})
    assert g2.tokens[-1] == eos and eos not in g2.tokens[:-1] and len(g2.tokens) <= 6

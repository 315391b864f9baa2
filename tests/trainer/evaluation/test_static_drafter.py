"""The static-buffer drafter (``static_drafter.StaticProposer``, the GPU evaluation's) proposes what
``DrafterProposer`` proposes: the same tokens (greedy) and the same proposal distributions (sampled), call
after call as the context grows by uneven runs, for DFlash 1 (full and sliding layers) and DFlash 2 (the
selector's walk); fp32 on the CPU, the code its CUDA graph captures."""

from __future__ import annotations

import pytest
import torch

from tests.support.model_util import random_embed, tiny_drafter
from trainer.evaluation.drafter_cache import DrafterProposer
from trainer.evaluation.static_drafter import StaticProposer

BS = 6
CONFIGS = {
    "dflash": {},
    "sliding": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5},
    "dflash2": {"arch": "dflash2", "dflash2": {"selector_rank": 8, "selector_top_k": 4}},
}


def _drafter(name: str):
    drafter, cfg = tiny_drafter(block_size=BS, **CONFIGS[name])
    if name == "dflash2":
        with torch.no_grad():  # a selector whose transition term matters
            drafter.candidate_selector.successor_codebook.normal_(std=3.0)
            drafter.candidate_selector.predecessor_codebook.normal_(std=3.0)
    embed = random_embed(vocab=cfg.vocab_size, hidden=cfg.hidden_size)
    torch.manual_seed(4)
    head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    head.requires_grad_(False)
    return drafter, cfg, embed, head


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_proposals_equal_the_cached_drafters(name, temperature):
    drafter, cfg, embed, head = _drafter(name)
    ref, st = DrafterProposer(drafter, embed, head), StaticProposer(drafter, embed, head, max_len=64)
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(40, cfg.num_captured * cfg.hidden_size, generator=g)
    tokens = torch.randint(0, 200, (41,), generator=g).tolist()
    for prop in (ref, st):
        prop.reset()
    n = 0
    for run in (20, 3, 1, BS, 2, 4):  # the prompt's features, then accepted runs of 1 .. BS
        ctx = tokens[: n + run + 1]
        ga, gb = torch.Generator().manual_seed(n), torch.Generator().manual_seed(n)
        a = ref.propose(ctx, feats[n : n + run], temperature, ga)
        b = st.propose(ctx, feats[n : n + run], temperature, gb)
        assert a.tokens.tolist() == b.tokens.tolist()
        if temperature > 0:
            torch.testing.assert_close(b.probs, a.probs, rtol=1e-4, atol=1e-5)
        n += run
    assert st.len == ref.cache.len == n


def test_the_context_matters_and_bad_lengths_are_refused():
    drafter, cfg, embed, head = _drafter("dflash")
    st = StaticProposer(drafter, embed, head, max_len=30)
    feats = torch.randn(20, cfg.num_captured * cfg.hidden_size)
    st.propose(list(range(21)), feats, 0.0, None)
    h1 = st._run(*st.inputs, True)[0].clone()
    st.reset()
    feats2 = feats.clone()
    feats2[3] += 1.0
    st.propose(list(range(21)), feats2, 0.0, None)
    assert not torch.allclose(st._run(*st.inputs, True)[0], h1)
    with pytest.raises(RuntimeError, match="expected 21"):
        st.propose(list(range(22)), feats[:2], 0.0, None)
    with pytest.raises(ValueError, match="more than max_len 30"):
        st.propose(list(range(27)), feats[:6], 0.0, None)

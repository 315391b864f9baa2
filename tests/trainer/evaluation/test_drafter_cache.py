"""The drafter at inference (context K/V cache, one block a call) computes what training's forward computes."""

from __future__ import annotations

import pytest
import torch

from tests.support.model_util import random_embed, tiny_drafter
from trainer.evaluation.drafter_cache import DraftContextCache


@pytest.mark.parametrize(
    "extra",
    [{}, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 5}],
    ids=["full", "sliding"],
)
def test_block_equals_the_training_forward_at_the_same_anchor(extra):
    over = {"block_size": 6, **extra}
    drafter, cfg = tiny_drafter(**over)
    embed = random_embed()
    torch.manual_seed(3)
    T = 20
    feats = torch.randn(1, T, cfg.num_captured * cfg.hidden_size)
    ids = torch.randint(0, 200, (1, T))
    for a in (0, 1, 7, 13):
        ref = drafter(feats, ids, torch.zeros(1, T, dtype=torch.long), torch.tensor([[a]]), embed)[0, 0]
        cache = DraftContextCache(drafter)
        # grown in uneven pieces, as accepted runs arrive
        cuts = [0, *sorted({min(a, c) for c in (3, 4, 9)}), a]
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            cache.extend(feats[0, lo:hi])
        assert cache.len == a
        got = cache.block(int(ids[0, a]), embed)
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
    # and the features matter: a different context position moves the block
    cache2 = DraftContextCache(drafter)
    f2 = feats.clone()
    f2[0, 5] += 1.0
    cache2.extend(f2[0, :13])
    assert not torch.allclose(cache2.block(int(ids[0, 13]), embed), ref)

"""The context-back drafter (``lab.context_back.drafter``): fc reads each context position beside the positions
before it in its document, never across a packed row's documents; with those positions' weights at zero it is
the product's drafter."""

from __future__ import annotations

import pytest
import torch

from lab.context_back.drafter import ContextBackDrafter, expand
from tests.support.model_util import random_embed, tiny_drafter


def _drafter(back: int, **over):
    plain, cfg = tiny_drafter(**over)
    torch.manual_seed(1)
    return ContextBackDrafter(cfg, back).eval(), plain, cfg


def test_expand_lays_the_positions_before_beside_each_within_its_document():
    h = torch.arange(1, 8, dtype=torch.float32).view(1, 7, 1).repeat(1, 1, 2)  # position t's features: t + 1
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    e = expand(h, doc, 2)
    assert e.shape == (1, 7, 6)
    own, back1, back2 = e[0, :, 0], e[0, :, 2], e[0, :, 4]
    assert own.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert back1.tolist() == [0, 1, 2, 0, 4, 5, 6]  # the second document starts at position 3: nothing before
    assert back2.tolist() == [0, 0, 1, 0, 0, 4, 5]
    assert expand(h, doc, 0) is h


def test_a_packed_document_sees_nothing_of_the_one_before():
    """The block anchored in the second document of a packed row equals the same block with that document
    alone: no feature of the first leaks in through the positions before."""
    drafter, _, cfg = _drafter(2, block_size=4)
    embed = random_embed()
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 12, cfg.num_captured * cfg.hidden_size, generator=g)
    ids = torch.randint(0, 200, (1, 12), generator=g)
    doc = torch.tensor([[0] * 5 + [1] * 7])
    with torch.no_grad():
        packed = drafter(feats, ids, doc, torch.tensor([[9]]), embed)[0, 0]
        alone = drafter(
            feats[:, 5:], ids[:, 5:], torch.zeros(1, 7, dtype=torch.long), torch.tensor([[4]]), embed
        )
    torch.testing.assert_close(packed, alone[0, 0], atol=2e-5, rtol=1e-4)
    with torch.no_grad():  # and the positions before do reach the block: change one, the block moves
        feats[0, 7] += 3.0
        assert not torch.allclose(drafter(feats, ids, doc, torch.tensor([[9]]), embed)[0, 0], packed)


def test_fc_widens_and_with_the_positions_before_at_zero_it_is_the_products_drafter():
    drafter, plain, cfg = _drafter(2)
    n = cfg.num_captured * cfg.hidden_size
    assert drafter.fc.in_features == 3 * n and plain.fc.in_features == n
    assert set(drafter.state_dict()) == set(plain.state_dict())  # the product's names, fc.weight wider
    drafter.load_state_dict({k: v for k, v in plain.state_dict().items() if k != "fc.weight"}, strict=False)
    with torch.no_grad():
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, :n].copy_(plain.fc.weight)
    embed = random_embed()
    g = torch.Generator().manual_seed(2)
    args = (torch.randn(1, 16, n, generator=g), torch.randint(0, 200, (1, 16), generator=g),
            torch.tensor([[0] * 6 + [1] * 10]), torch.tensor([[2, 8, 12]]), embed)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(drafter(*args), plain(*args), rtol=1e-5, atol=1e-6)
    assert drafter.fc.doc_ids is None  # only set for the call
    with pytest.raises(RuntimeError, match="doc_ids"):
        drafter.fc(args[0])
    for bad in (0, 9, True):
        with pytest.raises(ValueError, match="back"):
            ContextBackDrafter(cfg, bad)

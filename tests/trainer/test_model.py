"""Behavioural tests of the drafter's attention: what a block may and may not see (trainer/model.py).

Each test perturbs one input and checks which block outputs move, through both attention paths
(dense-mask SDPA and FlexAttention; the latter forward-only on CPU).
"""

import pytest
import torch

from tests.support.model_util import VOCAB, random_embed, tiny_drafter

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

IMPLS = ["sdpa", "flex"]
H = 64


def _inputs(T=24, B=1, n_captured=2, seed=5):
    g = torch.Generator().manual_seed(seed)
    th = torch.randn(B, T, n_captured * H, generator=g)
    ids = torch.randint(0, VOCAB - 1, (B, T), generator=g)
    return th, ids


def _run(drafter, th, ids, doc, anchors, impl, embed):
    with torch.no_grad():
        return drafter(th, ids, doc, anchors, embed, attn_impl=impl)


def _moved(a, b, atol=1e-6):
    """Per (block, slot): did the output change?"""
    return ((a - b).abs().amax(-1) > atol)[0]


@pytest.fixture(scope="module")
def setup():
    drafter, cfg = tiny_drafter()
    return drafter, cfg, random_embed()


@pytest.mark.parametrize("impl", IMPLS)
def test_block_never_sees_its_anchor_or_later_context(setup, impl):
    drafter, cfg, embed = setup
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    anchors = torch.tensor([[5, 12, 13]])  # overlapping blocks: 13 lies inside block 12's span
    base = _run(drafter, th, ids, doc, anchors, impl, embed)

    for p in (12, 13, 15, 23):  # the anchor's own position and later ones
        th2 = th.clone()
        th2[:, p] += 3.0
        moved = _moved(base, _run(drafter, th2, ids, doc, anchors, impl, embed))
        assert not moved[1].any(), f"block at anchor 12 saw context position {p}"
        assert not moved[0].any()
    th2 = th.clone()
    th2[:, 12] += 3.0
    assert _moved(base, _run(drafter, th2, ids, doc, anchors, impl, embed))[2].all()  # anchor 13 sees 12

    th2 = th.clone()
    th2[:, 11] += 3.0  # just before the anchor: visible
    assert _moved(base, _run(drafter, th2, ids, doc, anchors, impl, embed))[1].all()


@pytest.mark.parametrize("impl", IMPLS)
def test_block_never_sees_another_block(setup, impl):
    drafter, cfg, embed = setup
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    anchors = torch.tensor([[4, 10, 16]])
    base = _run(drafter, th, ids, doc, anchors, impl, embed)
    ids2 = ids.clone()
    ids2[0, 16] = (ids[0, 16] + 1) % (VOCAB - 1)  # block 2's anchor token
    moved = _moved(base, _run(drafter, th, ids2, doc, anchors, impl, embed))
    assert moved[2].all() and not moved[0].any() and not moved[1].any()
    # tokens that are no anchor are not inputs at all (the context is the target's hidden states)
    ids3 = ids.clone()
    ids3[0, [5, 11, 17, 20]] = (ids[0, [5, 11, 17, 20]] + 1) % (VOCAB - 1)
    assert not _moved(base, _run(drafter, th, ids3, doc, anchors, impl, embed)).any()


@pytest.mark.parametrize("impl", IMPLS)
def test_no_attention_across_documents_and_positions_restart(setup, impl):
    drafter, cfg, embed = setup
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    doc[:, 10:] = 1
    anchors = torch.tensor([[3, 15]])
    base = _run(drafter, th, ids, doc, anchors, impl, embed)
    th2 = th.clone()
    th2[:, :10] += 3.0  # all of document 0
    moved = _moved(base, _run(drafter, th2, ids, doc, anchors, impl, embed))
    assert moved[0].all() and not moved[1].any()
    th3 = th.clone()
    th3[:, 10] += 3.0  # document 1's first token, before anchor 15
    assert _moved(base, _run(drafter, th3, ids, doc, anchors, impl, embed))[1].all()
    # document 1 alone in its own row gives the same block output (positions restart per document)
    alone = _run(
        drafter, th[:, 10:], ids[:, 10:], torch.zeros_like(ids[:, 10:]), torch.tensor([[5]]), impl, embed
    )
    torch.testing.assert_close(alone[0, 0], base[0, 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_sliding_layer_sees_only_its_window(impl):
    embed = random_embed()
    W, a = 4, 10
    sliding, _ = tiny_drafter(num_draft_layers=1, layer_types=["sliding_attention"], sliding_window=W)
    full, _ = tiny_drafter(num_draft_layers=1)
    th, ids = _inputs(n_captured=1)
    doc = torch.zeros_like(ids)
    anchors = torch.tensor([[a]])
    base_s = _run(sliding, th, ids, doc, anchors, impl, embed)
    base_f = _run(full, th, ids, doc, anchors, impl, embed)

    def moved_slots(model, base, p):
        th2 = th.clone()
        th2[:, p] += 3.0
        return _moved(base, _run(model, th2, ids, doc, anchors, impl, embed))[0].nonzero().flatten().tolist()

    # slot k sits at position a + k and sees context p with (a + k) - p < W (and p < a)
    assert moved_slots(sliding, base_s, a - W) == []  # p = 6: outside every slot's window
    assert moved_slots(sliding, base_s, a - W + 1) == [0]  # p = 7: only slot 0 (position 10)
    assert moved_slots(sliding, base_s, a - 1) == [0, 1, 2]  # p = 9: slots 0..2, slot 3 (13 - 9 = 4) not
    assert moved_slots(full, base_f, a - W) == [0, 1, 2, 3]  # a full layer sees it


@pytest.mark.parametrize("impl", IMPLS)
def test_two_sliding_layers_never_reach_past_the_window(impl):
    embed = random_embed()
    W, a = 4, 12
    drafter, _ = tiny_drafter(layer_types=["sliding_attention"] * 2, sliding_window=W)
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    anchors = torch.tensor([[a]])
    base = _run(drafter, th, ids, doc, anchors, impl, embed)
    for p, should_move in ((a - W, False), (a - W - 3, False), (a - W + 1, True)):
        th2 = th.clone()
        th2[:, p] += 3.0
        assert bool(_moved(base, _run(drafter, th2, ids, doc, anchors, impl, embed)).any()) == should_move, p


def test_sdpa_and_flex_paths_agree():
    embed = random_embed()
    drafter, cfg = tiny_drafter(
        num_draft_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=5,
    )
    th, ids = _inputs(T=40, B=2, n_captured=cfg.num_captured)
    doc = torch.zeros_like(ids)
    doc[0, 17:] = 1
    doc[1, 9:] = 1
    doc[1, 30:] = 2
    anchors = torch.tensor([[2, 8, 20, 31, -1], [0, 12, 13, 31, 35]])
    a = _run(drafter, th, ids, doc, anchors, "sdpa", embed)
    b = _run(drafter, th, ids, doc, anchors, "flex", embed)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_padding_blocks_are_finite_and_train_finite():
    embed = random_embed()
    drafter, cfg = tiny_drafter()
    drafter.train()
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    for anchors in (torch.tensor([[3, -1, -1]]), torch.tensor([[-1]])):
        out = drafter(th, ids, doc, anchors, embed)
        assert torch.isfinite(out).all()
        out.square().mean().backward()
        assert all(torch.isfinite(p.grad).all() for p in drafter.parameters() if p.grad is not None)
        drafter.zero_grad()
    # a real block's output does not depend on padding blocks next to it
    with torch.no_grad():
        one = drafter(th, ids, doc, torch.tensor([[7]]), embed)
        padded = drafter(th, ids, doc, torch.tensor([[7, -1, -1]]), embed)
    torch.testing.assert_close(one[0, 0], padded[0, 0], atol=1e-6, rtol=1e-6)


def test_gradient_checkpointing_gives_same_gradients():
    embed = random_embed()
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    anchors = torch.tensor([[4, 11, 17]])
    grads = []
    for ckpt in (False, True):
        drafter, _ = tiny_drafter()
        drafter.train()
        drafter.gradient_checkpointing = ckpt
        drafter(th, ids, doc, anchors, embed).square().mean().backward()
        grads.append([p.grad.clone() for p in drafter.parameters()])
    for g0, g1 in zip(*grads, strict=True):
        torch.testing.assert_close(g0, g1)


def test_state_dict_has_reference_names_and_no_embedding_or_head():
    drafter, cfg = tiny_drafter()
    keys = set(drafter.state_dict())
    assert not any("embed" in k or "lm_head" in k or "inv_freq" in k for k in keys)
    for k in (
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "layers.0.self_attn.q_proj.weight",
        "layers.0.self_attn.k_proj.weight",
        "layers.0.self_attn.v_proj.weight",
        "layers.0.self_attn.o_proj.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
        "layers.1.mlp.gate_proj.weight",
        "layers.1.mlp.up_proj.weight",
        "layers.1.mlp.down_proj.weight",
        "layers.1.input_layernorm.weight",
        "layers.1.post_attention_layernorm.weight",
    ):
        assert k in keys
    assert drafter.fc.weight.shape == (64, cfg.num_captured * 64)


def test_bad_inputs_name_the_setting():
    embed = random_embed()
    drafter, cfg = tiny_drafter()
    th, ids = _inputs()
    doc = torch.zeros_like(ids)
    with pytest.raises(ValueError, match="target_hidden"):
        drafter(th[..., :64], ids, doc, torch.tensor([[3]]), embed)
    with pytest.raises(ValueError, match="attn_impl"):
        drafter(th, ids, doc, torch.tensor([[3]]), embed, attn_impl="eager")

"""The drafter on CUDA through FlexAttention (compiled): mask behaviour, SDPA equivalence, training steps.

Run on a GPU machine: ``PYTHONPATH=. python -m pytest tests/trainer/test_gpu_model.py -q``. Skipped without CUDA.
"""

import pytest
import torch

from tests.support.model_util import VOCAB, tiny_drafter, tiny_target, tiny_target_config
from trainer.drafting.head import FrozenHead
from trainer.drafting.loss import dflash_loss, metrics_to_floats
from trainer.drafting.masks import sample_anchors
from trainer.target.base import attach
from trainer.target.capture import capture, capture_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEV = "cuda"
# head_dim 32 keeps the Triton flex kernels on their common path
TC = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def _drafter(**over):
    drafter, cfg = tiny_drafter(target_config=tiny_target_config(**TC), **over)
    return drafter.to(DEV), cfg


def _embed():
    torch.manual_seed(2)
    return torch.nn.Embedding(VOCAB, TC["hidden_size"]).to(DEV).requires_grad_(False)


def _inputs(cfg, T=160, B=2, seed=5):
    g = torch.Generator().manual_seed(seed)
    th = torch.randn(B, T, cfg.num_captured * cfg.hidden_size, generator=g).to(DEV)
    ids = torch.randint(0, VOCAB - 1, (B, T), generator=g).to(DEV)
    return th, ids


@torch.no_grad()
def _run(drafter, th, ids, doc, anchors, impl, embed):
    return drafter(th, ids, doc, anchors, embed, attn_impl=impl)


def test_flex_matches_sdpa_on_cuda():
    drafter, cfg = _drafter(
        num_draft_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=24,
    )
    embed = _embed()
    th, ids = _inputs(cfg)
    doc = torch.zeros_like(ids)
    doc[0, 70:] = 1
    doc[1, 40:] = 1
    doc[1, 120:] = 2
    anchors = torch.tensor([[3, 30, 69, 71, 100, 140, -1], [0, 20, 41, 60, 121, 130, 150]], device=DEV)
    a = _run(drafter, th, ids, doc, anchors, "sdpa", embed)
    b = _run(drafter, th, ids, doc, anchors, "flex", embed)
    torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


def test_flex_block_sees_nothing_at_or_after_its_anchor_nor_other_documents():
    drafter, cfg = _drafter()
    embed = _embed()
    th, ids = _inputs(cfg, B=1)
    doc = torch.zeros_like(ids)
    doc[:, 80:] = 1
    anchors = torch.tensor([[50, 51, 100]], device=DEV)
    base = _run(drafter, th, ids, doc, anchors, "flex", embed)

    def moved(p):
        th2 = th.clone()
        th2[:, p] += 3.0
        out = _run(drafter, th2, ids, doc, anchors, "flex", embed)
        return ((out - base).abs().amax(-1) > 1e-5)[0].any(-1).tolist()

    assert moved(50) == [False, True, False]  # anchor 50's own position: only the block at 51 sees it
    assert moved(49) == [True, True, False]
    assert moved(20) == [True, True, False]  # doc 0 is invisible to the block in doc 1
    assert moved(79) == [False, False, False]
    assert moved(85) == [False, False, True]
    assert moved(100) == [False, False, False]


def test_padding_block_is_finite_on_cuda():
    drafter, cfg = _drafter()
    embed = _embed()
    th, ids = _inputs(cfg, B=1)
    out = _run(drafter, th, ids, torch.zeros_like(ids), torch.tensor([[-1, -1]], device=DEV), "flex", embed)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("mode", ["fp32", "bf16", "autocast"])
def test_training_steps_through_flex(mode):
    """fp32 / bf16 weights, and the pipeline's way: fp32 drafter, bf16 target and head, bf16 autocast."""
    import contextlib

    tdtype = torch.float32 if mode == "fp32" else torch.bfloat16
    ddtype = torch.bfloat16 if mode == "bf16" else torch.float32
    target = tiny_target(initializer_range=0.2, **TC).to(DEV, tdtype)
    head = FrozenHead.from_model(target)
    drafter, cfg = tiny_drafter(target_config=target.config, num_draft_layers=2, block_size=8)
    drafter = drafter.to(DEV, ddtype).train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB - 1, (2, 256), generator=g).to(DEV)
    doc = torch.zeros_like(ids)
    doc[:, 128:] = 1
    losses = []
    for _ in range(8):
        hidden, final = capture(target, ids, doc, cfg.target_layer_ids, need_final_hidden=True)
        anchors = sample_anchors(doc, torch.ones_like(ids, dtype=torch.bool), cfg.block_size, 32, g)
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext()
        with ctx:
            out = drafter(hidden, ids, doc, anchors, head.embed_tokens, attn_impl="flex")
            loss, metrics = dflash_loss(
                out, head, ids, anchors, gamma=7.0, target_final_hidden=final, chunk_tokens=128
            )
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in drafter.parameters())
        opt.step()
        losses.append(loss.item())
        m = metrics_to_floats(metrics)
        assert len(m["acc"]) == cfg.block_size - 1 and m["n_blocks"] > 0
    assert losses[-1] < losses[0]  # memorising one fixed batch


@pytest.mark.parametrize("attn", ["varlen", "flex"])
def test_direct_capture_matches_transformers_on_cuda(attn):
    """The compiled direct capture path (per-document varlen / flex attention) == transformers' forward."""
    from trainer.target.attention import varlen_works
    from trainer.target.capture import prepare_capture

    if attn == "varlen" and not varlen_works(torch.device(DEV)):
        pytest.skip("this torch has no working varlen_attn")
    target = tiny_target(**TC).to(DEV, torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB - 1, (2, 200), generator=g).to(DEV)
    doc = torch.zeros_like(ids)
    doc[0, 70:] = 1
    doc[0, 150:] = 2
    doc[1, 180:] = -1
    ref, ref_final = capture(target, ids, doc, [0, 2], need_final_hidden=True)
    assert prepare_capture(target, attn=attn) == attn
    one = torch.zeros_like(doc)  # one document per row (the varlen mode takes SDPA's causal kernel then)
    saved = capture_of(target)
    attach(target, None)
    ref_one, _ = capture(target, ids, one, [0, 2])
    attach(target, saved)
    for d, r, rf in ((doc, ref, ref_final), (doc.cpu(), ref, ref_final), (one, ref_one, None)):
        out, final = capture(target, ids, d, [0, 2], need_final_hidden=rf is not None)
        for got, want in ((out, r), (final, rf)) if rf is not None else ((out, r),):
            assert ((got.float() - want.float()).norm() / want.float().norm()) < 2e-2

"""The loss's objectives (trainer/drafting/loss.py ``OBJECTIVES``): target-argmax labels and the divergences,
each against a plain autograd reference written as speculators 0.9.0 writes it (speculators/losses/eager.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.drafting.head import FrozenHead
from trainer.drafting.loss import DIVERGENCES, OBJECTIVES, dflash_loss, metrics_to_floats

V, H, BS, T = 13, 6, 4, 20


def _head(seed=0):
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.Embedding(V, H).double()
    lm = torch.nn.Linear(H, V, bias=False).double()
    with torch.no_grad():
        lm.weight.copy_(torch.randn(V, H, generator=g, dtype=torch.float64) * 2)
    return FrozenHead(emb, torch.nn.Identity(), lm)


def _reference(objective, logits, target_logits, data_label):
    """One slot's loss as speculators computes it (its eager losses), in fp64."""
    logq = F.log_softmax(logits, -1)
    logp = F.log_softmax(target_logits, -1)
    if objective == "data":
        return F.cross_entropy(logits[None], data_label[None])
    if objective == "target-argmax":
        return F.cross_entropy(logits[None], target_logits.argmax()[None])
    if objective == "kl":
        return F.kl_div(logq, logp.exp(), reduction="none").sum()
    if objective == "reverse-kl":
        return F.kl_div(logp, logq, reduction="none", log_target=True).sum()
    if objective == "jsd":
        logm = torch.logaddexp(logq, logp) - math.log(2.0)
        kl_pm = F.kl_div(logm, logp, reduction="none", log_target=True).sum()
        kl_qm = F.kl_div(logm, logq, reduction="none", log_target=True).sum()
        return 0.5 * (kl_pm + kl_qm)
    assert objective == "tv"
    return 1.0 - torch.minimum(logq.exp(), logp.exp()).sum()


def _naive(objective, draft, head, ids, anchors, final, gamma):
    num, den = torch.zeros((), dtype=torch.float64), 0.0
    for j, a in enumerate(anchors[0].tolist()):
        for k in range(1, BS):
            w = float(
                torch.tensor(math.exp(-(k - 1) / gamma), dtype=torch.float32)
            )  # the loss's fp32 weights
            logits = head.lm_head(draft[0, j, k])
            target = head.lm_head(final[0, a + k - 1])
            num = num + w * _reference(objective, logits, target, ids[0, a + k])
            den += w
    return num / den


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (1, T), generator=g)
    anchors = torch.tensor([[1, 7, 12]])
    final = torch.randn(1, T, H, generator=g, dtype=torch.float64)
    draft = torch.randn(1, 3, BS, H, generator=g, dtype=torch.float64)
    return ids, anchors, final, draft


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_each_objective_matches_its_definition_in_value_and_gradient(objective):
    head = _head()
    ids, anchors, final, draft = _inputs()
    d1 = draft.clone().requires_grad_(True)
    loss, _ = dflash_loss(
        d1, head, ids, anchors, 3.0, target_final_hidden=final, chunk_tokens=4, objective=objective
    )
    (grad,) = torch.autograd.grad(loss, d1)
    d2 = draft.clone().requires_grad_(True)
    ref = _naive(objective, d2, head, ids, anchors, final, 3.0)
    (grad_ref,) = torch.autograd.grad(ref, d2)
    assert loss.dtype == torch.float64
    # the position weights and their sum are fp32 (as in training): agreement to fp32's rounding of them
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-6, atol=1e-12)
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_chunking_changes_nothing(objective):
    head = _head(2)
    ids, anchors, final, draft = _inputs(3)
    out = []
    for chunk in (1, 5, 4096):
        d = draft.clone().requires_grad_(True)
        loss, m = dflash_loss(
            d, head, ids, anchors, 7.0, target_final_hidden=final, chunk_tokens=chunk, objective=objective
        )
        (grad,) = torch.autograd.grad(loss, d)
        out.append((loss, grad, metrics_to_floats(m)))
    for loss, grad, floats in out[1:]:
        torch.testing.assert_close(loss, out[0][0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grad, out[0][1], rtol=1e-10, atol=1e-13)
        assert floats == out[0][2]


def test_divergences_vanish_where_the_drafter_is_the_target():
    """Each divergence is 0 (and flat) where q = p: the drafter's hidden state is the target's own."""
    head = _head(4)
    ids, anchors, final, _ = _inputs(5)
    src = (anchors.unsqueeze(-1) + torch.arange(BS) - 1).clamp(
        min=0
    )  # slot k: the target's position a + k - 1
    draft = final[0, src[0]].unsqueeze(0).clone().requires_grad_(True)
    for objective in DIVERGENCES:
        loss, _ = dflash_loss(draft, head, ids, anchors, 7.0, target_final_hidden=final, objective=objective)
        (grad,) = torch.autograd.grad(loss, draft)
        assert abs(loss.item()) < 1e-12, objective
        if objective != "tv":  # tv's subgradient at q = p is not 0 (torch.minimum splits ties), its value is
            assert grad.abs().max().item() < 1e-12, objective


def test_target_argmax_labels_are_the_data_labels_on_the_targets_own_greedy_text():
    """Text the target wrote greedily: its argmax at position t is the token at t + 1, so training on its
    argmax is training on the data (the same loss, gradient and metrics)."""
    head = _head(6)
    g = torch.Generator().manual_seed(7)
    final = torch.randn(1, T, H, generator=g, dtype=torch.float64)
    greedy = head.lm_head(final).argmax(-1)  # the target's choice after each position
    ids = torch.cat([torch.tensor([[3]]), greedy[:, :-1]], dim=1)  # token t + 1 is its choice at t
    anchors = torch.tensor([[0, 6, 11]])
    draft = torch.randn(1, 3, BS, H, generator=g, dtype=torch.float64)
    out = {}
    for objective in ("data", "target-argmax"):
        d = draft.clone().requires_grad_(True)
        fin = final if objective != "data" else None
        loss, m = dflash_loss(d, head, ids, anchors, 7.0, target_final_hidden=fin, objective=objective)
        out[objective] = (loss, torch.autograd.grad(loss, d)[0], metrics_to_floats(m))
    assert out["data"][0].item() == out["target-argmax"][0].item()
    assert torch.equal(out["data"][1], out["target-argmax"][1])
    assert out["data"][2] == out["target-argmax"][2]
    # on other text they differ: the labels are the target's, not the data's
    ids2 = torch.randint(0, V, (1, T), generator=g)
    a, _ = dflash_loss(draft, head, ids2, anchors, 7.0, target_final_hidden=final, objective="target-argmax")
    b, _ = dflash_loss(draft, head, ids2, anchors, 7.0, objective="data")
    assert a.item() != b.item()


def test_an_objective_without_the_targets_logits_or_unknown_is_refused():
    head = _head()
    ids, anchors, final, draft = _inputs()
    with pytest.raises(ValueError, match="needs target_final_hidden"):
        dflash_loss(draft, head, ids, anchors, 7.0, objective="jsd")
    with pytest.raises(ValueError, match="objective must be one of"):
        dflash_loss(draft, head, ids, anchors, 7.0, target_final_hidden=final, objective="nla")

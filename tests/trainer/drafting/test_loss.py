"""The DFlash loss (trainer/drafting/loss.py): labels, position weights, chunking, soft labels, metrics."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainer.drafting.head import FrozenHead
from trainer.drafting.loss import dflash_loss, metrics_to_floats, position_weights

V, H, BS = 11, 8, 4


def _head(seed=0, vocab=V, hidden=H):
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(vocab, hidden)
    lm = torch.nn.Linear(hidden, vocab, bias=False)
    return FrozenHead(emb, torch.nn.Identity(), lm)


def _naive(draft, head, ids, anchors, gamma, soft_hidden=None):
    """Loop form of the definition: slot k of block j predicts ids[a_j + k], weight exp(-(k-1)/gamma)."""
    num = torch.zeros(())
    den = 0.0
    for b in range(anchors.shape[0]):
        for j, a in enumerate(anchors[b].tolist()):
            if a < 0:
                continue
            for k in range(1, draft.shape[2]):
                w = math.exp(-(k - 1) / gamma)
                logits = head.lm_head(draft[b, j, k])
                if soft_hidden is None:
                    ce = F.cross_entropy(logits[None], ids[b, a + k][None])
                else:
                    logp = torch.log_softmax(head.lm_head(soft_hidden[b, a + k - 1]), -1)
                    ce = (logp.exp() * (logp - torch.log_softmax(logits, -1))).sum()  # KL(p || q)
                num = num + w * ce
                den += w
    return num / den


def test_position_weights_start_at_one_for_slot_one():
    w = position_weights(5, 2.0)
    assert w[0] == 0.0
    torch.testing.assert_close(w[1:], torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5)]))
    assert torch.equal(position_weights(3, float("inf")), torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="gamma"):
        position_weights(4, 0.0)


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_loss_and_grad_match_the_definition(chunk):
    head = _head()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (2, 20), generator=g)
    anchors = torch.tensor([[0, 7, 16], [3, -1, -1]])
    draft = torch.randn(2, 3, BS, H, generator=g, requires_grad=True)
    loss, _ = dflash_loss(draft, head, ids, anchors, gamma=1.5, chunk_tokens=chunk)
    (grad,) = torch.autograd.grad(loss, draft)
    d2 = draft.detach().clone().requires_grad_(True)
    ref = _naive(d2, head, ids, anchors, 1.5)
    (grad_ref,) = torch.autograd.grad(ref, d2)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, grad_ref)
    assert grad[:, :, 0].abs().max() == 0  # slot 0 (the given anchor token) is not scored
    assert grad[1, 1:].abs().max() == 0  # padding blocks get nothing


def test_labels_are_the_tokens_after_the_anchor():
    # one-hot draft states with a big lm_head: predictions are exactly the tokens we plant
    head = FrozenHead(torch.nn.Embedding(V, V), torch.nn.Identity(), torch.nn.Linear(V, V, bias=False))
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.eye(V) * 20)
    ids = torch.arange(20).remainder(V).unsqueeze(0)  # distinct neighbours
    anchors = torch.tensor([[2, 9]])

    def planted(shift):
        d = torch.zeros(1, 2, BS, V)
        for j, a in enumerate(anchors[0].tolist()):
            for k in range(BS):
                d[0, j, k, ids[0, a + k + shift]] = 1.0
        return d

    loss, m = dflash_loss(planted(0), head, ids, anchors, gamma=7.0)
    f = metrics_to_floats(m)
    assert f["acc"] == [1.0, 1.0, 1.0] and f["accept_len"] == pytest.approx(3.0) and f["n_blocks"] == 2
    assert loss.item() < 1e-6
    for shift in (-1, 1):  # off by one either way: nothing right
        loss_s, m_s = dflash_loss(planted(shift), head, ids, anchors, gamma=7.0)
        assert metrics_to_floats(m_s)["acc"] == [0.0, 0.0, 0.0]
        assert loss_s.item() > 10


def test_accept_len_is_sum_of_cumulative_products():
    head = FrozenHead(torch.nn.Embedding(V, V), torch.nn.Identity(), torch.nn.Linear(V, V, bias=False))
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.eye(V) * 20)
    ids = torch.arange(30).remainder(V).unsqueeze(0)
    anchors = torch.tensor([[0, 10]])
    d = torch.zeros(1, 2, BS, V)
    # block 0: slots 1, 2 right, 3 wrong; block 1: slot 1 right, 2, 3 wrong
    right = {(0, 1), (0, 2), (1, 1)}
    for j, a in enumerate(anchors[0].tolist()):
        for k in range(1, BS):
            tok = ids[0, a + k] if (j, k) in right else (ids[0, a + k] + 5) % V
            d[0, j, k, tok] = 1.0
    _, m = dflash_loss(d, head, ids, anchors, gamma=7.0)
    f = metrics_to_floats(m)
    assert f["acc"] == [1.0, 0.5, 0.0]
    assert f["accept_len"] == pytest.approx(1.0 + 0.5 + 0.0)
    assert f["accept_len_est"] == pytest.approx(1.0 + (2 + 1) / 2)  # chains 2 and 1, plus the bonus token


def test_accept_len_est_counts_chains_per_block_where_errors_correlate():
    """One block all right, one all wrong: per-position accuracy is 0.5 everywhere, so the product formula
    says 0.875; a server would accept 3 + 1 and 0 + 1 tokens: 2.5 on average."""
    head = FrozenHead(torch.nn.Embedding(V, V), torch.nn.Identity(), torch.nn.Linear(V, V, bias=False))
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.eye(V) * 20)
    ids = torch.arange(30).remainder(V).unsqueeze(0)
    anchors = torch.tensor([[0, 10]])
    d = torch.zeros(1, 2, BS, V)
    for k in range(1, BS):
        d[0, 0, k, ids[0, k]] = 1.0
        d[0, 1, k, (ids[0, 10 + k] + 5) % V] = 1.0
    _, m = dflash_loss(d, head, ids, anchors, gamma=7.0)
    f = metrics_to_floats(m)
    assert f["acc"] == [0.5, 0.5, 0.5] and f["accept_len"] == pytest.approx(0.875)
    assert f["accept_len_est"] == pytest.approx(2.5)


def test_accept_len_est_is_judged_by_the_targets_argmax_when_soft_labels_give_it():
    """A greedy verifier accepts a slot when the drafter's argmax is the target's argmax there, whatever the
    data token: with soft labels the chain counts against the target (slot k: its logits at a + k - 1);
    without them, against the data."""
    head = FrozenHead(torch.nn.Embedding(V, V), torch.nn.Identity(), torch.nn.Linear(V, V, bias=False))
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.eye(V) * 20)
    ids = torch.arange(30).remainder(V).unsqueeze(0)
    anchors = torch.tensor([[0, 10]])
    target = torch.zeros(1, 30, V)  # the target's mode at position t (predicting t + 1): data token + 3
    for t in range(29):
        target[0, t, (ids[0, t + 1] + 3) % V] = 1.0
    d = torch.zeros(1, 2, BS, V)
    for k in range(1, BS):
        d[0, 0, k, (ids[0, k] + 3) % V] = 1.0  # block 0: the target's choice everywhere
        d[0, 1, k, ids[0, 10 + k]] = 1.0  # block 1: the data everywhere
    d[0, 0, 3, 0] = 5.0  # block 0's last slot: neither
    _, m = dflash_loss(d, head, ids, anchors, gamma=7.0, target_final_hidden=target)
    f = metrics_to_floats(m)
    assert f["accept_len_est"] == pytest.approx(1.0 + (2 + 0) / 2)  # chains 2 and 0 against the target
    _, m = dflash_loss(d, head, ids, anchors, gamma=7.0)  # no target logits: judged by the data
    f = metrics_to_floats(m)
    assert f["accept_len_est"] == pytest.approx(1.0 + (0 + 3) / 2)  # chains 0 and 3 against the data


def test_soft_labels_match_the_definition_and_use_the_previous_position():
    head = _head(3)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, V, (1, 16), generator=g)
    anchors = torch.tensor([[1, 8]])
    final = torch.randn(1, 16, H, generator=g)
    draft = torch.randn(1, 2, BS, H, generator=g, requires_grad=True)
    loss, _ = dflash_loss(draft, head, ids, anchors, gamma=2.0, target_final_hidden=final, chunk_tokens=2)
    (grad,) = torch.autograd.grad(loss, draft)
    d2 = draft.detach().clone().requires_grad_(True)
    ref = _naive(d2, head, ids, anchors, 2.0, soft_hidden=final)
    (grad_ref,) = torch.autograd.grad(ref, d2)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, grad_ref)
    # the label distribution for slot k comes from position a + k - 1: moving position a + BS - 1 (last
    # slot's own position) changes nothing
    final2 = final.clone()
    final2[0, 8 + BS - 1] += 5
    loss2, _ = dflash_loss(draft, head, ids, anchors, gamma=2.0, target_final_hidden=final2)
    torch.testing.assert_close(loss2, loss)


def test_no_real_block_gives_zero_loss_not_nan():
    head = _head()
    ids = torch.randint(0, V, (1, 10))
    draft = torch.randn(1, 2, BS, H, requires_grad=True)
    loss, m = dflash_loss(draft, head, ids, torch.tensor([[-1, -1]]), gamma=7.0)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(draft.grad).all()
    assert metrics_to_floats(m)["n_blocks"] == 0

"""``--est-anchors``: measuring blocks beside the training blocks in the drafter's micro-step
(``DrafterRole``, ``dflash_loss(n_train=)``, ``selector_loss(n_train=)``): training is unchanged by them, and the
acceptance walk reads only them."""

import pytest
import torch

import trainer.runtime.roles as roles_mod
from tests.support.model_util import cpu_drafter_role, tiny_drafter, tiny_target
from tests.support.walk import decode_steps
from trainer.drafting.head import FrozenHead
from trainer.drafting.loss import dflash_loss, metrics_to_floats
from trainer.runtime.hidden_queue import HiddenBatch
from trainer.target.capture import capture

T, MAX_ANCHORS, GAMMA, SEED = 96, 6, 7.0, 11


def _batch(target, layer_ids):
    ids = torch.randint(0, 290, (1, T), generator=torch.Generator().manual_seed(3))
    docs = torch.zeros_like(ids)
    docs[:, 60:] = 1  # two documents: runs and anchors never cross a boundary inside a block
    lm = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        hidden, final = capture(target, ids, docs, layer_ids, need_final_hidden=True)
    return HiddenBatch(0, 0, T, hidden, final, ids, lm, docs)


def _step(arch, est_anchors, monkeypatch, before=(), seed=SEED, est_holdout=False):
    """One micro-step (noise on, soft labels) of a fresh tiny drafter: (metrics, grads, the anchors and n_train
    the loss was given)."""
    target = tiny_target()
    head = FrozenHead.from_model(target)
    over = {"dflash2": {"selector_rank": 8, "selector_top_k": 4}} if arch == "dflash2" else {}
    drafter, cfg = tiny_drafter(arch=arch, block_size=4, **over)
    seen = {}

    def spy(out, head, ids, anchors, gamma, **kw):
        seen.update(anchors=anchors.clone(), n_train=kw["n_train"])
        return dflash_loss(out, head, ids, anchors, gamma, **kw)

    monkeypatch.setattr(roles_mod, "dflash_loss", spy)
    role = cpu_drafter_role(
        drafter,
        head,
        block_size=cfg.block_size,
        max_anchors=MAX_ANCHORS,
        gamma=GAMMA,
        est_anchors=est_anchors,
        est_holdout=est_holdout,
    )
    hb = _batch(target, cfg.target_layer_ids)
    for s in before:  # earlier micro-batches of a run: a resumed run has not seen them
        role.micro_step(hb, 0.1, 1.0, seed=s)
    drafter.zero_grad(set_to_none=True)
    got = role.micro_step(hb, 0.1, 1.0, seed=seed)
    grads = {n: p.grad.clone() for n, p in drafter.named_parameters() if p.requires_grad}
    return got, grads, seen


@pytest.mark.parametrize("arch", ["dflash", "dflash2"])
def test_measuring_blocks_change_neither_the_loss_nor_any_gradient(arch, monkeypatch):
    off, g_off, s_off = _step(arch, 0, monkeypatch)
    on, g_on, s_on = _step(arch, 16, monkeypatch)
    n = s_off["anchors"].shape[1]
    # the same training anchors (same generator, same draws), then one run of 16 consecutive measuring ones
    assert s_off["n_train"] == n == MAX_ANCHORS and s_on["n_train"] == n
    assert torch.equal(s_on["anchors"][:, :n], s_off["anchors"])
    run = s_on["anchors"][0, n:]
    assert (
        len(run) == 16 and (run >= 0).all() and torch.equal(run, torch.arange(int(run[0]), int(run[0]) + 16))
    )
    # same loss, metrics and gradients (tight fp32 tolerance: one forward with more blocks sums differently)
    torch.testing.assert_close(on["loss"], off["loss"], rtol=1e-6, atol=1e-7)
    assert on["n_blocks"] == off["n_blocks"] == MAX_ANCHORS
    torch.testing.assert_close(on["acc"], off["acc"])
    torch.testing.assert_close(on["chain_sum"], off["chain_sum"])
    if arch == "dflash2":
        for k in ("selector_loss", "selector_recall", "selector_acc"):
            torch.testing.assert_close(on[k], off[k], rtol=1e-6, atol=1e-7)
        assert any("candidate_selector" in name for name in g_on)
    assert g_on.keys() == g_off.keys()
    for name, g in g_off.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(g_on[name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert on["walk_steps"] > 0 and off["walk_steps"] > 0


def test_measuring_anchors_depend_on_the_micro_batch_seed_alone(monkeypatch):
    """Exact resume: a micro-step's measuring run is a function of its seed, whatever the role drew before;
    another seed draws another run."""
    _, _, fresh = _step("dflash", 16, monkeypatch)
    _, _, later = _step("dflash", 16, monkeypatch, before=(5, 6))
    assert torch.equal(later["anchors"], fresh["anchors"])
    runs = set()
    for seed in range(4):
        _, _, other = _step("dflash", 16, monkeypatch, seed=seed)
        runs.add(tuple(other["anchors"][0, MAX_ANCHORS:].tolist()))
    assert len(runs) > 1


def test_with_a_held_out_last_document_it_is_only_measured_and_the_rest_only_trained(monkeypatch):
    """``--est-holdout``: the row's last document (positions 60..95 here) is a held-out sequence; the training
    anchors are drawn everywhere else (their blocks inside the first document) and the measuring run there."""
    got, _, seen = _step("dflash", 16, monkeypatch, est_holdout=True)
    n, anchors = seen["n_train"], seen["anchors"][0]
    train, run = anchors[:n][anchors[:n] >= 0], anchors[n:]
    assert len(train) == MAX_ANCHORS and (train + 3 < 60).all()  # block 4: the anchor and 3 predicted
    assert (
        len(run) == 16 and (run >= 60).all() and torch.equal(run, torch.arange(int(run[0]), int(run[0]) + 16))
    )
    assert got["walk_steps"] > 0
    _, _, plain = _step("dflash", 16, monkeypatch)  # the check can fail: without it both documents train
    assert (plain["anchors"][0, : plain["n_train"]] + 3 >= 60).any()
    with pytest.raises(ValueError, match="est_holdout needs est_anchors"):
        _step("dflash", 0, monkeypatch, est_holdout=True)


def test_the_measuring_blocks_would_move_the_loss_if_they_had_weight():
    """The check above can fail: scoring the measuring blocks as training ones changes the loss and its
    gradient well beyond its tolerance."""
    torch.manual_seed(0)
    head = FrozenHead(
        torch.nn.Embedding(11, 8), torch.nn.Identity(), torch.nn.Linear(8, 11, bias=False)
    ).requires_grad_(False)
    ids = torch.randint(0, 11, (1, 40))
    anchors = torch.tensor([[3, 17, 20, 21, 22, 23]])
    d = torch.randn(1, 6, 4, 8, requires_grad=True)
    ltrain, _ = dflash_loss(d, head, ids, anchors, GAMMA, n_train=2)
    (gtrain,) = torch.autograd.grad(ltrain, d)
    lall, _ = dflash_loss(d, head, ids, anchors, GAMMA)
    (gall,) = torch.autograd.grad(lall, d)
    assert abs(lall.item() - ltrain.item()) > 1e-3
    assert gtrain[:, 2:].abs().max() == 0 and gall[:, 2:].abs().max() > 1e-3
    lref, _ = dflash_loss(d[:, :2], head, ids, anchors[:, :2], GAMMA)
    assert ltrain.item() == pytest.approx(lref.item(), rel=1e-6)


def test_the_walk_reads_the_measuring_run_and_the_metrics_the_training_blocks():
    """Hand-made drafter outputs right on exactly the first ``chain`` slots of each block: the walk's tokens
    and steps are those of decoding over the measuring run (two rows, one shorter and padded); ``acc``,
    ``n_blocks``, ``accept_len`` and the uniform mean are the training blocks' alone."""
    V, BS = 11, 6
    head = FrozenHead(torch.nn.Embedding(V, V), torch.nn.Identity(), torch.nn.Linear(V, V, bias=False))
    with torch.no_grad():
        head.lm_head.weight.copy_(torch.eye(V) * 20)
    ids = torch.arange(80).remainder(V).view(2, 40)
    train = [[0, 30], [5, 33]]
    train_chains = [[5, 0], [2, 1]]
    runs = [list(range(8, 20)), list(range(10, 17)) + [-1] * 5]
    rng = torch.Generator().manual_seed(5)
    run_chains = [[int(c) for c in torch.randint(0, BS, (12,), generator=rng)] for _ in range(2)]
    anchors = torch.tensor([t + r for t, r in zip(train, runs, strict=True)])
    chains = [t + r for t, r in zip(train_chains, run_chains, strict=True)]
    d = torch.zeros(2, anchors.shape[1], BS, V)
    for b in range(2):
        for j, a in enumerate(anchors[b].tolist()):
            for k in range(1, BS):
                tok = ids[b, max(a, 0) + k] if k <= chains[b][j] else (ids[b, max(a, 0) + k] + 5) % V
                d[b, j, k, tok] = 1.0
    _, m = dflash_loss(d, head, ids, anchors, gamma=GAMMA, n_train=2)
    want = [
        decode_steps([a for a in r if a >= 0], c[: sum(a >= 0 for a in r)])
        for r, c in zip(runs, run_chains, strict=True)
    ]
    assert (int(m["walk_tokens"]), int(m["walk_steps"])) == (sum(t for t, _ in want), sum(s for _, s in want))
    f = metrics_to_floats(m)
    assert f["accept_len_est"] == sum(t for t, _ in want) / sum(s for _, s in want)
    assert f["n_blocks"] == 4
    assert f["accept_len_est_uniform"] == pytest.approx(1 + (5 + 0 + 2 + 1) / 4)
    _, ref = dflash_loss(d[:, :2], head, ids, anchors[:, :2], gamma=GAMMA)  # the training blocks alone
    r = metrics_to_floats(ref)
    assert (f["acc"], f["accept_len"]) == (r["acc"], r["accept_len"])
    # no measuring blocks (n_train = A): the walk runs over the training blocks, as before
    _, m0 = dflash_loss(d[:, :2], head, ids, anchors[:, :2], gamma=GAMMA, n_train=2)
    want0 = [decode_steps(t, c) for t, c in zip(train, train_chains, strict=True)]
    assert (int(m0["walk_tokens"]), int(m0["walk_steps"])) == (
        sum(t for t, _ in want0),
        sum(s for _, s in want0),
    )


def test_est_anchors_of_one_is_refused():
    with pytest.raises(ValueError, match="est_anchors"):
        cpu_drafter_role(
            None, None, block_size=4, max_anchors=4, gamma=1.0, noise_type="uniform", est_anchors=1
        )

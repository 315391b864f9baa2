"""DFlash 2's modules: the convolution's taps, the selector's walk, the published export layout.

The layout fixture (``fixtures/dflash2_vllm_layout.json``) was written by hand from vLLM's serving
implementation, ``vllm/model_executor/models/qwen3_dflash2.py`` at commit
030da624231c394ea975df15248edd9adc9315da (the shapes its constructors create, the ``dflash_config`` fields it
reads); the training side follows vllm-project/speculators ``models/dflash2`` (init, selector loss).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from tests.support.model_util import random_embed, tiny_drafter, tiny_target, tiny_target_config
from trainer.drafting.config import DraftConfig
from trainer.drafting.dflash2_conv import GroupedDynamicConv
from trainer.drafting.selector import CandidateSelector, selector_loss, walk
from trainer.evaluation.drafter_cache import DraftContextCache
from trainer.model import DFlashDrafter, config_json, load_drafter, save_drafter

FIXTURE = Path(__file__).parent / "fixtures" / "dflash2_vllm_layout.json"


def dflash2(**over):
    d2 = {"selector_rank": 8, "selector_top_k": 4, **over.pop("dflash2", {})}
    return tiny_drafter(arch="dflash2", dflash2=d2, **over)


def randomised_conv(bs: int, taps: int) -> GroupedDynamicConv:
    torch.manual_seed(0)
    conv = GroupedDynamicConv(64, bs, taps, 16)
    with torch.no_grad():  # away from the identity init, so every tap and the dynamic part act
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_(std=0.3)
    return conv


@pytest.mark.parametrize("taps", [2, 3])
def test_conv_taps_stay_in_the_block_and_never_look_ahead(taps):
    bs, blocks = 4, 3
    conv = randomised_conv(bs, taps)
    x = torch.randn(1, bs * blocks, 64)
    y = torch.randn(1, bs * blocks, 64)
    base_in, delta = conv.prepare(x)
    base_out = conv.finish(y, delta)
    for p in range(bs * blocks):
        x2 = x.clone()
        x2[0, p] += 1.0
        moved_in, delta2 = conv.prepare(x2)
        y2 = y.clone()
        y2[0, p] += 1.0
        moved_out = conv.finish(y2, delta)  # the output side, with the same coefficients
        block, slot = divmod(p, bs)
        allowed = {block * bs + s for s in range(slot, min(bs, slot + taps))}  # p and the next taps-1 slots
        for name, a, b in (("input side", base_in, moved_in), ("output side", base_out, moved_out)):
            changed = {q for q in range(bs * blocks) if not torch.equal(a[0, q], b[0, q])}
            assert changed == allowed, (name, p, changed, allowed)
        # the dynamic coefficients of position p come from position p alone
        changed_delta = {q for q in range(bs * blocks) if not torch.equal(delta[0, q], delta2[0, q])}
        assert changed_delta == {p}


def test_fresh_convs_are_the_identity_a_fresh_dflash2_equals_dflash1():
    d1, cfg1 = tiny_drafter(block_size=4)
    d2, _ = dflash2(block_size=4)
    missing, unexpected = d2.load_state_dict(d1.state_dict(), strict=False)
    assert not unexpected and all("conv" in k or "selector" in k for k in missing)
    T = 16
    torch.manual_seed(5)
    feats = torch.randn(1, T, cfg1.num_captured * cfg1.hidden_size)
    ids = torch.randint(0, 200, (1, T))
    args = (feats, ids, torch.zeros(1, T, dtype=torch.long), torch.tensor([[0, 5, 9]]), random_embed())
    torch.testing.assert_close(d2(*args), d1(*args), atol=0, rtol=0)
    with torch.no_grad():  # a trained conv changes the output: the modules are on the path
        d2.layers[1].mlp_conv.base_kernel[1, 1] += 0.5
    assert not torch.allclose(d2(*args), d1(*args))


def test_inference_block_equals_the_training_forward_with_convs():
    drafter, cfg = dflash2(block_size=6)
    with torch.no_grad():
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.normal_(std=0.5)
                conv.kernel_projection.weight.normal_(std=0.1)
    embed = random_embed()
    torch.manual_seed(3)
    T = 20
    feats = torch.randn(1, T, cfg.num_captured * cfg.hidden_size)
    ids = torch.randint(0, 200, (1, T))
    for a in (0, 7, 13):
        ref = drafter(feats, ids, torch.zeros(1, T, dtype=torch.long), torch.tensor([[a, 2]]), embed)[0, 0]
        cache = DraftContextCache(drafter)
        cache.extend(feats[0, :a])
        torch.testing.assert_close(cache.block(int(ids[0, a]), embed), ref, atol=2e-5, rtol=1e-4)


def brute_force_walk(edges: torch.Tensor) -> list[int]:
    """Every one of the K**L paths from the anchor; the best is the one whose step scores, read in slot
    order, are largest (each slot's score given the path's own previous choice; ties: the lower rank)."""
    L, K, _ = edges.shape
    best, best_key = None, None
    for path in itertools.product(range(K), repeat=L):
        prev, key = 0, []
        for step, c in enumerate(path):
            key.append(float(edges[step, prev, c]))
            key.append(-c)  # ties: lowest rank first
            prev = c
        if best_key is None or key > best_key:
            best, best_key = list(path), key
    return best


@pytest.mark.parametrize("seed", range(6))
def test_greedy_walk_equals_the_brute_force_best_path(seed):
    g = torch.Generator().manual_seed(seed)
    L, K = 2 + seed % 3, 2 + seed % 3
    edges = torch.randn(L, K, K, generator=g)
    if seed == 5:  # ties, as low-precision scores give
        edges = edges.round()
    idx, q = walk(edges)
    assert q is None and idx.tolist() == brute_force_walk(edges)


def test_selector_scores_and_walk_on_the_real_modules_equal_the_formula():
    """The proposer's path on a real selector: scores from the definition (unary logit + predecessor code *
    gated hidden . successor code), best path by brute force."""
    torch.manual_seed(4)
    sel = CandidateSelector(vocab_size=50, hidden_size=16, rank=6, top_k=3)
    with torch.no_grad():
        sel.successor_codebook.normal_(std=1.0)
        sel.predecessor_codebook.normal_(std=1.0)
    h = torch.randn(4, 16)
    logits = torch.randn(4, 50)
    unary, cand = logits.topk(3, dim=-1)
    anchor = 7
    edges = sel.edge_scores(h, cand, unary, anchor)
    gate = h @ sel.hidden_projection.weight.t()
    for step in range(4):
        for i in range(3):
            p = anchor if step == 0 else int(cand[step - 1, i])
            for c in range(3):
                want = (
                    unary[step, c]
                    + (sel.predecessor_codebook[p] * gate[step] * sel.successor_codebook[cand[step, c]]).sum()
                )
                torch.testing.assert_close(edges[step, i, c], want, atol=1e-5, rtol=1e-5)
    assert walk(edges)[0].tolist() == brute_force_walk(edges)


def test_sampled_walk_returns_the_distribution_it_drew_from():
    g = torch.Generator().manual_seed(1)
    edges = torch.randn(2, 3, 3, generator=g)
    T = 0.7
    R = 30_000
    idx, q = walk(edges.expand(R, 2, 3, 3), T, torch.Generator().manual_seed(2))
    first = torch.softmax(edges[0, 0] / T, -1)
    torch.testing.assert_close(q[:, 0], first.expand(R, 3))
    torch.testing.assert_close(q[:, 1], torch.softmax(edges[1][idx[:, 0]] / T, -1))  # given the first pick
    joint = first.unsqueeze(1) * torch.softmax(edges[1] / T, -1)  # (3, 3)
    counts = torch.bincount(idx[:, 0] * 3 + idx[:, 1], minlength=9).double()
    e = joint.reshape(-1).double() * R
    assert float(((counts - e) ** 2 / e).sum()) < 26.1  # chi-square, 8 d.o.f., p = 0.001


def test_selector_loss_teacher_forces_and_trains_the_selector():
    drafter, cfg = dflash2(block_size=4)
    target = tiny_target()
    W = target.lm_head.weight.detach()
    B, A, bs, H = 1, 3, 4, cfg.hidden_size
    torch.manual_seed(0)
    hidden = torch.randn(B, A, bs, H, requires_grad=True)
    ids = torch.randint(0, 290, (1, 20))
    anchors = torch.tensor([[0, 6, -1]])
    sel = drafter.candidate_selector
    loss, m = selector_loss(hidden, sel, W, ids, anchors, gamma=7.0)
    loss.backward()
    assert loss.item() > 0 and hidden.grad.abs().sum() > 0 and sel.successor_codebook.grad.abs().sum() > 0
    assert hidden.grad[0, 2].abs().sum() == 0 and hidden.grad[0, :, 0].abs().sum() == 0  # padding, slot 0
    # only the data tokens' predecessors get a gradient in the predecessor codebook (teacher forcing)
    prev = {int(ids[0, a + k - 1]) for a in (0, 6) for k in range(1, bs)}
    rows = set(torch.nonzero(sel.predecessor_codebook.grad.abs().sum(1)).view(-1).tolist())
    assert rows == prev
    # a few steps on a fixed batch: the selector learns to put the label first
    opt = torch.optim.Adam(sel.parameters(), lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        loss2, m = selector_loss(hidden.detach(), sel, W, ids, anchors, gamma=7.0)
        loss2.backward()
        opt.step()
    assert loss2.item() < 0.2 * loss.item() and m["selector_acc"] == m["selector_recall"]


def test_export_matches_the_published_serving_layout_and_loads_back_bit_exactly(tmp_path):
    fx = json.loads(FIXTURE.read_text())
    c = fx["config"]
    d = c["dflash_config"]
    tcfg = tiny_target_config(
        hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"], vocab_size=c["vocab_size"]
    )
    cfg = DraftConfig.from_target_config(
        tcfg,
        num_draft_layers=c["num_hidden_layers"],
        block_size=c["block_size"],
        mask_token_id=d["mask_token_id"],
        target_layer_ids=d["target_layer_ids"],
        arch="dflash2",
        dflash2={k: d[k] for k in fx["dflash_config_fields_read"]},
    )
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_()
    save_drafter(drafter, cfg, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == c["architectures"]
    for k, v in c.items():
        if k != "dflash_config":
            assert written[k] == v, k
    assert written["dflash_config"] == d
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    new = {k: v for k, v in shapes.items() if "conv" in k or "selector" in k}
    assert new == fx["expected_shapes"]
    d1, _ = tiny_drafter(
        target_config=tcfg, num_draft_layers=2, block_size=8, mask_token_id=299, target_layer_ids=[1, 1]
    )
    assert set(shapes) - set(new) == set(d1.state_dict())  # the DFlash 1 backbone, unchanged
    back, cfg2 = load_drafter(tmp_path)
    assert cfg2 == cfg and config_json(cfg2, torch.float32) == written
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def test_config_errors_name_the_field():
    tc = tiny_target_config()
    with pytest.raises(ValueError, match="conv_group_size"):
        DraftConfig.from_target_config(tc, arch="dflash2", dflash2={"conv_group_size": 24})
    with pytest.raises(ValueError, match="conv_kernel_size"):
        DraftConfig.from_target_config(tc, block_size=2, arch="dflash2", dflash2={"conv_kernel_size": 3})
    with pytest.raises(ValueError, match="selector_top_k"):
        DraftConfig.from_target_config(tc, arch="dflash2", dflash2={"selector_top_k": 1000})
    with pytest.raises(ValueError, match="only apply to arch 'dflash2'"):
        DraftConfig.from_target_config(tc, dflash2={"selector_rank": 4})
    cfg = DraftConfig.from_target_config(tc, arch="dflash2")
    assert (cfg.conv_kernel_size, cfg.conv_group_size, cfg.selector_rank, cfg.selector_top_k) == (
        2,
        16,
        256,
        16,
    )


@pytest.mark.parametrize("soft", [False, True])
def test_candidates_taken_in_the_dflash_loss_equal_a_separate_pass(soft):
    """The trainer takes the selector's top-k from the DFlash loss's own chunked logits (``topk=``): the same
    candidates, values, selector loss and gradients as the selector's own ``lm_head`` pass, across chunks."""
    from trainer.drafting.head import FrozenHead
    from trainer.drafting.loss import dflash_loss

    drafter, cfg = dflash2(block_size=4)
    head = FrozenHead.from_model(tiny_target())
    torch.manual_seed(0)
    hidden = torch.randn(2, 3, 4, cfg.hidden_size)
    ids = torch.randint(0, 290, (2, 20))
    anchors = torch.tensor([[0, 6, -1], [2, 9, 15]])
    final = torch.randn(2, 20, cfg.hidden_size) if soft else None
    sel, K = drafter.candidate_selector, drafter.candidate_selector.top_k
    plain, pm = dflash_loss(hidden, head, ids, anchors, 7.0, target_final_hidden=final, chunk_tokens=5)
    loss, m = dflash_loss(hidden, head, ids, anchors, 7.0, target_final_hidden=final, chunk_tokens=5, topk=K)
    assert loss.item() == plain.item() and set(pm) == set(m) - {"topk_ids", "topk_values", "label_ids"}
    logits = hidden[:, :, 1:].reshape(-1, cfg.hidden_size) @ head.lm_head.weight.t()
    want_v, want_i = logits.topk(K, dim=-1)
    assert torch.equal(m["topk_ids"], want_i) and m["topk_values"].dtype == torch.float32
    torch.testing.assert_close(m["topk_values"], want_v)

    def sel_run(cands):
        h = hidden.clone().requires_grad_(True)
        sel.zero_grad()
        out, metrics = selector_loss(
            h, sel, head.lm_head.weight, ids, anchors, 7.0, chunk_tokens=5, candidates=cands
        )
        out.backward()
        return out.item(), metrics, h.grad, sel.successor_codebook.grad.clone()

    a, b = sel_run(None), sel_run((m["topk_ids"], m["topk_values"]))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])
    assert torch.equal(m["topk_ids"], want_i)  # the selector's label swap worked on its own copy
    with pytest.raises(ValueError, match="candidates"):
        selector_loss(hidden, sel, head.lm_head.weight, ids, anchors, 7.0, candidates=(want_i[:, :2], want_v))
    with pytest.raises(ValueError, match="labels"):
        selector_loss(hidden, sel, head.lm_head.weight, ids, anchors, 7.0, labels=m["label_ids"][:-1])


def _slot_labels(ids, anchors, bs, final=None, weight=None):
    """Loop form of the selector's label per scored slot (block-major, as ``label_ids``): the target's argmax
    at the position before (``final @ weight.T``), or the data token; -1 where no real slot is."""
    out = []
    for b in range(anchors.shape[0]):
        for a in anchors[b].tolist():
            for k in range(1, bs):
                p = a + k
                if a < 0 or p >= ids.shape[1]:
                    out.append(-1)
                elif final is None:
                    out.append(int(ids[b, p]))
                else:
                    out.append(int((final[b, p - 1] @ weight.t()).argmax()))
    return torch.tensor(out)


def _loop_selector_loss(hidden, sel, weight, ids, anchors, labels, gamma):
    """The selector's loss slot by slot (speculators' definition): candidates = the unary top-k, the label in
    place of the last one when missing, predecessor = the data token before, position-weighted K-way CE."""
    K, bs = sel.top_k, hidden.shape[2]
    num = den = 0.0
    n = 0
    with torch.no_grad():
        for b in range(anchors.shape[0]):
            for j, a in enumerate(anchors[b].tolist()):
                for k in range(1, bs):
                    y = int(labels[n])
                    n += 1
                    if y < 0:
                        continue
                    h = hidden[b, j, k]
                    logits = h @ weight.t()
                    cand = logits.topk(K).indices
                    if y not in cand.tolist():
                        cand[-1] = y
                    t = cand.tolist().index(y)
                    prev = ids[b, a + k - 1].view(1)
                    scores = logits[cand] + sel.transition(h.view(1, -1), prev, cand.view(1, -1))[0]
                    w = float(torch.exp(torch.tensor(-(k - 1) / gamma)))
                    num += w * float(torch.logsumexp(scores, 0) - scores[t])
                    den += w
    return num / den


def test_selector_is_labelled_by_the_targets_argmax_under_soft_labels():
    """With soft labels the selector learns what a greedy verifier accepts: the target's argmax at each slot
    (``dflash_loss``'s ``label_ids``, from its own chunked pass), not the data token; the predecessor stays the
    data token (teacher forcing, as speculators). Without soft labels the label is the data token."""
    from trainer.drafting.head import FrozenHead
    from trainer.drafting.loss import dflash_loss

    drafter, cfg = dflash2(block_size=4)
    head = FrozenHead.from_model(tiny_target())
    W = head.lm_head.weight
    torch.manual_seed(0)
    B, bs, H = 2, 4, cfg.hidden_size
    hidden = torch.randn(B, 3, bs, H)
    ids = torch.randint(0, 290, (B, 20))
    anchors = torch.tensor([[0, 6, -1], [2, 9, 17]])  # padding, and a block running past the row's end
    final = torch.randn(B, 20, H)
    # where the target agrees with the drafter (its hidden state = the drafter's there), its argmax is the
    # drafter's top-1: always among the candidates, whatever the data token is
    for b in range(B):
        for j, a in enumerate(anchors[b].tolist()):
            for k in range(1, bs):
                if a >= 0 and a + k < 20:
                    final[b, a + k - 1] = hidden[b, j, k]
    sel, K = drafter.candidate_selector, drafter.candidate_selector.top_k

    _, m = dflash_loss(hidden, head, ids, anchors, 7.0, target_final_hidden=final, chunk_tokens=5, topk=K)
    want = _slot_labels(ids, anchors, bs, final, W)
    data = _slot_labels(ids, anchors, bs)
    real = want >= 0
    assert torch.equal(m["label_ids"][real], want[real])
    assert (want[real] != data[real]).sum() >= 10  # the target and the data disagree at most slots

    cands = (m["topk_ids"], m["topk_values"])
    soft, sm = selector_loss(hidden, sel, W, ids, anchors, 7.0, candidates=cands, labels=m["label_ids"])
    hard, hm = selector_loss(hidden, sel, W, ids, anchors, 7.0, candidates=cands)
    assert soft.item() == pytest.approx(
        _loop_selector_loss(hidden, sel, W, ids, anchors, want, 7.0), rel=1e-5
    )
    assert hard.item() == pytest.approx(
        _loop_selector_loss(hidden, sel, W, ids, anchors, data, 7.0), rel=1e-5
    )
    assert abs(soft.item() - hard.item()) > 0.1
    # the metrics are measured against the same label: the target's argmax is the drafter's top-1 here
    assert sm["selector_recall"].item() == 1.0 and hm["selector_recall"].item() < 0.5
    assert 0.0 <= sm["selector_acc"].item() <= 1.0

    _, m0 = dflash_loss(hidden, head, ids, anchors, 7.0, chunk_tokens=5, topk=K)  # no soft labels
    assert torch.equal(m0["label_ids"][real], data[real])
    plain, _ = selector_loss(
        hidden,
        sel,
        W,
        ids,
        anchors,
        7.0,
        candidates=(m0["topk_ids"], m0["topk_values"]),
        labels=m0["label_ids"],
    )
    assert plain.item() == hard.item()


def test_selector_unary_grad_reaches_the_drafter_through_the_live_logits():
    """``unary_grad=True`` (``--selector-unary-grad``, speculators' objective): the same loss value, and the
    gradient a dense form gives with the candidates' logits live (``h @ lm_head.T`` gathered at the candidates,
    the label in place of the last one when missing); gathered in chunks that do not divide the slots."""
    drafter, cfg = dflash2(block_size=4)
    W = tiny_target().lm_head.weight.detach()
    sel, K = drafter.candidate_selector, drafter.candidate_selector.top_k
    torch.manual_seed(1)
    hidden = torch.randn(2, 3, 4, cfg.hidden_size)
    ids = torch.randint(0, 290, (2, 20))
    anchors = torch.tensor([[0, 6, -1], [2, 9, 17]])
    labels = torch.randint(0, 290, (2 * 3 * 3,))  # mostly outside the top-k: the swapped-in label's logit too

    def run(unary_grad):
        h = hidden.clone().requires_grad_(True)
        sel.zero_grad()
        out, _ = selector_loss(
            h, sel, W, ids, anchors, 7.0, chunk_tokens=9, labels=labels, unary_grad=unary_grad
        )
        out.backward()
        return out, h.grad, sel.successor_codebook.grad.clone()

    (off, g_off, s_off), (on, g_on, s_on) = run(False), run(True)
    assert on.item() == off.item() and torch.equal(s_on, s_off)
    assert not torch.allclose(g_on, g_off, atol=1e-4)  # the unary path adds to the drafter's gradient

    # dense reference: the same slots, weights and candidates, every logit live
    h = hidden.clone().requires_grad_(True)
    flat = h[:, :, 1:].reshape(-1, cfg.hidden_size)
    logits = flat @ W.t()
    cand = logits.detach().topk(K, dim=-1).indices
    present = cand.eq(labels.unsqueeze(1)).any(1)
    cand[:, -1] = torch.where(present, cand[:, -1], labels)
    tgt = torch.where(present, cand.eq(labels.unsqueeze(1)).long().argmax(1), torch.full_like(labels, K - 1))
    k = torch.arange(1, 4)
    tpos = anchors.unsqueeze(-1) + k
    ok = ((anchors >= 0).unsqueeze(-1) & (tpos < 20)).reshape(-1)
    prev = torch.gather(ids, 1, (tpos.clamp(0, 19) - 1).clamp(min=0).view(2, -1)).view(-1)
    scores = logits.gather(1, cand) + sel.transition(flat, prev, cand)
    w = torch.exp(-(k - 1) / 7.0).repeat(6) * ok
    ref = (torch.nn.functional.cross_entropy(scores, tgt, reduction="none") * w).sum() / w.sum()
    ref.backward()
    torch.testing.assert_close(on, ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_on, h.grad, rtol=1e-4, atol=1e-6)

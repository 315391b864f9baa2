"""The roles on CPU: the target role's micro-batch stream (``TargetRole.run``: in order, each handed on when
computed); DFlash 2's drafter role labelling its selector."""

import time

import pytest
import torch

from tests.support.model_util import cpu_drafter_role, tiny_drafter, tiny_target
from trainer.data.dataset import Plan, load_dir
from trainer.drafting.head import FrozenHead
from trainer.drafting.masks import anchor_count, sample_anchors
from trainer.drafting.selector import selector_loss
from trainer.run.rundir import RoleMeter
from trainer.runtime.common import quiet_transformers
from trainer.runtime.hidden_queue import HiddenBatch
from trainer.runtime.roles import TargetRole, launch_lock
from trainer.target.capture import capture, load_target


def test_target_run_on_cpu_hands_each_batch_on_as_soon_as_it_is_computed(tiny_assets):
    quiet_transformers()
    model = load_target(str(tiny_assets / "target"), "cpu", torch.float32, [1, 3])
    plan = Plan(
        load_dir(str(tiny_assets / "data"), 256), seed=0, epochs=1, token_budget=1024, max_batch_size=4
    )
    meter = RoleMeter("cpu", "target")
    role = TargetRole(model, "cpu", [1, 3], False, meter)
    gs = list(range(min(plan.total, 4)))
    it = role.run(plan, gs)
    first = next(it)
    tokens, _ = meter.take(time.monotonic())
    assert first.index == 0 and tokens == first.tokens  # nothing computed ahead: on CPU there is no overlap
    rest = list(it)
    assert [hb.index for hb in rest] == gs[1:]
    ref = role(plan.batch(gs[-1]))
    assert torch.equal(rest[-1].hidden, ref.hidden)


def test_launch_lock_only_where_roles_compile():
    class Devices:
        def __init__(self, target, drafter):
            self.target, self.drafter = target, drafter

    assert (
        launch_lock(Devices(["cpu"], ["cpu"])) is None
    )  # CPU roles compute in the call: never serialise them
    lock = launch_lock(Devices(["cuda:0"], ["cuda:0"]))
    assert lock is not None and lock.acquire(blocking=False)


def test_dflash2_drafter_role_labels_its_selector_by_the_targets_argmax_with_soft_labels():
    """The trainer's micro-step (``DrafterRole``) with soft labels trains the selector against the target's own
    argmax at each slot (what a greedy verifier accepts), on a real tiny target's captured states; the selector
    metrics measure against the same label."""
    target = tiny_target()
    head = FrozenHead.from_model(target)
    drafter, cfg = tiny_drafter(
        arch="dflash2", dflash2={"selector_rank": 8, "selector_top_k": 4}, block_size=4
    )
    T, bs, max_anchors, gamma, seed = 48, cfg.block_size, 6, 7.0, 11
    ids = torch.randint(0, 290, (1, T), generator=torch.Generator().manual_seed(3))
    docs = torch.zeros_like(ids)
    docs[:, 30:] = 1
    lm = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        hidden, final = capture(target, ids, docs, cfg.target_layer_ids, need_final_hidden=True)
    hb = HiddenBatch(0, 0, T, hidden, final, ids, lm, docs)
    role = cpu_drafter_role(
        drafter, head, block_size=bs, max_anchors=max_anchors, gamma=gamma, noise_type="uniform"
    )
    got = role.micro_step(hb, 0.0, 1.0, seed=seed)

    # the same step by hand: the anchors the seed draws, the drafter's output, the labels in loop form
    g = torch.Generator().manual_seed(seed)
    A = anchor_count(docs, lm, bs, max_anchors)
    anchors = sample_anchors(docs, lm, bs, max_anchors, g, num_anchors=A)
    with torch.no_grad():
        out = drafter(hidden, ids, docs, anchors, head.embed_tokens, attn_impl="sdpa")
        logits_t = final[0] @ head.lm_head.weight.t()  # (T, V): the target's next-token logits
    tgt, data = [], []
    for a in anchors[0].tolist():
        for k in range(1, bs):
            ok = a >= 0 and a + k < T
            tgt.append(int(logits_t[a + k - 1].argmax()) if ok else 0)
            data.append(int(ids[0, a + k]) if ok else 0)
    tgt, data = torch.tensor(tgt), torch.tensor(data)
    assert (tgt != data).sum() >= 5  # a random target and random data disagree
    sel = drafter.candidate_selector
    W = head.lm_head.weight
    want, wm = selector_loss(out, sel, W, ids, anchors, gamma, labels=tgt)
    old, _ = selector_loss(out, sel, W, ids, anchors, gamma)  # labelled by the data tokens
    assert abs(want.item() - old.item()) > 0.01  # far outside the tolerance below
    torch.testing.assert_close(got["selector_loss"], want, rtol=1e-5, atol=1e-6)
    for k in ("selector_recall", "selector_acc"):
        assert got[k].item() == pytest.approx(wm[k].item(), abs=1e-6), k

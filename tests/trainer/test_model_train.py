"""End to end on CPU: a tiny random Qwen3 target, a drafter on it, loss falls on a learnable sequence task.

The task: documents follow a fixed random successor cycle over 24 tokens, so the block after an anchor
token is determined by it. The drafter starts at chance (acc ~ 0) and must learn it through the whole
path: capture -> anchors -> drafter (SDPA dense mask) -> chunked loss -> AdamW.
"""

import torch

from tests.support.model_util import tiny_drafter, tiny_target
from trainer.drafting.head import FrozenHead
from trainer.drafting.loss import dflash_loss, metrics_to_floats
from trainer.drafting.masks import sample_anchors
from trainer.target.capture import capture


def _batch(g, succ, tokens, rows=4, doc_len=24, docs_per_row=2):
    ids, doc = [], []
    for _ in range(rows):
        row, drow = [], []
        for d in range(docs_per_row):
            t = tokens[torch.randint(0, len(tokens), (1,), generator=g)].item()
            for _ in range(doc_len):
                row.append(t)
                drow.append(d)
                t = succ[t]
        ids.append(row)
        doc.append(drow)
    return torch.tensor(ids), torch.tensor(doc)


def test_drafter_learns_a_synthetic_sequence_task():
    g = torch.Generator().manual_seed(0)
    # a trained LM head has large weights; a random one at std 0.02 gives logits too flat to ever be
    # confident, so the tiny target is initialised wider
    target = tiny_target(initializer_range=0.2)
    head = FrozenHead.from_model(target)
    drafter, cfg = tiny_drafter(num_draft_layers=1, block_size=4)
    drafter.train()
    tokens = torch.randperm(299, generator=g)[:24]
    perm = tokens[torch.randperm(24, generator=g)]
    succ = {int(perm[i]): int(perm[(i + 1) % 24]) for i in range(24)}
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    losses, accs = [], []
    for _ in range(120):
        ids, doc = _batch(g, succ, tokens)
        hidden, _ = capture(target, ids, doc, cfg.target_layer_ids)
        anchors = sample_anchors(doc, torch.ones_like(ids, dtype=torch.bool), cfg.block_size, 16, g)
        out = drafter(hidden, ids, doc, anchors, head.embed_tokens)
        loss, metrics = dflash_loss(out, head, ids, anchors, gamma=7.0, chunk_tokens=64)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        accs.append(metrics_to_floats(metrics)["acc"])
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert first > 4.0  # ~ln(300) at the start
    assert last < 0.1 * first, (first, last)
    final_acc = [sum(a[k] for a in accs[-10:]) / 10 for k in range(3)]
    assert min(final_acc) > 0.9, final_acc

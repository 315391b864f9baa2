"""The estimate's walk against the real decoding loop on a small CPU run (docs/evaluate.md, "Scattered anchors
over-read"). After

    PYTHONPATH=. python bench/bench_acceptance.py --small --out /tmp/bs --parallel --blocks 8:1:dflash,16:2 --frozen-steps 20
    PYTHONPATH=. python bench/runs/acceptance_cpu_small/check_walk.py [b8_dflash]

1. per prompt: the drafter's training-mode forward with every decoded position as an anchor, walked from the
   first decoded token as a decoding loop goes, against ``trainer.evaluate``'s verify steps (they agree step
   for step; the walk stops a few steps before the text's end, where blocks no longer fit);
2. the 16 prompts as one packed row (as the trainer sees them): the walk over every position, over anchors
   drawn scattered and in runs of 16 (``masks.sample_anchors``) at several densities, and the uniform mean.
"""

from __future__ import annotations

import glob
import json
import sys

import torch

from trainer.drafting.acceptance import decode_walk
from trainer.drafting.masks import sample_anchors
from trainer.evaluation.drafter_cache import DrafterProposer
from trainer.evaluation.load import load_drafter_any, load_target_model
from trainer.evaluation.spec_decode import CachedTarget, speculative_generate
from trainer.target.capture import capture, load_target

W = "/tmp/dflash_accept"


def chains(drafter, model, tm, cfg, ids, doc, anchors):
    th, _ = capture(tm, torch.tensor([ids]), torch.tensor([doc]), cfg.target_layer_ids, True)
    h = drafter(
        th, torch.tensor([ids]), torch.tensor([doc]), anchors, model.get_input_embeddings(), attn_impl="sdpa"
    )
    bs = cfg.block_size
    pred = model.get_output_embeddings()(h.view(anchors.shape[1], bs, -1)[:, 1:]).argmax(-1)
    lab = torch.tensor([[ids[a + 1 + k] for k in range(bs - 1)] for a in anchors[0].tolist()])
    return (pred == lab).long().cumprod(1).sum(1)


def main() -> None:
    torch.set_grad_enabled(False)
    tag = sys.argv[1] if len(sys.argv) > 1 else "b8_dflash"
    ck = sorted(glob.glob(f"{W}/run_{tag}/checkpoints/step_*"))[-1]
    drafter, cfg = load_drafter_any(ck + "/drafter", W + "/target", "cpu", torch.float32)
    drafter.eval()
    model = load_target_model(W + "/target", "cpu", torch.float32)
    tm = load_target(W + "/target", "cpu", torch.float32, cfg.target_layer_ids, need_final_hidden=True)
    with open(f"{W}/generated_{tag}/out.jsonl", encoding="utf-8") as f:
        lines = [json.loads(x) for x in f]
    bs = cfg.block_size
    for i, line in enumerate(lines[:8]):
        ids, p0 = line["input_ids"], line["loss_mask"].index(1)
        target = CachedTarget(model, cfg.target_layer_ids)
        prop = DrafterProposer(drafter, model.get_input_embeddings(), model.get_output_embeddings())
        real = speculative_generate(target, prop, ids[:p0], len(ids) - p0, 0.0, None, set())
        assert real.tokens == ids[p0:]
        anchors = torch.arange(p0, len(ids) - bs + 1).view(1, -1)
        chain = dict(
            zip(
                anchors[0].tolist(),
                chains(drafter, model, tm, cfg, ids, [0] * len(ids), anchors).tolist(),
                strict=True,
            )
        )
        a, walk = p0, []
        while a in chain:
            walk.append(chain[a] + 1)
            a += chain[a] + 1
        same = walk == real.accept_lens[: len(walk)]
        print(f"prompt {i}: real {real.accept_lens}\n          walk {walk} (a prefix of real: {same})")
    ids, doc, cand = [], [], []
    for d, line in enumerate(lines):
        p0, off = line["loss_mask"].index(1), len(ids)
        ids += line["input_ids"]
        doc += [d] * len(line["input_ids"])
        cand += list(range(off + p0 - 1, off + len(line["input_ids"]) - bs + 1))
    an = torch.tensor([cand])
    chain = chains(drafter, model, tm, cfg, ids, doc, an)
    full = torch.zeros(len(ids), dtype=torch.long)
    full[an[0]] = chain
    t, s = decode_walk(an, chain.view(1, -1), torch.ones_like(an, dtype=torch.bool))
    print(
        f"packed row: {len(cand)} candidates; walk over all {float(t) / float(s):.3f}; uniform {1 + chain.float().mean():.3f}"
    )
    g = torch.Generator().manual_seed(0)
    lm = torch.zeros(1, len(ids), dtype=torch.long)
    lm[0, [c + k for c in cand for k in range(1, bs)]] = 1
    docs = torch.tensor([doc])
    for k in (512, 256, 128, 64, 32):
        for run in (1, 16):
            tt = ss = 0
            for _ in range(100):
                a = sample_anchors(docs, lm, bs, k, g, run_length=run)
                x, y = decode_walk(a, full[a.clamp(min=0)], a >= 0)
                tt, ss = tt + int(x), ss + int(y)
            print(f"{k:4d} anchors (density {k / len(cand):.3f}), runs of {run:2d}: walk {tt / ss:.3f}")


if __name__ == "__main__":
    main()

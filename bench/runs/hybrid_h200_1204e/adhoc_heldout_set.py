"""Ad hoc (fifth session, issue 35): is the --est-holdout 256 set (seed 1) easier than the other sequences? Call 2's
dense 4,800-step drafter (trained on all of them), frozen, walked over every completion position of the 256 and of
512 others (printed: 4.99 and 5.10).

    python3 -m trainer.prepare --tokenizer TARGET --input bench/out/regen_dense/regenerated.jsonl --output-dir DATA
    PYTHONPATH=. python bench/runs/hybrid_h200_1204e/adhoc_heldout_set.py DATA DRAFTER_EXPORT TARGET
"""

import sys

import numpy as np
import torch

from bench import est_seen
from trainer.data.dataset import held_out, load_dir
from trainer.drafting.head import FrozenHead
from trainer.model import load_drafter
from trainer.target.capture import load_target

torch.set_num_threads(2)
ds = load_dir(sys.argv[1], 512)
held = held_out(len(ds), 256, 1)
others = np.random.default_rng(0).choice(np.setdiff1d(np.arange(len(ds)), held), 512, replace=False)


def rows(idx):
    spans = [(int(ds.offsets[s]), int(ds.offsets[s + 1])) for s in idx]
    return [
        (ds.tokens[a:b].tolist(), ds.mask[a:b].astype(int).tolist())
        for a, b in spans
        if b - a == est_seen.SEQ
    ]


drafter, cfg = load_drafter(sys.argv[2])
model = load_target(sys.argv[3], "cpu", torch.float32, list(cfg.target_layer_ids), need_final_hidden=True)
head = FrozenHead.from_model(model)
for name, idx in (("held-out set", held), ("others", others)):
    print(name, est_seen.estimate(model, drafter.float().eval(), head, rows(idx))[0])

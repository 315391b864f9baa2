"""Ad hoc (fifth session, issue 35): how much of the --est-holdout 256 set's completions (seed 1) the training text
holds verbatim: the share of their 32-token windows found in the other sequences' completions (printed: 0.27;
the evaluation's own text and fresh text: 0.20 and 0.19, bench/est_seen.py).

    PYTHONPATH=. python bench/runs/hybrid_h200_1204e/adhoc_heldout_seen_windows.py DATA   # DATA: adhoc_heldout_set.py's
"""

import sys

from bench import est_seen
from trainer.data.dataset import held_out, load_dir

ds = load_dir(sys.argv[1], 512)
held = set(held_out(len(ds), 256, 1).tolist())
rows = [
    (
        ds.tokens[int(ds.offsets[s]) : int(ds.offsets[s + 1])].tolist(),
        ds.mask[int(ds.offsets[s]) : int(ds.offsets[s + 1])].astype(int).tolist(),
    )
    for s in range(len(ds))
]
train = [r for i, r in enumerate(rows) if i not in held]
print("held-out set:", est_seen.seen_share([rows[i] for i in sorted(held)], train))

"""This run's step records were written by a trainer whose running mean was wrong (fixed since): its
``accept_len_est`` field held the uniform mean (1 + chains / blocks, judged by the target's argmax) and its
``accept_len_est_uniform`` field held 1 + walk tokens / blocks; ``accept_len_est_step`` (the step's walk tokens /
walk steps) and ``blocks`` were right. The walk's tokens of every step follow exactly from those fields (the
window sums are cumulative for the first 50 steps, then slide: each step's tokens = the window sum minus the
previous 49 steps' tokens; they come out as whole numbers), its steps = tokens / ``accept_len_est_step``. This
recomputes the walk estimate the fixed trainer reports and writes corrected step records to OUT (default /tmp).

    python3 bench/runs/acceptance_h200_2400_walk/recover_walk.py [OUT]
"""

import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
W = 50  # trainer.runtime.loop.EST_WINDOW

out = {}
for name in ("b8_dflash", "b8_dflash2", "b16"):
    with gzip.open(os.path.join(HERE, f"metrics_run_{name}.jsonl.gz"), "rt") as f:
        steps = [r for r in map(json.loads, f) if r["kind"] == "step"]
    tok, walk_steps, blocks, fixed = [], [], [], []
    for r in steps:
        blocks.append(r["blocks"])
        window_tokens = (r["accept_len_est_uniform"] - 1.0) * sum(blocks[-W:])
        t = window_tokens - sum(tok[-(W - 1) :])
        tok.append(t)
        walk_steps.append(t / r["accept_len_est_step"])
        fixed.append(
            {
                **r,
                "accept_len_est": sum(tok[-W:]) / sum(walk_steps[-W:]),
                "accept_len_est_uniform": r["accept_len_est"],
            }
        )
    assert max(abs(t - round(t)) for t in tok) < 1e-6, "walk tokens must come out whole"
    with gzip.open(os.path.join(OUT, f"steps_corrected_{name}.jsonl.gz"), "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in fixed)
    out[name] = {
        "accept_len_est": fixed[-1]["accept_len_est"],
        "accept_len_est_uniform": fixed[-1]["accept_len_est_uniform"],
    }
print(json.dumps(out, indent=1))

"""Ad hoc (2026-12-05, eighth session): issue 35's gap split into the targets' states and their text. Reads the four
CPU runs of bench/context_back_cpu.py (each target's states over its own text, full_data_cpu_1205; over the other
target's text, this folder) and prints the 2 x 2 of walks and slot-1 acceptance, the paired ratios on one text
(states) and of one drafter's states over two texts, and, on the hybrid's text, both drafters by quartile of the
text's copyable share (bench/copy_share.py; decodes the 256 prompts with the hybrid target, ~1 min).

    PYTHONPATH=. python bench/runs/text_swap_cpu_1205/adhoc_states_text.py > bench/runs/text_swap_cpu_1205/states_text.json
"""

import json
import statistics as st

from bench import copy_share
from bench.bench_acceptance import PROMPT, heldout_prompts
from bench.context_back_cpu import compare

R, F = "bench/runs/text_swap_cpu_1205", "bench/runs/full_data_cpu_1205"
CELLS = {
    ("dense", "dense"): f"{F}/dense.json",
    ("hybrid", "hybrid"): f"{F}/hybrid.json",
    ("dense", "hybrid"): f"{R}/dense_states_hybrid_text.json",
    ("hybrid", "dense"): f"{R}/hybrid_states_dense_text.json",
}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["plain"]


def ratio(a: tuple, b: tuple) -> dict:
    r = compare(CELLS[a], CELLS[b])["plain_over_plain"]
    return {"ratio": r["ratio"], "ci95": r["ci95"]}


def pooled(run: dict, idx: list[int]) -> float:
    tok = sum(run["prompt_accept_len"][i] * run["prompt_steps"][i] for i in idx)
    return tok / sum(run["prompt_steps"][i] for i in idx)


def by_copy_quartile(n: int = 256) -> list[dict]:
    prompts = heldout_prompts(n, 1)
    cont = copy_share.decode("bench/out/hybrid_target", prompts, PROMPT)
    share = [st.mean(copy_share.copyable(p, c)) for p, c in zip(prompts, cont, strict=True)]
    dense, hybrid = load(CELLS["dense", "hybrid"]), load(CELLS["hybrid", "hybrid"])
    order = sorted(range(n), key=share.__getitem__)
    out = []
    for q in range(4):
        idx = order[q * n // 4 : (q + 1) * n // 4]
        d, h = pooled(dense, idx), pooled(hybrid, idx)
        out.append(
            {"share": st.mean(share[i] for i in idx), "dense_states": d, "hybrid_states": h, "ratio": d / h}
        )
    return out


cells = {f"{s}_states_{t}_text": load(p) for (s, t), p in CELLS.items()}
print(json.dumps({
    "walk": {k: v["walk"] for k, v in cells.items()},
    "slot1": {k: v["per_slot"][0] for k, v in cells.items()},
    "states_on_dense_text": ratio(("dense", "dense"), ("hybrid", "dense")),
    "states_on_hybrid_text": ratio(("dense", "hybrid"), ("hybrid", "hybrid")),
    "other_text_dense_states": ratio(("dense", "dense"), ("dense", "hybrid")),
    "other_text_hybrid_states": ratio(("hybrid", "hybrid"), ("hybrid", "dense")),
    "hybrid_text_by_copy_quartile": by_copy_quartile(),
}, indent=1))  # fmt: skip

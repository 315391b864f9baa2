"""One drafter of one bench_acceptance.py run against one of another, prompt by prompt (issue 35: DFlash 1 on
the hybrid target against DFlash 1 on the dense target of the same size and training).

    PYTHONPATH=. python bench/acceptance_pair.py DENSE/results.json qwen3_h384_block8_dflash \\
        HYBRID/results.json qwen3_5_h384_block8_dflash          # B over A: ratio and its 95% interval

Two runs decode the same held-out prompts when they share the corpus (its SHA-256), the seed, the size and
the prompt count; anything else is refused. Prints one JSON object: both real acceptances, the plain ratio
and ``report.paired_ratio``'s (bootstrap over prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer.evaluation.report import paired_ratio  # noqa: E402

MAX_BYTES = 256 * 2**20


def _load(path: str) -> dict:
    if os.path.getsize(path) > MAX_BYTES:
        raise SystemExit(f"{path}: larger than {MAX_BYTES} bytes")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def same_prompts(a: dict, b: dict) -> dict:
    """What must agree for two runs to have decoded the same prompts: {field: (a's, b's)} where they differ."""
    fields = {
        "corpus": lambda r: (r.get("corpus") or {}).get("sha256"),
        "seed": lambda r: r.get("seed"),
        "size": lambda r: (r.get("config") or {}).get("size"),
        "prompts": lambda r: (r.get("config") or {}).get("prompts"),
        "new_tokens": lambda r: (r.get("config") or {}).get("new"),
    }
    return {k: (f(a), f(b)) for k, f in fields.items() if f(a) != f(b) or f(a) is None}


def pair(a: dict, key_a: str, b: dict, key_b: str) -> dict:
    differ = same_prompts(a, b)
    if differ:
        raise SystemExit(f"the runs did not decode the same prompts: {differ}")
    ea, eb = (r.get(k, {}).get("eval") or {} for r, k in ((a, key_a), (b, key_b)))
    for k, e in ((key_a, ea), (key_b, eb)):
        if "prompt_steps" not in e:
            raise SystemExit(f"{k}: no evaluation with per-prompt steps in its results")
    ra, rb = ea["mean_accept_len"], eb["mean_accept_len"]
    return {"a": key_a, "b": key_b, "real_a": ra, "real_b": rb, "real_a_se": ea.get("mean_accept_len_se"),
            "real_b_se": eb.get("mean_accept_len_se"), "b_over_a": rb / ra,
            "paired": paired_ratio(ea, eb)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results_a")
    p.add_argument("key_a")
    p.add_argument("results_b")
    p.add_argument("key_b")
    a = p.parse_args(argv)
    print(json.dumps(pair(_load(a.results_a), a.key_a, _load(a.results_b), a.key_b)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

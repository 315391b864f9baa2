"""One drafter of one bench_acceptance.py run against one of another, prompt by prompt (issue 35: DFlash 1 on
the hybrid target against DFlash 1 on the dense target of the same size and training).

    PYTHONPATH=. python bench/acceptance_pair.py DENSE/results.json qwen3_h384_block8_dflash \\
        HYBRID/results.json qwen3_5_h384_block8_dflash          # B over A: ratio and its 95% interval

    PYTHONPATH=. python bench/acceptance_pair.py --a DENSE/results.json qwen3_h384_block8_dflash \
        --a DENSE/results.json qwen3_h384_block8_dflash_s2 --b HYBRID/results.json ...   # several runs a side

Two runs decode the same held-out prompts when they share the corpus (its SHA-256), the seed, the size and
the prompt count; anything else is refused. Prints one JSON object: both real acceptances, the plain ratio
and ``report.paired_ratio``'s (bootstrap over prompts).

With ``--a`` / ``--b`` (each ``FILE KEY``, repeated) a side is several training runs of one drafter (seeds:
``--blocks 8:2:dflash@s2``, ``--drafter-seed``), all on the same prompts: the ratio of the sides' pooled
acceptance, and its 95% interval by a two-level bootstrap (``runs_ratio``) that resamples the prompts (paired,
as above) and, on each side, the runs: the interval then covers the spread of training too, which a single
pair's cannot. With two or three runs a side, resampling them understates that spread (by about
sqrt((n-1)/n)); each run's own acceptance is printed beside it.

``--first N`` pairs the first N prompts of each run, where the runs drew different prompt counts: a seed's
prompts for a count are the first ones of any larger count (``heldout_chunks`` takes a prefix of one shuffle), so
a 512-prompt run's first 128 are a 128-prompt run's prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainer.evaluation.report import ci95, paired_ratio, prompt_tokens  # noqa: E402

MAX_BYTES = 256 * 2**20


def load_results(path: str) -> dict:
    if os.path.getsize(path) > MAX_BYTES:
        raise SystemExit(f"{path}: larger than {MAX_BYTES} bytes")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def same_prompts(a: dict, b: dict, first: int | None = None) -> dict:
    """What must agree for two runs to have decoded the same prompts (with ``first``: the same first ``first``
    prompts): {field: (a's, b's)} where they differ."""
    fields = {
        "corpus": lambda r: (r.get("corpus") or {}).get("sha256"),
        "seed": lambda r: r.get("seed"),
        "size": lambda r: (r.get("config") or {}).get("size"),
        "prompts": _prompts,
        "new_tokens": lambda r: (r.get("config") or {}).get("new"),
    }
    if first is not None:
        fields.pop("prompts")
        if any(n is None or n < first for n in (_prompts(a), _prompts(b))):
            return {"prompts": (_prompts(a), _prompts(b), f"fewer than --first {first}")}
    return {k: (f(a), f(b)) for k, f in fields.items() if f(a) != f(b) or f(a) is None}


def _prompts(run: dict) -> int | None:
    return (run.get("config") or {}).get("prompts")


def _eval(run: dict, key: str, first: int | None = None) -> dict:
    e = run.get(key, {}).get("eval") or {}
    if "prompt_steps" not in e:
        raise SystemExit(f"{key}: no evaluation with per-prompt steps in its results")
    return e if first is None else head(e, first)


def head(e: dict, n: int) -> dict:
    """An evaluation's first ``n`` prompts as an evaluation of its own: their acceptance over their verify steps
    (no standard error: it is recomputed by the pairing's bootstrap)."""
    cut = {
        "prompt_steps": e["prompt_steps"][:n],
        "prompt_accept_len": e["prompt_accept_len"][:n],
        "prompts": n,
    }
    steps = sum(cut["prompt_steps"])
    cut["mean_accept_len"] = sum(prompt_tokens(cut)) / steps if steps else math.nan
    return cut


def pair(a: dict, key_a: str, b: dict, key_b: str, first: int | None = None) -> dict:
    differ = same_prompts(a, b, first)
    if differ:
        raise SystemExit(f"the runs did not decode the same prompts: {differ}")
    ea, eb = _eval(a, key_a, first), _eval(b, key_b, first)
    ra, rb = ea["mean_accept_len"], eb["mean_accept_len"]
    return {"a": key_a, "b": key_b, "real_a": ra, "real_b": rb, "real_a_se": ea.get("mean_accept_len_se"),
            "real_b_se": eb.get("mean_accept_len_se"), "b_over_a": rb / ra,
            "paired": paired_ratio(ea, eb)}  # fmt: skip


def runs_ratio(a: list[dict], b: list[dict], resamples: int = 5000, seed: int = 0) -> dict:
    """Side B's evaluations against side A's (each several runs of one drafter, every one on the same prompts):
    pooled acceptance (all runs' tokens over all their verify steps) of B over A, and its 95% interval by a
    bootstrap that draws the prompts (one draw for every run of both sides) and, on each side, its runs."""
    steps = [e["prompt_steps"] for e in a + b]
    if len({len(x) for x in steps}) != 1 or len({e.get("prompts") for e in a + b}) != 1:
        raise ValueError("the evaluations did not decode the same prompts")
    toks = [prompt_tokens(e) for e in a + b]
    side_a, side_b, n = range(len(a)), range(len(a), len(a) + len(b)), len(steps[0])

    def pooled(runs, count) -> float:
        s = sum(c * steps[r][i] for r in runs for i, c in count.items())
        return sum(c * toks[r][i] for r in runs for i, c in count.items()) / s if s else math.nan

    def ratio(ra, rb, count) -> float:
        return pooled(rb, count) / pooled(ra, count)

    rng, every = random.Random(seed), dict.fromkeys(range(n), 1)
    boot = []
    for _ in range(resamples):
        count: dict[int, int] = {}
        for _ in range(n):
            i = rng.randrange(n)
            count[i] = count.get(i, 0) + 1
        draw_a, draw_b = ([rng.choice(side) for _ in side] for side in (side_a, side_b))
        if not math.isnan(x := ratio(draw_a, draw_b, count)):
            boot.append(x)
    return {"ratio": ratio(side_a, side_b, every), "ci95": ci95(boot), "prompts": n, "runs": [len(a), len(b)],
            "resamples": resamples, "resampled": "prompts and runs"}  # fmt: skip


def runs(a: list[tuple[str, dict, str]], b: list[tuple[str, dict, str]], first: int | None = None) -> dict:
    """``--a`` / ``--b``: each side a list of (file, results, key); every run must share the first's prompts."""
    ref = a[0][1]
    for path, r, _ in a + b:
        if differ := same_prompts(ref, r, first):
            raise SystemExit(f"{path} did not decode the prompts of {a[0][0]}: {differ}")
    ea, eb = ([_eval(r, k, first) for _, r, k in side] for side in (a, b))
    return {"a": [f"{p}:{k}" for p, _, k in a], "b": [f"{p}:{k}" for p, _, k in b],
            "real_a": [e["mean_accept_len"] for e in ea], "real_b": [e["mean_accept_len"] for e in eb],
            "runs": runs_ratio(ea, eb)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pair", nargs="*", metavar="RESULTS KEY", help="RESULTS_A KEY_A RESULTS_B KEY_B")
    p.add_argument("--a", nargs=2, action="append", metavar=("RESULTS", "KEY"), help="a run of side A")
    p.add_argument("--b", nargs=2, action="append", metavar=("RESULTS", "KEY"), help="a run of side B")
    p.add_argument("--first", type=int, default=None, help="pair each run's first N prompts only")
    a = p.parse_args(argv)
    if a.first is not None and a.first < 1:
        p.error("--first must be >= 1")
    if a.a or a.b:
        if a.pair or not (a.a and a.b):
            p.error("--a and --b each at least once, and no positional pair beside them")
        sides = ([(f, load_results(f), k) for f, k in side] for side in (a.a, a.b))
        print(json.dumps(runs(*sides, a.first)))
    elif len(a.pair) == 4:
        ra, ka, rb, kb = a.pair
        print(json.dumps(pair(load_results(ra), ka, load_results(rb), kb, a.first)))
    else:
        p.error("give RESULTS_A KEY_A RESULTS_B KEY_B, or --a / --b")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

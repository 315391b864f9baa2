"""Whether one target's own text is easier to draft than another's because it repeats itself (issue 35: the
dense target's DFlash 1 accepts more than the hybrid's; is it the text?).

Each target decodes the bench's held-out evaluation prompts greedily on the CPU (the first ``--results`` run's:
the first ``PROMPT`` bytes of its held-out chunks, ``--new`` tokens, fp32). A token is
*copyable* when prompt lookup predicts it: the longest suffix (``NMIN``-``NMAX`` tokens) of the text before
it that occurred earlier is followed there by this token. Per prompt: the copyable share of its new tokens,
beside the drafter's acceptance on that prompt (``--results``: bench_acceptance results and a drafter key,
the mean over several runs). Printed: each target's mean share, the correlation of acceptance with it, the
acceptance of each target's drafter in quartiles of the pooled shares, and the ratio of the two drafters'
fitted acceptance (a line each) at either target's mean share.

    PYTHONPATH=. python lab/copy_share.py --target dense=bench/out/dense_target \\
        --target hybrid=bench/out/hybrid_target \\
        --results dense=bench/results/hybrid_h200_2026-12-04/dense_block8_seeds.json:qwen3_h384_block8_dflash \\
        --results hybrid=bench/results/hybrid_h200_2026-12-04/hybrid_block8.json:qwen3_5_h384_block8_dflash

The first ``--target`` is the baseline of the ratio. CPU; ~20 s a target for 128 prompts x 128 tokens.
The prompts are the first ``--results`` run's own: the ones its results.json records (``heldout_prompts``,
since 2026-12-05), else this machine's draw for its seed, refused where the run's corpus (the standard library of
the Python that ran it: the GPU image's 3.12 against 3.11 here) is not this machine's; every other run must have
decoded the same. The fourth session's run paired this machine's prompts with a 3.12 run's acceptance, before
these checks: its per-prompt figures are void.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import target_transfer  # noqa: E402
from bench.acceptance_pair import load_results  # noqa: E402
from bench.bench_acceptance import prompts_of  # noqa: E402

NMIN, NMAX = 3, 12


def copyable(prompt: list[int], new: list[int], nmin: int = NMIN, nmax: int = NMAX) -> list[bool]:
    """Per new token: whether prompt lookup (longest earlier suffix match, ``nmin``..``nmax`` tokens, the most
    recent occurrence) predicts it from the text before it."""
    seq, hits = list(prompt), []
    for y in new:
        hits.append(_lookup(seq, nmin, nmax) == y)
        seq.append(y)
    return hits


def _lookup(seq: list[int], nmin: int, nmax: int) -> int | None:
    for n in range(min(nmax, len(seq) - 1), nmin - 1, -1):
        suffix = seq[-n:]
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i : i + n] == suffix:
                return seq[i + n]
    return None


def decode(path: str, prompts: list[list[int]], new: int, batch: int = 32) -> list[list[int]]:
    """The target's greedy continuation of each prompt, ``new`` tokens through any end of sequence (as the
    bench's evaluations, ``--ignore-eos``): the evaluator's loader and the in-process regeneration's batched
    decoder (``regeneration.local.BatchedTarget``, with no end-of-sequence id), fp32 on the CPU."""
    import torch

    from trainer.evaluation.load import load_target_model
    from trainer.regeneration.local import BatchedTarget

    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, "target")
        target_transfer.fetch_target(path, dest)
        target = BatchedTarget(load_target_model(dest, "cpu", torch.float32), set(), pad_id=0)
        return [
            row
            for s in range(0, len(prompts), batch)
            for row, _ in target.generate(prompts[s : s + batch], new)
        ]


def _split(spec: str) -> tuple[str, str]:
    path, _, key = spec.rpartition(":")
    if not path:
        raise SystemExit(f"--results {spec!r}: want FILE:KEY")
    return path, key


def run_prompts(spec: str, n: int) -> list[list[int]]:
    """The first ``n`` prompts the run of ``FILE:KEY`` decoded (``bench_acceptance.prompts_of``)."""
    path, _ = _split(spec)
    return prompts_of(load_results(path), n, f"--results {path}")


def prompt_acceptance(spec: str, prompts: list[list[int]]) -> list[float]:
    """``FILE:KEY`` -> that drafter's acceptance per prompt (its evaluation's ``prompt_accept_len``), refused
    unless its run decoded ``prompts``."""
    path, key = _split(spec)
    run = load_results(path)
    if prompts_of(run, len(prompts), f"--results {path}") != prompts:
        raise SystemExit(f"--results {spec!r}: its run decoded other prompts than the first --results'")
    e = (run.get(key) or {}).get("eval") or {}
    per = e.get("prompt_accept_len")
    if not per or len(per) != len(prompts):
        raise SystemExit(f"--results {spec!r}: no per-prompt acceptance for {len(prompts)} prompts")
    return per


def summary(shares: dict[str, list[float]], accept: dict[str, list[float]]) -> dict:
    """The comparison of the module docstring; the first name is the baseline."""
    names = list(shares)
    pooled = sorted(x for n in names for x in shares[n])
    cuts = [pooled[int(len(pooled) * q)] for q in (0.25, 0.5, 0.75)]
    out: dict = {"cuts": cuts, "targets": {}}
    for n in names:
        s, a = shares[n], accept[n]
        slope, icpt = st.linear_regression(s, a)
        bins = [[x for x, y in zip(a, s, strict=True) if sum(y >= c for c in cuts) == b] for b in range(4)]
        out["targets"][n] = {"mean_share": st.mean(s), "mean_acceptance": st.mean(a),
                             "correlation": st.correlation(s, a), "fit": [icpt, slope],
                             "quartiles": [[len(b), st.mean(b) if b else None] for b in bins]}  # fmt: skip
    base, other = (out["targets"][n]["fit"] for n in names[:2])
    out["ratio_at_mean_share"] = {
        n: (other[0] + other[1] * m) / (base[0] + base[1] * m)
        for n in names[:2]
        for m in [out["targets"][n]["mean_share"]]
    }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", action="append", required=True, help="NAME=DIR (two)")
    p.add_argument("--results", action="append", required=True, help="NAME=FILE:KEY (one or more a target)")
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    targets = dict(t.split("=", 1) for t in a.target if "=" in t)
    runs: dict[str, list[str]] = {}
    for r in a.results:
        name, _, spec = r.partition("=")
        runs.setdefault(name, []).append(spec)
    if len(targets) != 2 or len(a.target) != 2 or set(runs) != set(targets):
        p.error("two --target NAME=DIR, and --results NAME=FILE:KEY for each of them (and no other)")
    prompts = run_prompts(a.results[0].partition("=")[2], a.prompts)
    shares, accept = {}, {}
    for name, path in targets.items():
        new = decode(path, prompts, a.new)
        shares[name] = [sum(copyable(q, o)) / len(o) for q, o in zip(prompts, new, strict=True)]
        per = [prompt_acceptance(s, prompts) for s in runs[name]]
        accept[name] = [st.mean(x) for x in zip(*per, strict=True)]
    out = summary(shares, accept)
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(a), **out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

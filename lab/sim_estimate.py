"""How far the training-time acceptance estimate is from a decoding loop's count, on toy chains (issue 15).

    PYTHONPATH=. python lab/sim_estimate.py            # a few seconds on a CPU

``accept_len_est`` (trainer/drafting/acceptance.py) walks the step's *sampled* anchors as a decoding loop
would; where the next block would start at a position that is not a sampled anchor, it goes on at the next
sampled one, skipping the positions between (often the hard ones right after a rejection). This measures what
that costs against the exact loop on chains with known ground truth: rows of positions in easy and hard
stretches (segments of ``--seg`` positions, easy with probability 0.3), the chain at every position drawn from
one of two models (``indep``: slot k right with probability acc(stretch) x exp(-k/40), fresh for every anchor;
``hard``: hard tokens fail from every anchor), the exact loop run over all positions, and the estimators run
over a random subset of positions at the anchor density of a run (``--max-anchors`` per packed row of
``--token-budget`` tokens): 1/64 is ``bench_acceptance.py`` (256 in 16,384), 1/48 the seeds (1,024 in 49,152).
- ``uniform``: the mean over sampled anchors of chain + 1 (``accept_len_est_uniform``);
- ``walk``: ``decode_walk`` itself (``accept_len_est``) over scattered anchors (``--anchor-run 1``);
- ``runs16``: ``decode_walk`` over the same number of anchors drawn in runs of 16 (``--anchor-run 16``: whole
  groups of 16 consecutive positions, as ``masks.sample_anchors`` draws them);
- ``loo``: each sampled anchor weighted by 1 / (mean chain + 1 of its 2 neighbours on each side, itself left
  out): a candidate with a smaller bias, not used by the trainer.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from trainer.drafting.acceptance import decode_walk


def chains(rng, model: str, bs: int, n: int, seg: int) -> np.ndarray:
    easy = np.repeat(rng.random((n + bs) // seg + 2) < 0.3, seg)[: n + bs]
    decay = np.exp(-np.arange(1, bs) / 40)
    if model == "indep":
        acc = np.where(easy, 0.97, 0.45)
        ok = rng.random((n, bs - 1)) < np.lib.stride_tricks.sliding_window_view(acc[1:], bs - 1)[:n] * decay
    else:
        hard = rng.random(n + bs) < np.where(easy, 0.03, 0.55)
        ok = np.lib.stride_tricks.sliding_window_view(~hard[1:], bs - 1)[:n] & (
            rng.random((n, bs - 1)) < decay * 0.97
        )
    return np.where(ok.all(1), bs - 1, np.argmin(ok, 1))


def exact(c: np.ndarray) -> tuple[int, int]:
    p = tok = steps = 0
    while p < len(c):
        tok, steps, p = tok + c[p] + 1, steps + 1, p + c[p] + 1
    return tok, steps


def loo(L: np.ndarray, w: int = 2) -> tuple[float, float]:
    cs = np.concatenate([[0.0], np.cumsum(L)])
    k = len(L)
    i = np.arange(k)
    lo, hi = np.clip(i - w, 0, k), np.clip(i + w + 1, 0, k)
    n = hi - lo - 1
    m = np.where(n > 0, (cs[hi] - cs[lo] - L) / np.maximum(n, 1), L)
    return float(np.sum(L / m)), float(np.sum(1 / m))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--seg", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    print("model  block density   exact   uniform      walk    runs16       loo")
    for model in ("indep", "hard"):
        for bs in (8, 16, 32):
            for density in (0.5, 0.125, 1 / 48):
                ex, uni, lw = [0, 0], [], [0.0, 0.0]
                anchors, chain, ranchors, rchain = [], [], [], []
                for _ in range(a.rows):
                    c = chains(rng, model, bs, a.positions, a.seg)
                    t, s = exact(c)
                    ex = [ex[0] + t, ex[1] + s]
                    pick = np.sort(rng.choice(len(c), int(len(c) * density), replace=False))
                    anchors.append(pick)
                    chain.append(c[pick])
                    groups = rng.permutation(-(-len(c) // 16))
                    run = np.sort(
                        np.concatenate([np.arange(g * 16, min(g * 16 + 16, len(c))) for g in groups])[
                            : len(pick)
                        ]
                    )
                    ranchors.append(run)
                    rchain.append(c[run])
                    uni.extend(c[pick] + 1)
                    x, y = loo((c[pick] + 1).astype(float))
                    lw = [lw[0] + x, lw[1] + y]
                A = torch.tensor(np.stack(anchors))
                tok, steps = decode_walk(
                    A, torch.tensor(np.stack(chain)), torch.ones_like(A, dtype=torch.bool)
                )
                R = torch.tensor(np.stack(ranchors))
                rtok, rsteps = decode_walk(
                    R, torch.tensor(np.stack(rchain)), torch.ones_like(R, dtype=torch.bool)
                )
                e = ex[0] / ex[1]
                walk, unif, lo_ = float(tok) / float(steps), float(np.mean(uni)), lw[0] / lw[1]
                runs = float(rtok) / float(rsteps)
                print(
                    f"{model:6s} {bs:5d} {density:7.3f} {e:7.2f} {unif / e - 1:+9.1%} {walk / e - 1:+9.1%}"
                    f" {runs / e - 1:+9.1%} {lo_ / e - 1:+9.1%}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

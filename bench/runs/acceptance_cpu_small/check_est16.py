"""Why the CPU bench's block-16 estimate over-reads (issue 15): exact chains, then the estimators replayed.

    PYTHONPATH=. python bench/bench_acceptance.py --small --out OUT --work WORK --train-text generated \
        --gen-chunks 4000 --blocks 16:2 --frozen-steps 50
    PYTHONPATH=. python bench/runs/acceptance_cpu_small/check_est16.py WORK b16 [N]

For three texts, the target's greedy continuation (64 bytes) of: the 16 held-out prompts the real evaluation
decoded (``generated_TAG/out.jsonl``), N held-out chunks' starts (``heldout_gen``), N training chunks' starts
(``data``, what the drafter trained on), the trained drafter's chain (accepted drafted tokens) at every
candidate anchor (the trainer's rule: position p0 - 1 .. len - block), then
- ``decode``: per document the walk from the first decoded token p0, as ``trainer.evaluate`` steps (its verify
  steps are this walk's, check_walk.py; it stops where blocks no longer fit), pooled tokens / steps, its
  standard error by a bootstrap over documents (the steps of one document are not independent), and the spread
  of the same walk over 16 documents drawn at random (what a 16-prompt evaluation reads);
- ``est``: the trainer's estimator replayed: documents packed 21 to a row (4,096-token budget), one
  ``sample_run`` of 32 candidates per row (runs cross document ends: candidates are ranked over the row),
  ``decode_walk`` over it; pooled over many packings (its expectation), and the spread of a 50-row window (the
  step records' running mean);
- ``run_in_doc``: a run of 32 candidates inside one document (start uniform), walked: no crossing;
- ``decode32``: the decode walk from p0 cut after the steps that start in its first 32 positions (the run's
  length, at the start of the text);
- ``decode_from_p0m1``: the decode walk from the first candidate p0 - 1 (the last prompt byte as anchor).
"""

from __future__ import annotations

import glob
import json
import sys

import numpy as np
import torch

from trainer.drafting.acceptance import decode_walk
from trainer.drafting.masks import sample_run
from trainer.evaluation.load import load_drafter_any, load_target_model
from trainer.target.capture import capture, load_target

BUDGET, RUN, WINDOW = 4096, 32, 50


def read(path: str, n: int) -> list[tuple[list[int], int]]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            out.append((r["input_ids"], r["loss_mask"].index(1)))
            if len(out) >= n:
                break
    return out


def doc_chains(drafter, model, tm, cfg, docs, per_pack=4) -> list[np.ndarray]:
    """Per document: the chain at candidates p0 - 1 .. len - bs (index 0 = p0 - 1)."""
    bs = cfg.block_size
    res = []
    for i in range(0, len(docs), per_pack):
        ids, doc, cand, spans = [], [], [], []
        for d, (x, p0) in enumerate(docs[i : i + per_pack]):
            off = len(ids)
            ids += x
            doc += [d] * len(x)
            c = list(range(off + p0 - 1, off + len(x) - bs + 1))
            spans.append((len(cand), len(cand) + len(c)))
            cand += c
        ii, dd, an = torch.tensor([ids]), torch.tensor([doc]), torch.tensor([cand])
        th, _ = capture(tm, ii, dd, cfg.target_layer_ids, True)
        h = drafter(th, ii, dd, an, model.get_input_embeddings(), attn_impl="sdpa")
        pred = model.get_output_embeddings()(h.view(len(cand), bs, -1)[:, 1:]).argmax(-1)
        lab = torch.tensor([[ids[a + 1 + k] for k in range(bs - 1)] for a in cand])
        ch = (pred == lab).long().cumprod(1).sum(1).numpy()
        res += [ch[a:b] for a, b in spans]
    return res


def walk(ch: np.ndarray, start: int, stop_start: int | None = None) -> tuple[int, int]:
    """Decode walk over one document's chains from index ``start``; steps that start at index >= stop_start
    are not taken."""
    a, t, s = start, 0, 0
    end = len(ch) if stop_start is None else min(len(ch), stop_start)
    while a < end:
        t, s, a = t + ch[a] + 1, s + 1, a + ch[a] + 1
    return t, s


def boot(tok: np.ndarray, st: np.ndarray, rng, n=2000) -> float:
    idx = rng.integers(0, len(tok), (n, len(tok)))
    return float(np.std(tok[idx].sum(1) / st[idx].sum(1)))


def estimator(docs, chains, bs, rng, reps) -> tuple[float, float, float]:
    """The trainer's estimator replayed: (pooled tokens/steps, sd of a WINDOW-row window, mean steps/row)."""
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    rows_t, rows_s = [], []
    for _ in range(reps):
        order = rng.permutation(len(docs))
        i = 0
        while i < len(order):
            used, take = 0, []
            while i < len(order) and (not take or used + len(docs[order[i]][0]) <= BUDGET):
                take.append(order[i])
                used += len(docs[order[i]][0])
                i += 1
            did, lm, full = [], [], []
            for d, j in enumerate(take):
                x, p0 = docs[j]
                did += [d] * len(x)
                lm += [0] * p0 + [1] * (len(x) - p0)
                f = np.zeros(len(x), dtype=np.int64)
                f[p0 - 1 : p0 - 1 + len(chains[j])] = chains[j]
                full.append(f)
            full_t = torch.from_numpy(np.concatenate(full))
            an = sample_run(torch.tensor([did]), torch.tensor([lm]), bs, RUN, gen)
            t, s = decode_walk(an, full_t[an.clamp(min=0)], an >= 0)
            rows_t.append(int(t))
            rows_s.append(int(s))
    rt, rs = np.array(rows_t), np.array(rows_s)
    w = rng.integers(0, len(rt), (2000, WINDOW))
    return float(rt.sum() / rs.sum()), float(np.std(rt[w].sum(1) / rs[w].sum(1))), float(rs.mean())


def main() -> None:
    torch.set_grad_enabled(False)
    work, tag = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 400
    ck = sorted(glob.glob(f"{work}/run_{tag}/checkpoints/step_*"))[-1]
    drafter, cfg = load_drafter_any(ck + "/drafter", work + "/target", "cpu", torch.float32)
    drafter.eval()
    model = load_target_model(work + "/target", "cpu", torch.float32)
    tm = load_target(work + "/target", "cpu", torch.float32, cfg.target_layer_ids, need_final_hidden=True)
    bs = cfg.block_size
    sets = {
        "eval16": read(f"{work}/generated_{tag}/out.jsonl", 10**9),
        "heldout_gen": read(f"{work}/heldout_gen/heldout.jsonl", n),
        "train_gen": read(f"{work}/data/train.jsonl", n),
    }
    rng = np.random.default_rng(0)
    out = {"checkpoint": ck, "block_size": bs}
    for name, docs in sets.items():
        ch = doc_chains(drafter, model, tm, cfg, docs)
        dec = np.array([walk(c, 1) for c in ch])  # index 1 = p0, the first decoded token
        d32 = np.array([walk(c, 1, 1 + RUN) for c in ch])
        dm1 = np.array([walk(c, 0) for c in ch])
        sub16 = [rng.choice(len(ch), min(16, len(ch)), replace=False) for _ in range(2000)]
        d16 = [dec[j, 0].sum() / dec[j, 1].sum() for j in sub16]
        rid_t = rid_s = 0
        for _ in range(20 * len(ch)):
            c = ch[int(rng.integers(len(ch)))]
            s0 = int(rng.integers(0, max(1, len(c) - RUN + 1)))
            t, s = walk(c[s0 : s0 + RUN], 0)
            rid_t, rid_s = rid_t + t, rid_s + s
        reps = max(1, 20000 // len(ch))
        est, est_sd, steps_row = estimator(docs, ch, bs, rng, reps)
        r = {
            "docs": len(docs),
            "candidates_per_doc": float(np.mean([len(c) for c in ch])),
            "decode": float(dec[:, 0].sum() / dec[:, 1].sum()),
            "decode_se_boot": boot(dec[:, 0], dec[:, 1], rng),
            "decode_steps": int(dec[:, 1].sum()),
            # what a 16-prompt evaluation would read: the decode walk over 16 of these documents drawn at random
            "decode_16docs_sd": float(np.std([dec[j, 0].sum() / dec[j, 1].sum() for j in sub16])),
            "decode_16docs_p10_p90": [float(np.percentile(d16, q)) for q in (10, 90)],
            "est": est,
            "est_window50_sd": est_sd,
            "est_walk_steps_per_row": steps_row,
            "run_in_doc": rid_t / rid_s,
            "decode32": float(d32[:, 0].sum() / d32[:, 1].sum()),
            "decode_from_p0m1": float(dm1[:, 0].sum() / dm1[:, 1].sum()),
            "uniform": float(1 + np.concatenate(ch).mean()),
        }
        out[name] = r
        print(
            name,
            json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}),
            flush=True,
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""What the trainer's estimate reads on text a drafter has trained on, against text it has not (issue 35: at 4,800
steps, 25 epochs of its text, ``accept_len_est`` read 15-17% over the real acceptance).

A finished drafter (``--drafter``: an export, ``config.json`` + ``model.safetensors``), frozen, is scored by the
trainer's own estimate on three texts of 256-token sequences (128 prompt + 128 completion bytes, as
bench_acceptance.py's own-text rows): every completion position an anchor, so the walk (``dflash_loss``'s
``walk_tokens / walk_steps``, judged by the target's argmax through its soft labels) steps as decoding does:

- ``train``: the first ``--n`` sequences of its training text (``--train-text``: the bench's regenerated
  ``{prompt, completion}`` file);
- ``decoded``: the text its real evaluation decoded (``--decoded``: ``trainer.evaluate --save-outputs`` rows);
- ``fresh``: ``--n`` chunks of the training files that are not training prompts, continued by the target
  (greedy, fp32; ``copy_share.decode``): text like the training text that the drafter never saw.

    PYTHONPATH=. python lab/est_seen.py --target bench/out/dense_target --drafter D/export \\
        --train-text bench/out/regen_dense/regenerated.jsonl --decoded D/generated_b8_dflash

CPU, fp32; ~4 min for 128 sequences of each on 2 cores (the fresh text's decoding included).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import target_transfer  # noqa: E402
from bench.acceptance_target import SEQ as CHUNK  # noqa: E402
from bench.bench_acceptance import PROMPT, chunks, corpus  # noqa: E402
from lab import copy_share  # noqa: E402

SEQ = 2 * PROMPT
RUN = 32  # the trainer's --est-anchors default: one measuring run of 32 consecutive anchors a row
MAX_LINE = 1 << 20


def train_rows(path: str, n: int | None) -> list[tuple[list[int], list[int]]]:
    """The first ``n`` (None: all) full-length (``SEQ`` bytes) ``{prompt, completion}`` rows as (ids, loss mask)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in iter(lambda: f.readline(MAX_LINE), ""):
            r = json.loads(line)
            p, c = list(r["prompt"].encode()), list(r["completion"].encode())
            if len(p) + len(c) == SEQ:
                rows.append((p + c, [0] * len(p) + [1] * len(c)))
            if len(rows) == n:
                break
    return rows


def decoded_rows(folder: str, n: int) -> list[tuple[list[int], list[int]]]:
    """The first ``n`` full-length rows of ``trainer.evaluate --save-outputs`` files (``out*.jsonl``, in order)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "out*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in iter(lambda: f.readline(MAX_LINE), ""):
                r = json.loads(line)
                if len(r["input_ids"]) == SEQ:
                    rows.append((r["input_ids"], r["loss_mask"]))
    return rows[:n]


def fresh_prompts(seen: set[str], n: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``PROMPT`` bytes from chunks of the training files, none a training prompt (``seen``)."""
    train, _, _ = corpus(None)
    out = []
    for c in chunks(train, len(train) // CHUNK, seed):  # every chunk, shuffled
        head = bytes(c[:PROMPT])
        if head.decode("utf-8", "replace") not in seen and len(head) == PROMPT:
            out.append(list(head))
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} fresh prompts in the training files, {n} asked for")


def seen_prompts(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        return {json.loads(x)["prompt"] for x in iter(lambda: f.readline(MAX_LINE), "") if x.strip()}


def fresh_rows(target: str, prompts: list[list[int]]) -> list[tuple[list[int], list[int]]]:
    """Each prompt and the target's greedy continuation of ``PROMPT`` tokens, as (ids, loss mask)."""
    cont = copy_share.decode(target, prompts, PROMPT)
    return [(p + list(r), [0] * len(p) + [1] * len(r)) for p, r in zip(prompts, cont, strict=True)]


def estimate(model, drafter, head, rows, batch: int = 8) -> tuple[float, list[list[int]]]:
    """The trainer's walk (``dflash_loss``, soft labels) over every completion position of ``rows``: (tokens /
    steps, each row's chains: per anchor, the drafted tokens the target's argmax accepts)."""
    import torch

    from trainer.drafting.loss import dflash_loss
    from trainer.target.capture import capture

    layers, bs = list(drafter.cfg.target_layer_ids), drafter.cfg.block_size
    tok = steps = 0
    chains = []
    for s in range(0, len(rows), batch):
        ids = torch.tensor([r[0] for r in rows[s : s + batch]])
        docs = torch.zeros_like(ids)
        anchors = torch.stack([_anchors(r[1], bs) for r in rows[s : s + batch]])
        with torch.no_grad():
            feats, final = capture(model, ids, docs, layers, need_final_hidden=True)
            out = drafter(feats.float(), ids, docs, anchors, head.embed_tokens)
            _, m = dflash_loss(out, head, ids, anchors, 7.0, target_final_hidden=final.float(), n_train=0)
            chains += _chains(head, out, final.float(), anchors)
        tok, steps = tok + int(m["walk_tokens"]), steps + int(m["walk_steps"])
    return tok / steps, chains


def _chains(head, out, final, anchors) -> list[list[int]]:
    """Per row, per real anchor: how many slots from slot 1 on match the target's argmax at the position before."""
    import torch

    pred, want = head.lm_head(out).argmax(-1), head.lm_head(final).argmax(-1)  # (B, A, bs), (B, T)
    rows = []
    for b in range(anchors.shape[0]):
        a = anchors[b][anchors[b] >= 0]
        label = want[b][a.unsqueeze(1) + torch.arange(1, out.shape[2]) - 1]  # slot k: the target at a + k - 1
        rows.append((pred[b, : len(a), 1:] == label).long().cumprod(1).sum(1).tolist())
    return rows


def walk(chain: list[int], lo: int, hi: int) -> tuple[int, int]:
    """(tokens, steps) of a decoding walk over anchors ``lo .. hi - 1``: from ``lo``, each step accepts its chain
    and the bonus token; the last step may reach past ``hi`` (as ``drafting.acceptance.decode_walk``)."""
    p = lo
    tok = steps = 0
    while p < hi:
        tok, steps, p = tok + chain[p] + 1, steps + 1, p + chain[p] + 1
    return tok, steps


def run_walk(chains: list[list[int]], m: int) -> float:
    """The walk over runs of ``m`` consecutive anchors, every run start of every row once (the trainer's
    measuring runs, ``--est-anchors m``, whose start is drawn uniformly), pooled: tokens / steps."""
    done = [walk(c, s, s + m) for c in chains for s in range(max(1, len(c) - m + 1))]
    return sum(t for t, _ in done) / sum(n for _, n in done)


def seen_share(rows, seen_rows, n: int = 32) -> float:
    """The mean share of each row's ``n``-token completion windows found verbatim in ``seen_rows``' completions."""

    def grams(r):  # hashed: ~1.2M windows of the bench's training text (64-bit hashes: no collision to fear)
        c = r[0][r[1].index(1) :]
        return {hash(tuple(c[i : i + n])) for i in range(len(c) - n + 1)}

    seen = set().union(*(grams(r) for r in seen_rows))
    shares = [sum(g in seen for g in grams(r)) / max(1, len(grams(r))) for r in rows]
    return sum(shares) / len(shares)


def _anchors(loss_mask: list[int], bs: int):
    """Every anchor whose predicted positions are completion tokens, from the last prompt token, then -1s."""
    import torch

    first = loss_mask.index(1) - 1
    row = torch.full((SEQ - bs + 1,), -1, dtype=torch.long)
    row[: SEQ - bs + 1 - first] = torch.arange(first, SEQ - bs + 1)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the target: a model directory or bench/out's parts")
    ap.add_argument("--drafter", required=True, help="the drafter's export (config.json + model.safetensors)")
    ap.add_argument(
        "--train-text", required=True, help="its training text: a {prompt, completion} JSONL file"
    )
    ap.add_argument("--decoded", required=True, help="the folder of its evaluation's --save-outputs files")
    ap.add_argument("--n", type=int, default=128, help="sequences of each text")
    ap.add_argument("--seed", type=int, default=99, help="which fresh chunks")
    a = ap.parse_args(argv)
    for path in (a.drafter, a.train_text, a.decoded):
        if not os.path.exists(path):
            raise SystemExit(f"{path}: not found")
    import torch

    from trainer.drafting.head import FrozenHead
    from trainer.model import load_drafter
    from trainer.target.capture import load_target

    torch.set_num_threads(min(4, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, "target")
        target_transfer.fetch_target(a.target, dest)
        drafter, cfg = load_drafter(a.drafter)
        drafter = drafter.float().eval()
        model = load_target(dest, "cpu", torch.float32, list(cfg.target_layer_ids), need_final_hidden=True)
        head = FrozenHead.from_model(model)
        seen = train_rows(a.train_text, None)
        train = seen[: a.n]
        fresh = fresh_rows(a.target, fresh_prompts(seen_prompts(a.train_text), a.n, a.seed))
        out = {}
        for name, rows in (("train", train), ("decoded", decoded_rows(a.decoded, a.n)), ("fresh", fresh)):
            full, chains = estimate(model, drafter, head, rows)
            out[name] = {"sequences": len(rows), "estimate": full, f"runs_{RUN}": run_walk(chains, RUN),
                         "seen_share": seen_share(rows, seen)}  # fmt: skip
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Issue 35's context-back experiment on the CPU: does DFlash 1 trail on the hybrid target because the hybrid's
per-position states do not hold the tokens before them (bench/README.md, the ``--back`` probes)?

On one stored target (``--target``: bench/out's parts) two DFlash 1 drafters train side by side on the same
batches, anchors and initial weights: the plain one and the context-back one of back N (``fc`` also reads the N
positions before each context position; ``lab.context_back.drafter``). Not the trainer's loop but its
parts: ``DFlashDrafter``, ``sample_anchors``, ``dflash_loss`` with the target's soft labels, AdamW with
``schedule.lr_at``, gradient clipping at 1. The target's states (the default layers) and final hidden states are
captured once, for the first ``--rows`` sequences of the target's own regenerated text (``--train-text``), and
kept in bf16. Each drafter is then scored by the trainer's walk (``lab/est_seen.py``'s ``estimate``, every
completion position an anchor: it read the GPU evaluation's real value within 1% on text the drafter had not
seen) on the bench's held-out evaluation prompts (``--seed``'s, as bench_acceptance.py draws them from this
machine's corpus: the standard library of the Python running it, so a GPU image's other Python draws other
prompts) continued greedily by the same target: the text a real evaluation decodes. Printed: each drafter's
walk, its conditional acceptance per slot (over every anchor), each prompt's walk, and the context-back
drafter's ratio to the plain one, paired by prompt (``report.paired_ratio``, 95% interval). ``--compare A B`` pairs two runs' drafters (two
targets, the same prompts) by prompt. ``--decode-with`` another target (and that target's ``--train-text``) trains
and walks a drafter on one target's states over the other target's text: states and text apart.

    PYTHONPATH=. python lab/context_back/context_back_cpu.py --target bench/out/hybrid_target \\
        --train-text bench/out/regen/regenerated.jsonl --out hybrid.json
    PYTHONPATH=. python lab/context_back/context_back_cpu.py --compare dense.json hybrid.json

A smaller schedule than the GPU rows' (``--steps`` of ``--batch`` sequences with ``--anchors-per-seq`` anchors each;
the GPU rows: 64 sequences of 4 anchors a step, 256 anchors in one packed row of 16,384 tokens), so its figures
compare drafters within this script, not with the GPU rows. CPU, fp32 compute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench import target_transfer  # noqa: E402
from bench.acceptance_target import MASK  # noqa: E402
from bench.bench_acceptance import PROMPT, heldout_prompts, local_corpus_id  # noqa: E402
from lab import copy_share, est_seen  # noqa: E402

BLOCK, LAYERS, GAMMA, LR, WARMUP, WD, CLIP = 8, 2, 7.0, 1e-3, 0.04, 0.01, 1.0


def cache_states(model, rows, layers: list[int], batch: int = 16):
    """The target's states at ``layers`` and its final hidden states for ``rows`` (ids, loss mask): bf16 tensors
    (N, T, n H) and (N, T, H), and the ids and masks (N, T)."""
    import torch

    from trainer.target.capture import capture

    ids = torch.tensor([r[0] for r in rows])
    mask = torch.tensor([r[1] for r in rows])
    feats = finals = None  # allocated once the first batch gives their widths: no second copy at the end
    for s in range(0, len(rows), batch):
        x = ids[s : s + batch]
        with torch.no_grad():
            f, fin = capture(model, x, torch.zeros_like(x), layers, need_final_hidden=True)
        if feats is None:
            feats = torch.empty((*ids.shape, f.shape[-1]), dtype=torch.bfloat16)
            finals = torch.empty((*ids.shape, fin.shape[-1]), dtype=torch.bfloat16)
        feats[s : s + len(x)] = f
        finals[s : s + len(x)] = fin
    return feats, finals, ids, mask


def make_drafters(target_dir: str, back: int, window: int | None = None):
    """The plain DFlash 1 drafter and the context-back one (``ContextBackDrafter``), the layers' weights alike (fc
    differs in width); with ``back`` 0 the plain one alone; with ``window`` every draft layer a sliding one of
    that window."""
    import torch
    from transformers import AutoConfig

    from lab.context_back.drafter import ContextBackDrafter
    from trainer.drafting.config import DraftConfig
    from trainer.model import DFlashDrafter

    tc = AutoConfig.from_pretrained(target_dir)
    cfg = DraftConfig.from_target_config(
        tc,
        num_draft_layers=LAYERS,
        block_size=BLOCK,
        mask_token_id=MASK,
        layer_types=["sliding_attention"] * LAYERS if window else None,
        sliding_window=window,
    )
    torch.manual_seed(0)
    plain = DFlashDrafter(cfg).float().train()
    if not back:
        return [plain]
    wide = ContextBackDrafter(cfg, back).float().train()
    out = [plain, wide]
    own = {k: v for k, v in plain.state_dict().items() if not k.startswith("fc.")}
    wide.load_state_dict(own, strict=False)
    with torch.no_grad():  # the context-back fc starts as the plain one on the position's own features
        wide.fc.weight.zero_()
        wide.fc.weight[:, : plain.fc.in_features].copy_(plain.fc.weight)
    return out


def train(
    drafters, head, cache, steps: int, batch: int, seed: int, log, per_seq: int = 4
) -> list[list[float]]:
    """Every drafter on the same batches and anchors; their losses per step."""
    import torch

    from trainer.drafting.loss import dflash_loss
    from trainer.drafting.masks import sample_anchors
    from trainer.run.schedule import lr_at

    feats, finals, ids, mask = cache
    opts = [torch.optim.AdamW(d.parameters(), lr=LR, weight_decay=WD) for d in drafters]
    g = torch.Generator().manual_seed(seed)
    losses: list[list[float]] = [[] for _ in drafters]
    t0 = time.monotonic()
    for step in range(steps):
        pick = torch.randint(0, ids.shape[0], (batch,), generator=g)
        x, m, docs = ids[pick], mask[pick], torch.zeros(batch, ids.shape[1], dtype=torch.long)
        anchors = sample_anchors(docs, m, BLOCK, per_seq, generator=g)
        f, fin = feats[pick].float(), finals[pick].float()
        lr = lr_at(step, base_lr=LR, total_steps=steps, warmup_ratio=WARMUP)
        for d, opt, out in zip(drafters, opts, losses, strict=True):
            loss, _ = dflash_loss(d(f, x, docs, anchors, head.embed_tokens), head, x, anchors, GAMMA,
                                  target_final_hidden=fin)  # fmt: skip
            loss.backward()
            torch.nn.utils.clip_grad_norm_(d.parameters(), CLIP)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(float(loss.detach()))
        if (step + 1) % 100 == 0:
            means = [sum(x[-100:]) / 100 for x in losses]
            log(
                f"step {step + 1}/{steps} loss {' '.join(f'{v:.3f}' for v in means)} ({time.monotonic() - t0:.0f}s)"
            )
    return losses


def per_slot(chains: list[list[int]]) -> list[float]:
    """Conditional acceptance of slots 1 .. BLOCK - 1 over every anchor: P(chain >= k | chain >= k - 1)."""
    flat = [c for row in chains for c in row]
    reach = [sum(c >= k for c in flat) for k in range(BLOCK)]
    return [reach[k] / reach[k - 1] if reach[k - 1] else 0.0 for k in range(1, BLOCK)]


def prompt_report(chains: list[list[int]]) -> dict:
    """Per prompt, the decoding walk over all its completion anchors (``est_seen.walk``), as ``trainer.evaluate``
    reports prompts: what ``report.paired_ratio`` pairs."""
    done = [est_seen.walk(c, 0, len(c)) for c in chains]
    return {
        "prompts": len(done),
        "prompt_steps": [n for _, n in done],
        "prompt_accept_len": [t / n for t, n in done],
    }


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def compare(path_a: str, path_b: str) -> dict:
    """Two runs' drafters (two targets, or one target's drafters trained in two runs; the same prompts): each of
    B's over each of A's, paired by prompt."""
    from trainer.evaluation.report import paired_ratio

    a, b = (_load(p) for p in (path_a, path_b))
    if a["args"]["seed"] != b["args"]["seed"] or a["args"]["prompts"] != b["args"]["prompts"]:
        raise SystemExit("the two runs decoded other prompts (--seed / --prompts differ)")
    # runs made before 2026-12-05 do not record their corpus: all of them ran on one machine
    ca, cb = (r.get("corpus", {}).get("sha256") for r in (a, b))
    if ca and cb and ca != cb:
        raise SystemExit("the two runs decoded other prompts (their corpora, two Pythons' stdlibs, differ)")

    def names(run: dict) -> list[str]:
        return [k for k in run if k == "plain" or k.startswith("context_back_")]

    return {f"{x}_over_{y}": paired_ratio(a[y], b[x]) for x in names(b) for y in names(a)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", help="the target: a model directory or bench/out's parts")
    ap.add_argument("--train-text", help="the target's regenerated {prompt, completion} JSONL")
    ap.add_argument(
        "--back", type=int, default=2, help="the context-back drafter's N (0: the plain one alone)"
    )
    ap.add_argument("--rows", type=int, default=3000, help="training sequences cached (256 tokens each)")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=16, help="sequences a step")
    ap.add_argument(
        "--context-back-only",
        action="store_true",
        help="train the context-back drafter alone (--compare pairs it)",
    )
    ap.add_argument("--anchors-per-seq", type=int, default=4, help="anchors a sequence (the GPU rows': 4)")
    ap.add_argument(
        "--prompts", type=int, default=128, help="held-out evaluation prompts, decoded by the target"
    )
    ap.add_argument(
        "--decode-with",
        default=None,
        help="the target whose greedy continuation of the prompts is walked (default --target): with the other "
        "target's --train-text too, its text with this target's states",
    )
    ap.add_argument(
        "--window",
        type=int,
        default=None,
        help="every draft layer a sliding one of this window: slot k sees the context within it of a + k",
    )
    ap.add_argument("--seed", type=int, default=1, help="bench_acceptance.py's --seed: which prompts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--compare", nargs=2, metavar=("A", "B"), help="two runs' --out files: B over A, and stop"
    )
    a = ap.parse_args(argv)
    if a.compare:
        print(json.dumps(compare(*a.compare), indent=1))
        return 0
    if not (a.target and a.train_text):
        ap.error("--target and --train-text (or --compare A B)")
    if a.context_back_only and not a.back:
        ap.error("--context-back-only needs --back N > 0")
    if not os.path.exists(a.train_text):
        raise SystemExit(f"{a.train_text}: not found")
    import torch

    from trainer.drafting.head import FrozenHead
    from trainer.evaluation.report import paired_ratio
    from trainer.target.capture import load_target

    torch.set_num_threads(a.threads)
    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, "target")
        target_transfer.fetch_target(a.target, dest)
        drafters = make_drafters(dest, a.back, a.window)
        names = ["plain", f"context_back_{a.back}"][: len(drafters)]
        # alone, it trains on the same batches and anchors (drawn whatever trains): it pairs with a --back 0 run
        if a.context_back_only:
            drafters, names = drafters[1:], names[1:]
        layers = list(drafters[0].cfg.target_layer_ids)
        model = load_target(dest, "cpu", torch.float32, layers, need_final_hidden=True)
        head = FrozenHead.from_model(model)
        rows = est_seen.train_rows(a.train_text, a.rows)
        cache = cache_states(model, rows, layers)
        log(f"cached {len(rows)} sequences at layers {layers}")
        losses = train(drafters, head, cache, a.steps, a.batch, a.seed, log, a.anchors_per_seq)
        prompts = heldout_prompts(a.prompts, a.seed)
        cont = copy_share.decode(a.decode_with or a.target, prompts, PROMPT)
        text = [(p + list(r), [0] * len(p) + [1] * len(r)) for p, r in zip(prompts, cont, strict=True)]
        log(f"decoded {len(text)} held-out prompts")
        res = {}
        for name, d in zip(names, drafters, strict=True):
            walk, chains = est_seen.estimate(model, d.eval(), head, text)
            res[name] = {"walk": walk, "per_slot": per_slot(chains), **prompt_report(chains)}
        for name, curve in zip(names, losses, strict=True):
            res[name]["loss_per_100"] = [
                sum(curve[i : i + 100]) / len(curve[i : i + 100]) for i in range(0, len(curve), 100)
            ]
        if len(drafters) == 2:
            res["ratio"] = paired_ratio(res["plain"], res[f"context_back_{a.back}"])
        log("done")
    out = {"args": vars(a), "corpus": local_corpus_id(), "layers": layers, **res}
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

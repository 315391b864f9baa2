"""speculators (``speculators==0.9.0``, DFlash) on the bench's offline features (vLLM's hidden-states layout):
``speculators train`` in its venv, forced onto the CPU by ``speculators_launch.py`` (its patches), then its
checkpoint read into z-lab's layout (``speculators_convert.py``) for both evaluators.

Matched to ours with soft labels: every draft layer full attention, bidirectional within its block
(``--full-attention-indices``: its DFlash default is sliding-window layers, causal within the block); ``--loss-fn kl_div`` (forward KL to the verifier's distribution, which it
computes from the verifier's last hidden state and lm_head, as ours does with ``--use-soft-labels``), 2 draft
layers, block 8, the same target layers (its ids = z-lab's + 1), mask token, ``fixed-exp-decay`` position weights
with gamma 7 (its DFlash default is D-PACE), the same anchors a packed step (``--max-anchors``, sequences packed
to ``--total-seq-len`` = our token budget), AdamW at the same learning rate, warm-up ratio and cosine schedule.
CPU: fp32 (``--hidden-states-dtype float32``), ``--loss-implementation eager`` (the fused loss is a CUDA
kernel), ``--draft-attn-impl sdpa``; GPU: bf16, ``simple_flex_attention``, the fused loss."""

from __future__ import annotations

import os

from bench.peers import install, launch


def argv(work: str, s: dict) -> list[str]:
    gpu = s["device"] != "cpu"
    return [
        "train", "--speculator-type", "dflash", "--verifier-name-or-path", os.path.join(work, "target"),
        "--data-path", os.path.join(work, "features_speculators"), "--save-path", os.path.join(work, "run_speculators"),
        "--num-layers", str(s["layers"]), "--block-size", str(s["block"]), "--mask-token-id", str(s["mask"]),
        "--target-layer-ids", *[str(i + 1) for i in s["layer_ids"]],
        "--full-attention-indices", *[str(i) for i in range(s["layers"])],
        "--draft-attn-impl", "simple_flex_attention" if gpu else "sdpa",
        "--loss-implementation", "fused" if gpu else "eager", "--loss-fn", "kl_div",
        "--hidden-states-dtype", "bfloat16" if gpu else "float32",
        "--total-seq-len", str(s["tokens"]), "--max-anchors", str(s["anchors"]), "--train-data-ratio", "0.999",
        "--num-workers", "0", "--prefetch-factor", "1", "--lr", str(s["lr"]), "--scheduler-type", "cosine",
        "--scheduler-warmup-ratio", str(s["warmup"]), "--epochs", str(epochs(s)), "--max-steps", str(s["steps"]),
        "--dflash-decay-gamma", str(s["gamma"]), "--per-position-loss-weight", "fixed-exp-decay",
        "--log-freq", str(s["log_every"]), "--checkpoint-freq", "1000000", "--seed", str(s["seed"]),
        "--no-resume-from-checkpoint", "--logger", "",
    ]  # fmt: skip


def epochs(s: dict) -> int:
    """Its epochs for ``--max-steps`` steps: it caps the steps of each epoch but goes on through every epoch
    asked for (each then empty, with its validation), so the epochs are the ones the steps need, one more."""
    per_epoch = max(1, int(s["chunks"] * 0.999) * s["seq"] // s["tokens"])
    return -(-s["steps"] // per_epoch) + 1


def env(s: dict) -> dict:
    e = dict(os.environ)
    e.pop("PYTHONPATH", None)
    e["OMP_NUM_THREADS"] = str(s["threads"])
    if s["device"] == "cpu":
        e["CUDA_VISIBLE_DEVICES"] = ""
        e["BENCH_PEERS_FORCE_CPU"] = "1"
    return e


def train(work: str, out: str, s: dict) -> dict:
    cmd = [install.python("speculators"), os.path.join(os.path.dirname(__file__), "speculators_launch.py"),
           *argv(work, s)]  # fmt: skip
    return launch.run(cmd, os.path.join(out, "train_speculators.log"), env=env(s), cwd=work)


def export(work: str, out: str, s: dict) -> tuple[dict, str]:
    """Its final checkpoint in z-lab's layout (``work/export_speculators``), converted in its venv."""
    run_dir = os.path.join(work, "run_speculators")
    nums = [d for d in os.listdir(run_dir) if d.isdigit()] if os.path.isdir(run_dir) else []
    if not nums:
        raise SystemExit(f"speculators: no checkpoint under {run_dir}")
    cands = [
        os.path.join(run_dir, max(nums, key=int), "config.json")
    ]  # its last epoch's (not checkpoint_best)
    dest = os.path.join(work, "export_speculators")
    cmd = [install.python("speculators"), os.path.join(os.path.dirname(__file__), "speculators_convert.py"),
           os.path.dirname(cands[-1]), dest, os.path.join(work, "target")]  # fmt: skip
    r = launch.run(cmd, os.path.join(out, "export_speculators.log"), env=env(s), cwd=work)
    return r, dest


def dataset(work: str, out: str) -> None:
    """The training chunks as its ``datasets`` table (speculators_dataset.py, in its venv)."""
    cmd = [install.python("speculators"), os.path.join(os.path.dirname(__file__), "speculators_dataset.py"),
           os.path.join(work, "data", "train.jsonl"), os.path.join(work, "features_speculators")]  # fmt: skip
    r = launch.run(cmd, os.path.join(out, "dataset_speculators.log"))
    if r["rc"] != 0:
        raise SystemExit(f"speculators dataset: rc {r['rc']}, see {out}/dataset_speculators.log")

"""bench_acceptance.py's command line (the phases' settings; bench_acceptance.settle checks them)."""

from __future__ import annotations

import argparse

from bench.acceptance_specs import DEFAULT_WINDOW
from bench.acceptance_target import SHAPES, TARGET_ARCHS
from trainer.run.flags import build_parser as trainer_parser  # (the trainer's own defaults)


def _run_flags(ap) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--small", action="store_true", help="a small CPU configuration (SMALL)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--drafter-seed",
        type=int,
        default=None,
        help="the drafters' training seed (their initialisation and data order; default --seed): the same "
        "drafters trained again on the same text, target and prompts, so that bench/acceptance_pair.py against "
        "the --seed run gives the spread of training itself",
    )
    ap.add_argument(
        "--parallel", action="store_true", help="train all drafters at once, then evaluate all at once"
    )


def _target_flags(ap) -> None:
    g = ap.add_argument_group("target (bench/acceptance_target.py)")
    g.add_argument(
        "--target-arch",
        choices=TARGET_ARCHS,
        default="qwen3",
        help="qwen3: the dense byte-level Qwen3; qwen3_5: the hybrid Qwen3.5-family text model (2 x (3 Gated "
        "DeltaNet + 1 gated attention), hidden 384), trained through transformers' PyTorch path",
    )
    g.add_argument(
        "--target-shape",
        choices=SHAPES,
        default=None,
        help="d512: hidden 512, 8 layers (qwen3's default); h384: hidden 384, 8 layers, MLP 1152 (qwen3_5's; "
        "with --target-arch qwen3 the dense target of the hybrid's width, depth and training)",
    )
    g.add_argument(
        "--target-steps", type=int, default=None, help="the target's steps (default 1200; tiny 60)"
    )
    g.add_argument(
        "--save-target",
        default=None,
        metavar="DIR",
        help="also write the trained target to DIR as target.tar.partNN pieces of 15 MiB (what a device "
        "call returns); --target-from DIR in a later call reads them (bench/target_transfer.py)",
    )
    g.add_argument(
        "--target-from",
        default=None,
        metavar="DIR",
        help="take the target trained by an earlier run (its directory, or --save-target's parts) instead of "
        "training one; refused unless its arch, shape, size and corpus are this run's",
    )
    g.add_argument(
        "--stop-after",
        choices=("target",),
        default=None,
        help="target: stop once the target is trained and saved",
    )


def _drafter_flags(ap) -> None:
    ap.add_argument(
        "--blocks",
        default="8:2,16:3",
        help="block:layers[:arch[:pattern[:window]]],... (arch dflash, dflash2, or dflash2ug: dflash2 with "
        "--selector-unary-grad; pattern: one S (sliding) or F (full) a draft layer, e.g. 16:5:dflash:SSSSF, "
        f"window default {DEFAULT_WINDOW}; e.g. 8:2:dflash,8:2:dflash2 compares DFlash 1 and 2 with the same "
        "data, steps, learning rate and block size; arch@fp8, e.g. 8:2:dflash@fp8: trained on the FP8 target's "
        "hidden states, beside its bf16-captured twin 8:2:dflash, both also evaluated against the FP8 target: "
        "bench/acceptance_fp8.py)",
    )
    ap.add_argument(
        "--fp8-serve",
        choices=("pairs", "all"),
        default="pairs",
        help="which drafters are also evaluated against the FP8 target (trainer.evaluate --target-dtype fp8): "
        "those of an @fp8 capture pair (default), or all",
    )
    ap.add_argument(
        "--fp8-scales",
        choices=("block", "row"),
        default="block",
        help="the FP8 target's scaling for @fp8 capture and FP8 serving (the trainer's and trainer.evaluate's "
        "--fp8-scales): block (the checkpoint's own 128 x 128 scales; cuBLAS's block-scaled matmul where K / 128 "
        "is a multiple of 4, else, as at every h384 projection, emulated: the activations rounded as it would "
        "round them, times the dequantised weights) or row (one scale per weight row and per token, the "
        "rowwise-scaled matmul at every shape that is a multiple of 16, h384's included)",
    )
    ap.add_argument(
        "--drafter-steps", type=int, default=None, help="optimizer steps per drafter (default: 400; tiny 20)"
    )
    ap.add_argument(
        "--hard-labels", action="store_true", help="train on the data tokens (default: --use-soft-labels)"
    )
    ap.add_argument(
        "--anchor-run",
        type=int,
        default=1,
        help="the trainer's --anchor-run for training the drafters (1: scattered anchors, as the references; "
        "runs cost acceptance: docs/evaluate.md)",
    )
    ap.add_argument(
        "--est-anchors",
        type=int,
        default=trainer_parser().get_default("est_anchors"),
        help="the trainer's --est-anchors for every run (measuring blocks: one run of M consecutive anchors per "
        "row beside the training ones, read by accept_len_est; 0: the walk over the training anchors)",
    )
    ap.add_argument(
        "--est-holdout",
        type=int,
        default=0,
        help="the trainer's --est-holdout for every drafter: N training sequences held out, where accept_len_est "
        "is measured (0: off, the estimate reads text the drafter trains on)",
    )


def _eval_flags(ap) -> None:
    ap.add_argument(
        "--eval-prompts",
        type=int,
        default=None,
        help="held-out prompts per evaluation (default: 32; small 16; tiny 4). The prompt, not the verify step, "
        "is what varies: a 16-prompt CPU evaluation read 3.62 where 464 prompts read 4.76 (docs/evaluate.md)",
    )
    ap.add_argument(
        "--eval-shards",
        type=int,
        default=1,
        help="run each evaluation as N processes side by side on consecutive slices of its prompts, pooled "
        "(report.pool): 128 prompts in the time of 32 on a GPU that one small-target evaluation leaves idle",
    )
    ap.add_argument(
        "--acceptance-only",
        action="store_true",
        help="evaluate acceptance alone (trainer.evaluate --no-baseline): no target-only decode, so no speedup "
        "and no greedy check, in about a third of the time (many prompts, to narrow an interval)",
    )
    ap.add_argument(
        "--speed-prompts",
        type=int,
        default=None,
        help="after a group's evaluations, each drafter once more on its first N held-out prompts in one process "
        "alone (nothing else on the device): the decode speeds without the shards' shared load ('speed_alone'; "
        "default 8 on a GPU, 0 (none) on the CPU)",
    )
    ap.add_argument(
        "--prompt-sets",
        default="",
        help="more evaluations of every drafter: set:len,... (set heldout or "
        "train (chunks of the training files); len: prompt bytes); the main one is heldout:128",
    )
    ap.add_argument(
        "--frozen-anchor-run",
        type=int,
        default=16,
        help="--anchor-run of the frozen passes (16: runs, where the estimate's walk steps as decoding does)",
    )
    ap.add_argument(
        "--frozen-steps",
        type=int,
        default=0,
        help="after the evaluations, each drafter's estimate with frozen weights over N steps of the "
        "training chunks and of held-out chunks (0: none; at most 50, the running mean's window)",
    )


def _text_flags(ap) -> None:
    ap.add_argument(
        "--train-text",
        choices=("data", "generated", "compare"),
        default="data",
        help="what the drafters train on: the training chunks (data), or the target's own greedy continuation "
        "of their first 128 bytes (generated: the usual recipe, responses regenerated by the target through "
        "trainer.regenerate; the loss on what the target wrote), or both of the same prompts side by side "
        "(compare: each --blocks drafter on the original next bytes and on the target's, paired on the "
        "evaluation's prompts)",
    )
    ap.add_argument(
        "--regen-batch",
        type=int,
        default=None,
        help="trainer.regenerate --batch-size (default: 1024 on a GPU, 64 on the CPU; one H200: 15.6K tok/s at 256, "
        "25.8K at 512, the step time bound by the host, not the GPU)",
    )
    ap.add_argument(
        "--regen-from",
        default=None,
        metavar="FILE",
        help="--train-text generated/compare: an earlier run's regenerated.jsonl (work/regen/, with its "
        ".meta.json) instead of regenerating; refused unless it came from this target and holds this run's "
        "prompts in order (bench/regen_reuse.py)",
    )
    ap.add_argument(
        "--gen-chunks",
        type=int,
        default=None,
        help="--train-text generated/compare: how many prompts (default: chunks / 2)",
    )
    ap.add_argument(
        "--gen-tokens",
        type=int,
        default=None,
        help="--train-text generated: bytes the target writes after each prompt (default: the evaluation's new "
        "tokens, so that the training text is the kind the evaluation decodes; a weak target's greedy text "
        "falls into loops further on, which drafters learn well: 384 bytes made the CPU estimate read 2x real)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/bench_acceptance.py")
    for add in (_run_flags, _target_flags, _drafter_flags, _eval_flags, _text_flags):
        add(ap)
    return ap

"""Command-line flags of ``python -m trainer.pipeline``: the parser, the resolvable settings' table, devices.

Everything here is cheap (no torch): bad or inconsistent flags fail before any model is loaded.
``FlagError`` carries the flag it is about; ``pipeline.main`` prints ``error: --flag: message`` and
exits with status 2. The parsed flags become the run's settings (``trainer.run.settings.resolve``): the
flags of ``RESOLVABLE`` are parsed with default None and resolved there (the resumed checkpoint's value,
else the table's default). Checks that need torch (does CUDA index 7 exist?) are in ``check_devices``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.run import fp8_config
from trainer.run.families import FLA_PACKAGE, HYBRID_MODEL_TYPES

# Periodic saves by time are on by default: a kill by the kernel (OOM, a reboot) loses at most this much
# training. A drafter checkpoint takes seconds, so the cost is small.
SAVE_EVERY_MINUTES = 15.0
# Hybrid linear-attention targets whose packed rows are captured per document (trainer/target/hybrid.py);
# their drafter defaults differ (``Resolvable.hybrid``). Other targets with linear-attention layers
# (Qwen3-Next) are refused unless every row holds one document.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
ARCHS = ("dflash", "dflash2")
# --labels and --divergence (trainer/drafting/loss.py OBJECTIVES: the loss's names for them)
LABELS = ("data", "target-argmax", "target-dist")
DIVERGENCES = ("kl", "reverse-kl", "jsd", "tv")
TOKENIZER_MASK = "the tokenizer's mask token"  # a default: the target tokenizer's mask token id, if any


@dataclass(frozen=True)
class Resolvable:
    """A drafter setting whose flag is parsed with default None and resolved (``settings.resolve``): as
    given; else, on a resume, the checkpoint's drafter config.json value (``saved``; a run restarts with the
    settings it was launched with); else its default: ``dflash2`` under ``--arch dflash2`` where it differs,
    ``hybrid`` for Qwen3.5/3.6 targets, else ``default``. ``only``: the one architecture that has it
    (inherited only then; refused on the other)."""

    name: str  # the settings field, the argparse dest
    flag: str
    default: Any
    hybrid: Any
    saved: Callable[[dict], Any]  # the value in a checkpoint's drafter config.json (None: not there)
    dflash2: Any = None
    only: str | None = None

    def default_for(self, arch: str, hybrid: bool, tokenizer_mask: int | None) -> Any:
        v = self.hybrid if hybrid else self.default
        if arch == "dflash2" and self.dflash2 is not None:
            v = self.dflash2
        return tokenizer_mask if v is TOKENIZER_MASK else v


def _saved_int(read: Callable[[dict], Any]) -> Callable[[dict], int | None]:
    def saved(config: dict) -> int | None:
        v = read(config)
        return None if v is None else int(v)

    return saved


def _dflash(name: str) -> Callable[[dict], int | None]:
    return _saved_int(lambda c: (c.get("dflash_config") or {}).get(name))


def _saved_arch(config: dict) -> str:
    return "dflash2" if "DFlash2DraftModel" in (config.get("architectures") or []) else "dflash"


# The resolvable settings, in resolution order (--arch first: the others' defaults depend on it). The DFlash 2
# fields' None is the published default, which DraftConfig fills (trainer/drafting/config.py
# DFLASH2_DEFAULTS); a None mask token id is the target's last vocab id.
RESOLVABLE = (
    Resolvable("arch", "--arch", "dflash", "dflash", _saved_arch),
    Resolvable(
        "block_size",
        "--block-size",
        16,
        16,
        _saved_int(lambda c: c.get("block_size", (c.get("dflash_config") or {}).get("block_size"))),
        dflash2=8,  # the published DFlash 2 default
    ),
    Resolvable(
        "num_draft_layers", "--num-draft-layers", 1, 5, _saved_int(lambda c: c.get("num_hidden_layers"))
    ),
    Resolvable("mask_token_id", "--mask-token-id", None, TOKENIZER_MASK, _dflash("mask_token_id")),
    *(
        Resolvable(name, "--" + name.replace("_", "-"), None, None, _dflash(name), only="dflash2")
        for name in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    ),
)


class FlagError(ValueError):
    """A bad flag value; ``flag`` is the option as typed (``--drafter-gpus``)."""

    def __init__(self, flag: str, message: str):
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse names the flag itself; keep its text, exit 2
        self.print_usage()
        self.exit(2, f"error: {message}\n")


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


def _est_anchors(text: str) -> int:
    v = int(text)
    if v < 0 or v == 1:
        raise argparse.ArgumentTypeError(
            f"must be 0 (off) or >= 2 (one run of that many consecutive anchors per row), got {text!r}"
        )
    return v


def finite_float(text: str) -> float:
    """A float flag's value: NaN and +-inf are refused (argparse names the flag, exit 2)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def _nonneg_float(text: str) -> float:
    v = finite_float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


TRACKERS = ("tensorboard", "wandb", "mlflow")  # --report-to (trainer/tracking/, docs/trainer.md)


def report_to(text: str) -> tuple[str, ...]:
    """``--report-to``: a comma-separated subset of ``TRACKERS`` (``none``: no tracker), in that order."""
    names = {x.strip().lower() for x in text.split(",") if x.strip()} - {"none"}
    bad = sorted(names - set(TRACKERS))
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown tracker {', '.join(map(repr, bad))}: choose from {', '.join(TRACKERS)} (comma-separated) or none"
        )
    return tuple(t for t in TRACKERS if t in names)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m trainer.pipeline",
        description="Train a DFlash drafter against a frozen target model.",
    )
    g = p.add_argument_group("paths")
    g.add_argument(
        "--target-model", required=True, help="local directory of the target (transformers layout)"
    )
    g.add_argument(
        "--target-dtype",
        choices=("bf16", "fp8"),
        default=None,
        help="the target's projections: fp8 (block-128 e4m3, Hopper; an FP8 checkpoint read as stored, a bf16 "
        "one quantised on load) or bf16 (an FP8 checkpoint dequantised); default fp8 for an FP8 checkpoint, "
        "else bf16 (docs/trainer.md)",
    )
    g.add_argument(
        "--fp8-scales",
        choices=("block", "row"),
        default=None,
        help="an FP8 target's scales: block (128 x 128 weight blocks, 1 x 128 activation groups: the FP8 "
        "checkpoint's and the servers' layout; default) or row (one scale per weight row and per token: a faster "
        "matmul; a block checkpoint requantised per row on load); FP8 targets only (docs/trainer.md)",
    )
    g.add_argument("--data-dir", required=True, help="directory of tokenized *.jsonl files (docs/trainer.md)")
    g.add_argument("--output-dir", required=True, help="the run directory (docs/run-directory.md)")
    g = p.add_argument_group("devices")
    g.add_argument(
        "--target-gpus",
        default="0",
        help="comma-separated CUDA indices or 'cpu' (repeat 'cpu' for several CPU workers; default 0)",
    )
    g.add_argument(
        "--drafter-gpus",
        default="0",
        help="comma-separated CUDA indices or 'cpu' (repeat 'cpu' for several CPU workers; default 0)",
    )
    g.add_argument(
        "--launch",
        choices=("auto", "single", "multi", "torchrun"),
        default="auto",
        help="single: one process (target threads + drafter); multi: a launcher and one worker process "
        "per device (torch.distributed); torchrun: the launcher only, workers started by torchrun "
        "(docs/trainer.md); auto: single when the roles share a device, else multi",
    )
    g.add_argument(
        "--control-host",
        default="127.0.0.1",
        help="address the launcher's control socket listens on (torchrun across nodes: a reachable one)",
    )
    g.add_argument("--control-port", type=_nonneg_int, default=0, help="its port (0: any free port)")
    g.add_argument("--nnodes", type=_positive_int, default=1, help="nodes of a --launch torchrun run")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=_positive_int, default=1)
    g.add_argument(
        "--max-steps",
        type=_positive_int,
        default=None,
        help="train at most N optimizer steps; the schedule spans min(N, steps in --epochs)",
    )
    g.add_argument("--lr", type=finite_float, default=6e-4)
    g.add_argument("--warmup-ratio", type=finite_float, default=0.04)
    g.add_argument("--weight-decay", type=finite_float, default=0.01)
    g.add_argument("--grad-accum", type=_positive_int, default=1)
    g.add_argument("--grad-clip", type=finite_float, default=1.0, help="max grad norm; 0 disables clipping")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("data packing")
    g.add_argument("--token-budget", type=_positive_int, default=16384, help="max tokens per micro-batch")
    g.add_argument("--max-seq-len", type=_positive_int, default=4096, help="longer sequences are truncated")
    g.add_argument("--max-batch-size", type=_positive_int, default=64, help="max sequences per micro-batch")
    g = p.add_argument_group("drafter")
    g.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="DFlash block (default 16; --arch dflash2: 8; resuming: the checkpoint's)",
    )
    g.add_argument(
        "--max-anchors", type=_positive_int, default=512, help="max anchors (blocks) per packed row"
    )
    g.add_argument(
        "--anchor-run",
        type=_positive_int,
        default=1,
        metavar="R",
        help="draw anchors in runs of R consecutive positions (1: scattered, as the references do). With R >= 16 "
        "accept_len_est reads what a server measures, but a drafter trained so is accepted less: use it to "
        "measure a finished drafter (docs/evaluate.md)",
    )
    g.add_argument(
        "--est-anchors",
        type=_est_anchors,
        default=32,
        metavar="M",
        help="measuring blocks per packed row for accept_len_est: one run of M consecutive anchors beside the "
        "training anchors, through the same drafter forward with loss weight 0 (training unchanged). Costs M "
        "extra blocks per micro-batch (~M / --max-anchors of the drafter's block compute); buys an estimate that "
        "walks as decoding does (scattered training anchors over-read it). 0: off, the walk over the training "
        "anchors (docs/evaluate.md)",
    )
    g.add_argument(
        "--est-holdout",
        type=_nonneg_int,
        default=0,
        metavar="N",
        help="hold N sequences of the data out of training and measure accept_len_est on them: every micro-batch "
        "ends with one (its tokens cost the target's forward, ~its length / --token-budget), where the "
        "measuring run is drawn; the drafter never trains on them. Without it the estimate reads text the "
        "drafter has trained on, high after many epochs. 0: off (docs/evaluate.md)",
    )
    g.add_argument(
        "--num-draft-layers",
        type=_positive_int,
        default=None,
        help="drafter layers (default 1; 5 for Qwen3.5/3.6 targets; resuming: the checkpoint's)",
    )
    g.add_argument(
        "--mask-token-id",
        type=int,
        default=None,
        help="default: the last vocab id (Qwen3.5/3.6 targets: the tokenizer's mask token when it has one)",
    )
    g.add_argument(
        "--target-layer-ids", type=_int_list, default=None, help="comma-separated target layer indices"
    )
    g.add_argument(
        "--layer-types",
        type=_str_list,
        default=None,
        help="comma-separated full_attention|sliding_attention, one per draft layer",
    )
    g.add_argument("--sliding-window", type=_positive_int, default=None)
    g.add_argument("--gamma", type=finite_float, default=7.0, help="loss weight decay over block positions")
    g.add_argument(
        "--labels",
        choices=LABELS,
        default=None,
        help="what the drafter learns at each slot: data (the data token; default), target-argmax (the target's "
        "own greedy choice there) or target-dist (the target's distribution, through --divergence); both "
        "target ones run the whole target (docs/trainer.md 'Labels and divergences')",
    )
    g.add_argument(
        "--divergence",
        choices=DIVERGENCES,
        default=None,
        help="--labels target-dist's loss: kl (KL(target || drafter), default), reverse-kl, jsd or tv, as "
        "speculators defines them",
    )
    g.add_argument(
        "--use-soft-labels", action="store_true", help="the same as --labels target-dist (kept for old runs)"
    )
    g = p.add_argument_group("drafter architecture (docs/model.md)")
    g.add_argument(
        "--arch",
        choices=ARCHS,
        default=None,
        help="dflash (DFlash 1, the default) or dflash2 (convolutions around every sublayer, candidate "
        "selector); resuming: the checkpoint's",
    )
    g.add_argument(
        "--conv-kernel-size", type=_positive_int, default=None, help="dflash2 conv taps (default 2)"
    )
    g.add_argument(
        "--conv-group-size",
        type=_positive_int,
        default=None,
        help="dflash2 channels per dynamic coefficient (16)",
    )
    g.add_argument(
        "--selector-rank", type=_positive_int, default=None, help="dflash2 selector rank (default 256)"
    )
    g.add_argument(
        "--selector-top-k", type=_positive_int, default=None, help="dflash2 candidates per slot (16)"
    )
    g.add_argument(
        "--selector-unary-grad",
        action="store_true",
        help="dflash2: the selector's loss also trains the drafter through its unary logits (speculators' "
        "objective; default: they enter detached, trained by the DFlash loss alone)",
    )
    g.add_argument("--noise-start", type=finite_float, default=0.0)
    g.add_argument("--noise-end", type=finite_float, default=0.0)
    g.add_argument("--noise-type", choices=("uniform", "gaussian"), default="uniform")
    g = p.add_argument_group("pipeline and run control")
    g.add_argument("--hs-queue-depth", type=_positive_int, default=8, help="hidden-state batches queued")
    g.add_argument(
        "--save-every", type=_nonneg_int, default=0, help="checkpoint every N steps (0: only at stop)"
    )
    g.add_argument(
        "--save-every-minutes",
        type=_nonneg_float,
        default=SAVE_EVERY_MINUTES,
        help=f"also checkpoint when M minutes passed since the last save (0: off; default {SAVE_EVERY_MINUTES:g})",
    )
    g.add_argument(
        "--keep-checkpoints",
        type=_positive_int,
        default=2,
        help="complete checkpoints kept (the newest is removed only after a newer one is complete)",
    )
    g.add_argument("--resume", default="auto", help="auto | none | PATH of a checkpoint directory")
    g.add_argument(
        "--init-drafter",
        default=None,
        metavar="DIR",
        help="start from these drafter weights (a checkpoint's drafter/ or export/, a published DFlash "
        "checkpoint) with a fresh optimizer, schedule and data cursor; its config must match the flags. "
        "A checkpoint found by --resume wins",
    )
    g.add_argument("--log-every", type=_positive_int, default=1, help="print a log line every N steps")
    g.add_argument(
        "--export-fp32", action="store_true", help="write the checkpoint's export/ in fp32 (default bf16)"
    )
    g.add_argument(
        "--report-to",
        type=report_to,
        default=(),
        metavar="LIST",
        help="experiment trackers, comma-separated: tensorboard, wandb, mlflow (default none; offline, under "
        "the run directory, unless their own settings say otherwise: docs/trainer.md 'Experiment tracking')",
    )
    g = p.add_argument_group("evaluation during training (docs/evaluate.md)")
    g.add_argument(
        "--eval-every",
        type=_nonneg_int,
        default=0,
        help="evaluate every N-th saved checkpoint in a separate process (0: never)",
    )
    g.add_argument(
        "--eval-data",
        default=None,
        help="prompts: a JSONL file or directory (held-out data), or est-holdout: the sequences --est-holdout "
        "holds out of training",
    )
    g.add_argument("--eval-device", default="cpu", help="cpu or cuda:N for the evaluation process")
    g.add_argument("--eval-prompts", type=_positive_int, default=32, help="prompts per evaluation")
    g.add_argument("--eval-new-tokens", type=_positive_int, default=128, help="new tokens per prompt")
    g.add_argument(
        "--keep-best",
        action="store_true",
        help="keep the checkpoint whose evaluation read the highest acceptance (checkpoints/best), beside the "
        "--keep-checkpoints newest; needs --eval-every",
    )
    return p


@dataclass(frozen=True)
class Devices:
    target: list[str]  # "cpu" or "cuda:N"; "cpu" may repeat (one CPU worker each)
    drafter: list[str]
    mode: str = "single"  # "single" | "multi" | "torchrun"


def parse_devices(flag: str, text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not items or any(x == "" for x in items):
        raise FlagError(flag, f"expected comma-separated CUDA indices or 'cpu', got {text!r}")
    out = []
    for x in items:
        if x.lower() == "cpu":
            out.append("cpu")
        elif x.isdigit():
            out.append(f"cuda:{int(x)}")
        else:
            raise FlagError(flag, f"{x!r} is neither a CUDA index nor 'cpu'")
    if len(set(out)) != len(out) and out[0] != "cpu":
        raise FlagError(flag, f"lists a device twice: {text!r}")
    if "cpu" in out and any(x != "cpu" for x in out):
        raise FlagError(flag, "'cpu' cannot be mixed with other devices")
    return out


def devices_of(target_gpus: str, drafter_gpus: str, launch: str) -> Devices:
    """The device lists and the launch mode, or FlagError naming the flag that does not fit."""
    target = parse_devices("--target-gpus", target_gpus)
    drafter = parse_devices("--drafter-gpus", drafter_gpus)
    if ("cpu" in target) != ("cpu" in drafter):
        raise FlagError("--drafter-gpus", "CPU and CUDA roles cannot be mixed: use 'cpu' for both or neither")
    return Devices(target=target, drafter=drafter, mode=launch_mode(launch, target, drafter))


def target_info(path: str) -> dict:
    """model_type (of the text model), layer_types and the tokenizer's mask token id, from the JSON files."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            top = json.load(f)
    except (OSError, ValueError) as e:
        raise FlagError("--target-model", f"cannot read {path}/config.json: {e}") from None
    text = top.get("text_config") if isinstance(top.get("text_config"), dict) else top
    mt = text.get("model_type") or top.get("model_type")
    try:
        fp8 = fp8_config.read(top, f"{path}/config.json") is not None
    except ValueError as e:
        raise FlagError("--target-model", str(e)) from None
    return {
        "fp8": fp8,
        "model_type": mt,
        "top_model_type": top.get("model_type"),
        "layer_types": list(text.get("layer_types") or []),
        "mask_token_id": _tokenizer_mask_id(path),
    }


def _tokenizer_mask_id(path: str) -> int | None:
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            tc = json.load(f)
    except (OSError, ValueError):
        return None
    mask = tc.get("mask_token")
    if isinstance(mask, dict):
        mask = mask.get("content")
    if not mask:
        return None
    for i, tok in (tc.get("added_tokens_decoder") or {}).items():
        if isinstance(tok, dict) and tok.get("content") == mask:
            return int(i)
    try:
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            tj = json.load(f)
    except (OSError, ValueError):
        return None
    for tok in tj.get("added_tokens") or []:
        if tok.get("content") == mask:
            return int(tok["id"])
    vocab = (tj.get("model") or {}).get("vocab")
    return int(vocab[mask]) if isinstance(vocab, dict) and mask in vocab else None


def is_hybrid(info: dict) -> bool:
    return info["model_type"] in HYBRID_MODEL_TYPES or info["top_model_type"] in HYBRID_MODEL_TYPES


def check_target(args, info: dict, cuda: bool) -> None:
    """Refuse what this target cannot do: packed rows through linear-attention layers that are not
    captured per document; fp8 projections of a bf16 checkpoint on the CPU (a GPU without FP8 is refused
    where the target loads: ``trainer.target.fp8.wants_fp8``); a hybrid target on CUDA without
    flash-linear-attention."""
    linear = [t for t in info["layer_types"] if t not in ATTENTION_LAYER_TYPES]
    if (linear or info["model_type"] == "qwen3_next") and not is_hybrid(info) and args.max_batch_size > 1:
        raise FlagError(
            "--max-batch-size",
            f"the target (model_type {info['model_type']!r}) has linear-attention layers, which would carry "
            "their state from one packed document into the next (per-document capture exists for Qwen3.5/3.6 "
            f"targets only): use --max-batch-size 1 (one document per row), not {args.max_batch_size}",
        )
    if getattr(args, "target_dtype", None) == "fp8" and not cuda and not info.get("fp8"):
        raise FlagError(
            "--target-dtype",
            "fp8 on the CPU: the CPU has no FP8 matmul (it runs an FP8 checkpoint dequantised, for tests, but "
            "does not quantise a bf16 one): use --target-dtype bf16 or a Hopper GPU",
        )
    check_fp8_scales(args, info)
    if is_hybrid(info) and cuda and importlib.util.find_spec("fla") is None:
        raise FlagError(
            "--target-gpus",
            f"a {info['model_type']} target on CUDA needs the {FLA_PACKAGE} package (import name 'fla'; "
            "pip install '.[gpu]') for its per-document Gated DeltaNet kernels; it is not installed",
        )


def check_fp8_scales(args, info: dict) -> None:
    """``--fp8-scales`` for a target whose dtype resolves to bf16 (as ``trainer.target.fp8.wants_fp8`` resolves
    it: fp8 for an FP8 checkpoint, else bf16) is refused (``fp8_config.scales_refusal``)."""
    scales, dtype = getattr(args, "fp8_scales", None), getattr(args, "target_dtype", None)
    use_fp8 = (dtype or ("fp8" if info.get("fp8") else "bf16")) == "fp8"
    why = "--target-dtype bf16" if dtype else "a bf16 checkpoint without --target-dtype fp8"
    refusal = fp8_config.scales_refusal(scales, use_fp8, why)
    if refusal is not None:
        raise FlagError("--fp8-scales", refusal)


def launch_mode(launch: str, target: list[str], drafter: list[str]) -> str:
    """single | multi | torchrun, or FlagError when the device lists do not fit the requested mode."""
    cpu = target[0] == "cpu"
    shared = sorted(set(target) & set(drafter)) if not cpu else []
    if launch == "auto":
        if cpu:
            launch = "single" if len(target) == 1 and len(drafter) == 1 else "multi"
        else:
            launch = "single" if shared else "multi"
    if launch == "single":
        if len(drafter) > 1:
            raise FlagError(
                "--drafter-gpus",
                f"{len(drafter)} drafter devices need one process per device: "
                "use --launch multi (or auto) with no device in both lists",
            )
        if len(set(target)) != len(target):
            raise FlagError("--target-gpus", "repeats 'cpu': several CPU target workers need --launch multi")
        return "single"
    if shared:
        raise FlagError(
            "--drafter-gpus",
            f"{', '.join(shared)} is in both --target-gpus and --drafter-gpus: one "
            "worker process per GPU cannot share it (NCCL allows one rank per GPU); "
            "give disjoint lists, or one device in both with --launch single",
        )
    return launch


def check_devices(devices: Devices, eval_device: str | None = None) -> None:
    """Refuse CUDA indices this machine lacks (needs torch): the trainer's before its run directory or any
    worker (``pipeline.main``), each worker's again for its own node; ``eval_device``: ``--eval-device``."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    given = [("--target-gpus", d) for d in devices.target] + [("--drafter-gpus", d) for d in devices.drafter]
    if eval_device is not None:
        given.append(("--eval-device", eval_device))
    for flag, d in given:
        if d.startswith("cuda:") and int(d.split(":")[1]) >= n:
            have = f"indices 0..{n - 1}" if n else "no CUDA device"
            raise FlagError(flag, f"CUDA index {d.split(':')[1]} does not exist (this machine has {have})")


def resolve_labels(
    labels: str | None, divergence: str | None, use_soft_labels: bool
) -> tuple[str, str | None]:
    """(``--labels``, ``--divergence``) as resolved: ``--use-soft-labels`` is ``--labels target-dist``; the
    divergence is ``kl`` by default under target-dist and None otherwise; ``FlagError`` for a contradiction."""
    if use_soft_labels:
        if labels not in (None, "target-dist"):
            raise FlagError(
                "--use-soft-labels", f"means --labels target-dist; it contradicts --labels {labels}"
            )
        labels = "target-dist"
    labels = labels or "data"
    if labels != "target-dist":
        if divergence is not None:
            raise FlagError("--divergence", f"applies to --labels target-dist only, not --labels {labels}")
        return labels, None
    return labels, divergence or "kl"


def loss_objective(args) -> str:
    """The loss's objective (``trainer.drafting.loss.OBJECTIVES``) of resolved settings: the divergence under
    ``--labels target-dist``, else the labels."""
    labels = getattr(args, "labels", None) or ("target-dist" if args.use_soft_labels else "data")
    return (getattr(args, "divergence", None) or "kl") if labels == "target-dist" else labels


def dflash2_flags(args) -> dict:
    """The DFlash 2 fields (``RESOLVABLE``'s ``only="dflash2"`` rows) as set (None: the published default)."""
    return {r.name: getattr(args, r.name, None) for r in RESOLVABLE if r.only == "dflash2"}


def flag_for_setting(error: Exception) -> str:
    """The flag of the drafter setting a configuration error is about (``ConfigError.setting``,
    trainer/drafting/config.py): the option of that name (``target_layer_ids`` -> ``--target-layer-ids``);
    a setting no flag sets (``hidden_size``, ``model_type``, ...) is the target's: ``--target-model``."""
    setting = getattr(error, "setting", None)
    flag = "--" + str(setting).replace("_", "-")
    return flag if setting and flag in _options() else "--target-model"


@functools.cache
def _options() -> frozenset[str]:
    return frozenset(build_parser()._option_string_actions)

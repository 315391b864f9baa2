"""The run's settings: one frozen, typed object, built once from the command line and the checkpoint.

``resolve(parsed_flags) -> Settings``: the flags of ``flags.RESOLVABLE`` (the drafter's architecture, block,
layers, mask token, DFlash 2 fields) left out take the resumed checkpoint's values (its drafter config.json:
a run restarts with the settings it was launched with), else the table's defaults; then every rule is
checked (``PATH_RULES``, ``RULES``: each names its flag; ``FlagError``). Nothing is set on the parsed flags
afterwards, and nothing re-parses them: the launcher hands its workers the settings as JSON
(``worker_argv`` -> ``python -m trainer.worker --settings JSON``; ``parse_worker_argv``), run.json's
``drafter`` is ``drafter_record()``. The fields are the argparse dest names (``settings.block_size``); lists
(``target_layer_ids``, ``layer_types``) are tuples. Cheap: no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainer.run import checkpoint
from trainer.run.flags import (
    ATTENTION_LAYER_TYPES,
    RESOLVABLE,
    Devices,
    FlagError,
    build_parser,
    check_target,
    devices_of,
    is_hybrid,
    resolve_labels,
    target_info,
)

EST_HOLDOUT = "est-holdout"  # --eval-data's keyword (trainer/evaluation/heldout.py KEYWORD)
SETTINGS_FLAG = "--settings"  # python -m trainer.worker --settings JSON (the launcher's workers)


@dataclass(frozen=True)
class Settings:
    """Every flag of ``python -m trainer.pipeline`` as resolved (docs/trainer.md "Flags")."""

    # paths
    target_model: str
    target_dtype: str | None  # None: fp8 for an FP8 checkpoint, else bf16
    fp8_scales: str | None  # an FP8 target's scales, "block" / "row"; None: block
    data_dir: str
    output_dir: str
    # devices
    target_gpus: str
    drafter_gpus: str
    launch: str
    control_host: str
    control_port: int
    nnodes: int
    # optimisation
    epochs: int
    max_steps: int | None
    lr: float
    warmup_ratio: float
    weight_decay: float
    grad_accum: int
    grad_clip: float
    seed: int
    # data packing
    token_budget: int
    max_seq_len: int
    max_batch_size: int
    # drafter
    block_size: int
    max_anchors: int
    anchor_run: int
    est_anchors: int
    est_holdout: int
    num_draft_layers: int
    mask_token_id: int | None  # None: the target's last vocab id
    target_layer_ids: tuple[int, ...] | None  # None: the reference rule
    layer_types: tuple[str, ...] | None  # None: all full attention
    sliding_window: int | None
    gamma: float
    labels: (
        str  # flags.LABELS: data | target-argmax | target-dist (--use-soft-labels resolves to target-dist)
    )
    divergence: str | None  # flags.DIVERGENCES under --labels target-dist, else None
    use_soft_labels: bool  # resolved: the labels are the target's (its final hidden state is captured)
    arch: str
    conv_kernel_size: int | None  # the DFlash 2 fields: None is the published default (or DFlash 1)
    conv_group_size: int | None
    selector_rank: int | None
    selector_top_k: int | None
    selector_unary_grad: bool
    noise_start: float
    noise_end: float
    noise_type: str
    # pipeline and run control
    hs_queue_depth: int
    save_every: int
    save_every_minutes: float
    keep_checkpoints: int
    resume: str
    init_drafter: str | None
    log_every: int
    export_fp32: bool
    report_to: tuple[str, ...]  # experiment trackers (trainer/tracking/), in flags.TRACKERS order
    # evaluation during training
    eval_every: int
    eval_data: str | None
    eval_device: str
    eval_prompts: int
    eval_new_tokens: int
    keep_best: bool

    def __post_init__(self) -> None:
        for name in ("target_layer_ids", "layer_types", "report_to"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, tuple(v))

    def devices(self) -> Devices:
        """The device lists and the launch mode (cheap; checked when the settings were resolved)."""
        return devices_of(self.target_gpus, self.drafter_gpus, self.launch)

    def drafter_record(self) -> dict[str, Any]:
        """run.json's ``drafter``: the resolvable settings as resolved (docs/run-directory.md)."""
        return {r.name: getattr(self, r.name) for r in RESOLVABLE}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Settings:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Rule:
    """One check: ``bad(settings)`` is refused with ``FlagError(flag, why(settings))``."""

    flag: str
    bad: Callable[[Any], bool]
    why: Callable[[Any], str]

    def check(self, s: Any) -> None:
        if self.bad(s):
            raise FlagError(self.flag, self.why(s))


def _eval_device_bad(d: str) -> bool:
    return d != "cpu" and not (d.startswith("cuda:") and d[5:].isdigit())


# On the parsed flags, before anything is read.
PATH_RULES = (
    Rule(
        "--target-model",
        lambda s: not os.path.isdir(s.target_model),
        lambda s: f"{s.target_model!r} is not a directory",
    ),
    Rule(
        "--target-model",
        lambda s: not os.path.isfile(os.path.join(s.target_model, "config.json")),
        lambda s: f"{s.target_model!r} has no config.json (expected a transformers model directory)",
    ),
    Rule(
        "--data-dir", lambda s: not os.path.isdir(s.data_dir), lambda s: f"{s.data_dir!r} is not a directory"
    ),
    Rule(
        "--output-dir",
        lambda s: os.path.exists(s.output_dir) and not os.path.isdir(s.output_dir),
        lambda s: f"{s.output_dir!r} exists and is not a directory",
    ),
)

# On the resolved settings, in this order (the first that fails is reported).
RULES = (
    Rule("--lr", lambda s: not s.lr > 0, lambda s: f"must be > 0, got {s.lr}"),
    Rule(
        "--warmup-ratio",
        lambda s: not 0.0 <= s.warmup_ratio < 1.0,
        lambda s: f"must be in [0, 1), got {s.warmup_ratio}",
    ),
    Rule(
        "--weight-decay", lambda s: not s.weight_decay >= 0, lambda s: f"must be >= 0, got {s.weight_decay}"
    ),
    Rule(
        "--grad-clip",
        lambda s: not s.grad_clip >= 0,
        lambda s: f"must be >= 0 (0 disables), got {s.grad_clip}",
    ),
    *(  # refused on the other architecture (they would be ignored)
        Rule(
            r.flag,
            lambda s, r=r: s.arch != r.only and getattr(s, r.name) is not None,
            lambda s, r=r: f"applies to --arch {r.only} only",
        )
        for r in RESOLVABLE
        if r.only
    ),
    Rule(
        "--selector-unary-grad",
        lambda s: s.arch != "dflash2" and s.selector_unary_grad,
        lambda s: "applies to --arch dflash2 only",
    ),
    Rule(
        "--block-size",
        lambda s: s.block_size < 2,
        lambda s: f"must be >= 2 (anchor plus at least one predicted token), got {s.block_size}",
    ),
    Rule(
        "--max-seq-len",
        lambda s: s.max_seq_len > s.token_budget,
        lambda s: f"{s.max_seq_len} exceeds --token-budget {s.token_budget}",
    ),
    Rule(
        "--max-seq-len",
        lambda s: s.max_seq_len <= s.block_size,
        lambda s: f"must exceed --block-size {s.block_size}",
    ),
    Rule(  # one anchor per token at most: the bound keeps the anchor count's tensors sized by the batch
        "--max-anchors",
        lambda s: s.max_anchors > s.token_budget,
        lambda s: f"{s.max_anchors} exceeds --token-budget {s.token_budget} (at most one anchor per token)",
    ),
    Rule(
        "--est-holdout",
        lambda s: s.est_holdout > 0 and s.est_anchors == 0,
        lambda s: "needs --est-anchors >= 2 (the held-out sequences are only measured, by its runs)",
    ),
    Rule("--gamma", lambda s: not s.gamma > 0, lambda s: f"must be > 0, got {s.gamma}"),
    Rule("--noise-start", lambda s: not s.noise_start >= 0, lambda s: f"must be >= 0, got {s.noise_start}"),
    Rule("--noise-end", lambda s: not s.noise_end >= 0, lambda s: f"must be >= 0, got {s.noise_end}"),
    Rule(
        "--mask-token-id",
        lambda s: s.mask_token_id is not None and s.mask_token_id < 0,
        lambda s: f"must be >= 0, got {s.mask_token_id}",
    ),
    Rule(
        "--target-layer-ids",
        lambda s: s.target_layer_ids is not None and not s.target_layer_ids,
        lambda s: "is empty",
    ),
    Rule(
        "--layer-types",
        lambda s: s.layer_types is not None and len(s.layer_types) != s.num_draft_layers,
        lambda s: f"has {len(s.layer_types)} entries but --num-draft-layers is {s.num_draft_layers}",
    ),
    Rule(
        "--layer-types",
        lambda s: s.layer_types is not None and any(t not in ATTENTION_LAYER_TYPES for t in s.layer_types),
        lambda s: (
            f"unknown layer type(s) {[t for t in s.layer_types if t not in ATTENTION_LAYER_TYPES]}: "
            "use full_attention or sliding_attention"
        ),
    ),
    Rule(
        "--resume",
        lambda s: s.resume not in ("auto", "none") and not os.path.isdir(s.resume),
        lambda s: f"expected auto, none or a checkpoint directory; {s.resume!r} is not a directory",
    ),
    *(
        Rule(
            "--init-drafter",
            lambda s, fn=fn: (
                s.init_drafter is not None and not os.path.isfile(os.path.join(s.init_drafter, fn))
            ),
            lambda s, fn=fn: f"{s.init_drafter!r} has no {fn}",
        )
        for fn in ("config.json", "model.safetensors")
    ),
    # the --eval-* flags (cheap checks; the evaluation process checks the rest)
    Rule(
        "--eval-data",
        lambda s: s.eval_every and not s.eval_data,
        lambda s: "--eval-every needs --eval-data (a JSONL file or directory of prompts)",
    ),
    Rule(
        "--eval-data",
        lambda s: s.eval_every and s.eval_data != EST_HOLDOUT and not os.path.exists(s.eval_data),
        lambda s: f"{s.eval_data!r} does not exist",
    ),
    Rule(
        "--eval-data",
        lambda s: s.eval_every and s.eval_data == EST_HOLDOUT and not s.est_holdout,
        lambda s: (
            f"{EST_HOLDOUT} evaluates on the sequences --est-holdout N holds out of training: give --est-holdout"
        ),
    ),
    Rule(
        "--keep-best",
        lambda s: s.keep_best and not s.eval_every,
        lambda s: "needs --eval-every (the best checkpoint is the best evaluated one)",
    ),
    Rule(
        "--eval-device",
        lambda s: s.eval_every and _eval_device_bad(s.eval_device),
        lambda s: f"expected cpu or cuda:N, got {s.eval_device!r}",
    ),
)


def saved_drafter_config(flags: Any) -> dict | None:
    """The drafter config.json of the checkpoint this run would resume from, if any (cheap: JSON only)."""
    if flags.resume == "none":
        return None
    if flags.resume == "auto":
        path = checkpoint.latest(os.path.join(flags.output_dir, "checkpoints"))
    else:
        path = flags.resume if checkpoint.is_complete(flags.resume) else None
    if path is None:
        return None
    try:
        with open(os.path.join(path, "drafter", "config.json"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def resolve_drafter(given: dict[str, Any], info: dict, saved: dict | None) -> dict[str, Any]:
    """The ``RESOLVABLE`` settings: as given; else the checkpoint's (``saved``: its drafter config.json), for
    the architecture's own fields only on that architecture; else the table's default for the architecture
    and the target family (``info``: ``flags.target_info``)."""
    out: dict[str, Any] = {}
    hybrid = is_hybrid(info)
    for r in RESOLVABLE:  # --arch first
        v = given.get(r.name)
        if v is None and saved is not None and r.only in (None, out.get("arch")):
            v = r.saved(saved)
        if v is None:
            v = r.default_for(out.get("arch"), hybrid, info["mask_token_id"])
        out[r.name] = v
    return out


def resolve(given: argparse.Namespace | Settings) -> Settings:
    """The run's settings from the parsed flags (``flags.build_parser``), or ``FlagError`` naming the flag of
    the first rule that fails. Settings already resolved (a worker's, from its launcher) come back as is."""
    if isinstance(given, Settings):
        return given
    for rule in PATH_RULES:
        rule.check(given)
    devices = devices_of(given.target_gpus, given.drafter_gpus, given.launch)
    info = target_info(given.target_model)
    values = dict(vars(given))
    values.update(resolve_drafter(values, info, saved_drafter_config(given)))
    values["labels"], values["divergence"] = resolve_labels(
        values.get("labels"), values.get("divergence"), bool(values.get("use_soft_labels"))
    )
    values["use_soft_labels"] = values["labels"] != "data"
    settings = Settings(**values)
    check_target(settings, info, cuda=devices.target[0] != "cpu")
    for rule in RULES:
        rule.check(settings)
    return settings


def worker_argv(settings: Settings) -> list[str]:
    """The command line the launcher gives ``python -m trainer.worker``: its settings as JSON."""
    return [SETTINGS_FLAG, settings.to_json()]


def parse_worker_argv(argv: list[str]) -> Settings | argparse.Namespace:
    """A worker's command line: the launcher's ``--settings JSON`` (resolved there), or the run's own flags
    (torchrun's workers; argparse exits 2 on bad ones, ``resolve`` checks the rest)."""
    if argv[:1] == [SETTINGS_FLAG] and len(argv) == 2:
        return Settings.from_json(argv[1])
    return build_parser().parse_args(argv)

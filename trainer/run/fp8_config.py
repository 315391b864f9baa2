"""An FP8 checkpoint's ``quantization_config`` (config.json), read without torch (the flags read it too).

Qwen's FP8 checkpoints (Qwen3-*-FP8, Qwen3.5 / Qwen3.6-*-FP8) carry, at the top level of config.json::

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128], "modules_to_not_convert": [...]}

the layout transformers' ``FineGrainedFP8Config`` reads: every converted linear layer's ``weight`` is
float8_e4m3fn with a ``weight_scale_inv`` beside it (float32, one per 128 x 128 block, shape
``[ceil(out / 128), ceil(in / 128)]``; the weight is ``weight * scale_inv`` per block). ``read(top)`` returns
an ``Fp8Config`` for such a config, None for a checkpoint that is not FP8, and a ValueError naming the field
for an FP8 variant this trainer does not run (another block size or format, static activation scales,
power-of-two ``ue8m0`` scales).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

BLOCK = 128


def scales_refusal(scales: str | None, use_fp8: bool, why: str = "") -> str | None:
    """Why ``--fp8-scales`` (``scales``) cannot be given for this target, or None: it applies to FP8 targets only
    (``use_fp8``: the target dtype resolved to fp8). ``why`` says how it came to bf16, for the message."""
    if scales is None or use_fp8:
        return None
    how = f" ({why})" if why else ""
    return (
        f"{scales}: the target runs in bf16{how}, and --fp8-scales applies to FP8 targets only: give "
        "--target-dtype fp8, or leave --fp8-scales out"
    )


@dataclass(frozen=True)
class Fp8Config:
    not_convert: tuple[str, ...] = ()  # modules_to_not_convert: module names / patterns kept unquantised

    def converts(self, *names: str) -> bool:
        """Whether a module (by any of its names: the model's, the checkpoint's) is not listed in
        ``modules_to_not_convert`` (transformers' rule: a prefix up to a module boundary, a regex with that
        boundary, or a suffix)."""
        return not any(_listed(n, p) for n in names for p in self.not_convert)


def _listed(name: str, pattern: str) -> bool:
    if name.endswith(pattern):
        return True
    try:
        return re.match(rf"(?:{pattern})(?:(?<=\.)|(?=\.|$))", name) is not None
    except re.error:  # not a regex: a plain prefix
        return name == pattern or name.startswith(pattern + ".")


def _quant(top: dict) -> dict | None:
    for cfg in (top, top.get("text_config")):
        q = cfg.get("quantization_config") if isinstance(cfg, dict) else None
        if isinstance(q, dict):
            return q
    return None


def read(top: dict, where: str = "config.json") -> Fp8Config | None:
    """The checkpoint's FP8 settings (None: not an FP8 checkpoint); ValueError for one it cannot run."""
    q = _quant(top)
    if q is None or q.get("quant_method") != "fp8":
        return None
    bad = {
        "fmt": (q.get("fmt", "e4m3"), ("e4m3",)),
        "activation_scheme": (q.get("activation_scheme", "dynamic"), ("dynamic",)),
        "scale_fmt": (q.get("scale_fmt", "float"), ("float",)),
    }
    for field, (got, ok) in bad.items():
        if got not in ok:
            raise ValueError(
                f"{where}: quantization_config.{field} is {got!r}; this trainer runs FP8 checkpoints with "
                f"{field} {ok[0]!r} only"
            )
    block = q.get("weight_block_size")
    if list(block or []) != [BLOCK, BLOCK]:
        raise ValueError(
            f"{where}: quantization_config.weight_block_size is {block!r}; this trainer runs block-wise FP8 "
            f"checkpoints with blocks of [{BLOCK}, {BLOCK}] only"
        )
    skip = q.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) for s in skip):
        raise ValueError(f"{where}: quantization_config.modules_to_not_convert is not a list of names")
    return Fp8Config(not_convert=tuple(skip))


def read_dir(path: str) -> Fp8Config | None:
    """``read`` of the checkpoint directory's config.json (None when it has none or is not FP8)."""
    cfg = os.path.join(path, "config.json")
    try:
        with open(cfg, encoding="utf-8") as f:
            top = json.load(f)
    except (OSError, ValueError):
        return None
    return read(top, cfg) if isinstance(top, dict) else None

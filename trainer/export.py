"""Export the drafter in the layout the published DFlash drafters use (z-lab; loaded by vLLM and SGLang).

``save_drafter(drafter, cfg, out_dir)`` writes
- ``config.json``: a Qwen3 config (``model_type: qwen3``, ``architectures: ["DFlashDraftModel"]``, the sizes,
  ``num_hidden_layers`` = draft layers, ``layer_types``, ``sliding_window``/``use_sliding_window``,
  ``rope_theta``/``rope_scaling`` plus transformers-5 ``rope_parameters``, ``tie_word_embeddings: false``)
  with the DFlash fields ``block_size``, ``num_target_layers`` and
  ``dflash_config: {mask_token_id, target_layer_ids}``;
- ``model.safetensors``: the drafter's ``state_dict()`` (``fc.weight``, ``hidden_norm.weight``,
  ``layers.N.self_attn.{q,k,v,o}_proj.weight``, ``...q_norm/k_norm``, ``layers.N.mlp.{gate,up,down}_proj``,
  ``layers.N.{input,post_attention}_layernorm``, ``norm.weight``): no embedding, no lm_head (the server takes
  them from the target).
``load_drafter(out_dir, device="cpu") -> (drafter, cfg)`` reads both back bit-exactly (same dtype).
A DDP (``.module``) or ``torch.compile`` (``._orig_mod``) wrapper is unwrapped before saving.
"""

from __future__ import annotations

import json
import os

import torch

from trainer.config import DraftConfig
from trainer.model import DFlashDrafter

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def config_json(cfg: DraftConfig, dtype: torch.dtype = torch.bfloat16) -> dict:
    rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope_parameters = {**cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "block_size": cfg.block_size,
        "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)},
        "dtype": _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch.")),
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "layer_types": list(cfg.layer_types),
        "max_position_embeddings": cfg.max_position_embeddings,
        "max_window_layers": cfg.num_draft_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_draft_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_target_layers": cfg.num_target_layers,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": rope_parameters,
        "sliding_window": cfg.sliding_window,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_sliding_window": "sliding_attention" in cfg.layer_types,
        "vocab_size": cfg.vocab_size,
    }


def config_from_json(d: dict) -> DraftConfig:
    dflash = d.get("dflash_config") or {}
    block_size = d.get("block_size", dflash.get("block_size"))
    for name, value in (
        ("block_size", block_size),
        ("dflash_config.mask_token_id", dflash.get("mask_token_id")),
        ("dflash_config.target_layer_ids", dflash.get("target_layer_ids")),
    ):
        if value is None:
            raise ValueError(f"drafter config.json has no {name}")
    n = int(d["num_hidden_layers"])
    return DraftConfig(
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_attention_heads=int(d["num_attention_heads"]),
        num_key_value_heads=int(d.get("num_key_value_heads") or d["num_attention_heads"]),
        head_dim=int(d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]),
        vocab_size=int(d["vocab_size"]),
        num_target_layers=int(d["num_target_layers"]),
        target_layer_ids=[int(i) for i in dflash["target_layer_ids"]],
        mask_token_id=int(dflash["mask_token_id"]),
        num_draft_layers=n,
        block_size=int(block_size),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        rope_theta=float(d.get("rope_theta") or (d.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        rope_scaling=d.get("rope_scaling") or None,
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        layer_types=list(d.get("layer_types") or ["full_attention"] * n),
        sliding_window=d.get("sliding_window"),
        attention_bias=bool(d.get("attention_bias", False)),
    )


def save_drafter(drafter: DFlashDrafter, cfg: DraftConfig, out_dir: str | os.PathLike) -> None:
    from safetensors.torch import save_file

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    for attr in ("module", "_orig_mod"):  # DDP / torch.compile wrappers
        drafter = getattr(drafter, attr, drafter)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    dtype = drafter.fc.weight.dtype
    save_file(state, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json(cfg, dtype), f, indent=2)
        f.write("\n")


def load_drafter(
    out_dir: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[DFlashDrafter, DraftConfig]:
    from safetensors.torch import load_file

    out_dir = os.fspath(out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = config_from_json(json.load(f))
    state = load_file(os.path.join(out_dir, "model.safetensors"), device=str(device))
    dtype = state["fc.weight"].dtype
    drafter = DFlashDrafter(cfg).to(device=device, dtype=dtype)
    drafter.load_state_dict(state, strict=True)
    return drafter, cfg

"""The config.json of an exported drafter: ``config_dict(cfg, dtype_name) -> dict``.

A transformers Qwen3 config (``model_type: qwen3``, ``num_hidden_layers`` = draft layers) that vLLM, SGLang
and z-lab/dflash load as their DFlash drafter, with every key one of them needs (docs/model.md, "What each
server reads"; ``python -m trainer.export --check`` verifies a directory against their rules):

- ``architectures``: ``DFlashDraftModel``, or ``DFlash2DraftModel`` for DFlash 2;
- the sizes, ``rms_norm_eps``, ``hidden_act``, RoPE as ``rope_theta``/``rope_scaling`` (transformers 4,
  z-lab's MLX loader) and ``rope_parameters`` (transformers 5);
- ``block_size`` and ``num_target_layers`` at the top level (z-lab reads them there), and ``dflash_config``:
  ``block_size`` again (SGLang and newer z-lab read it there first), ``mask_token_id``, ``target_layer_ids``
  (0-based, after layer i: vLLM adds 1 for its aux layer ids, SGLang for its "before layer" capture),
  DFlash 2's ``conv_kernel_size``, ``conv_group_size``, ``selector_rank``, ``selector_top_k``;
- attention: ``layer_types``, ``sliding_window`` with ``use_sliding_window`` true when a layer slides
  (transformers' Qwen3Config drops the window otherwise), and ``is_causal: false``: the drafter sees its whole
  block on every layer, while z-lab, vLLM and SGLang run a sliding layer causal unless the config says
  otherwise. On a drafter with sliding layers ``dflash_config.causal: false`` too (vLLM's own override).
"""

from __future__ import annotations

from trainer.drafting.config import DFLASH2_FIELDS, DraftConfig


def _sizes(cfg: DraftConfig) -> dict:
    return {
        "attention_bias": cfg.attention_bias,
        "attention_dropout": 0.0,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_draft_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": cfg.vocab_size,
    }


def _rope(cfg: DraftConfig) -> dict:
    params = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        params = {**cfg.rope_scaling, "rope_theta": cfg.rope_theta}
    return {
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": params,
    }


def _attention(cfg: DraftConfig) -> dict:
    return {
        "is_causal": False,
        "layer_types": list(cfg.layer_types),
        "max_window_layers": cfg.num_draft_layers,
        "sliding_window": cfg.sliding_window,
        "use_sliding_window": "sliding_attention" in cfg.layer_types,
    }


def _dflash(cfg: DraftConfig) -> dict:
    out = {
        "block_size": cfg.block_size,
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": list(cfg.target_layer_ids),
    }
    if cfg.arch == "dflash2":
        out.update({n: getattr(cfg, n) for n in DFLASH2_FIELDS})
    if "sliding_attention" in cfg.layer_types:
        out["causal"] = False
    return out


def config_dict(cfg: DraftConfig, dtype_name: str) -> dict:
    d = {
        "architectures": ["DFlash2DraftModel" if cfg.arch == "dflash2" else "DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": cfg.block_size,
        "dflash_config": _dflash(cfg),
        "dtype": dtype_name,
        "num_target_layers": cfg.num_target_layers,
        **_sizes(cfg),
        **_rope(cfg),
        **_attention(cfg),
    }
    return dict(sorted(d.items()))

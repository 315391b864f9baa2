"""z-lab/dflash's rules: ``DFlashDraftModel`` / ``DFlash2DraftModel.from_pretrained(DIR)`` (transformers) and
the MLX ``load_draft(DIR)``; their scripts pick ``DFlash2DraftModel`` when it is in ``architectures``.

Read from z-lab/dflash ``dflash/model.py`` at 44947fbf (main: ``DFlashDraftModel.__init__`` reads
``config.block_size`` (top level), ``config.dflash_config.get("target_layer_ids",
build_target_layer_ids(config.num_target_layers, ...))`` (the default is evaluated first, so
``num_target_layers`` is required), ``dflash_config.get("mask_token_id")``; ``Qwen3DFlashAttention`` takes
``config.sliding_window`` on ``sliding_attention`` layers) and at 07ebd93d (``_draft_value``:
``dflash_config`` before the top level; ``Qwen3DFlashAttention.is_causal = layer_type == "sliding_attention"``
unless the config's ``is_causal`` is set; ``DFlash2DraftModel``: ``conv_kernel_size``, ``conv_group_size``,
``selector_rank``, ``selector_top_k``, the codebooks loaded as ``candidate_selector.*_codebook``), and
``dflash/model_mlx.py`` (``load_draft``: ``cfg["hidden_size"]`` ... ``cfg["rope_theta"]``,
``cfg["max_position_embeddings"]``, ``cfg["block_size"]``, ``cfg["num_target_layers"]``,
``cfg["dflash_config"][...]`` indexed directly; no ``layer_types``, no biases). The config class is
transformers' ``Qwen3Config``. Table: docs/model.md.
"""

from __future__ import annotations

import functools

from trainer.exporting import common as c
from trainer.exporting import weights as w
from trainer.exporting.problems import Problem, error, warning
from trainer.exporting.reader import Export, Target

WHO = "z-lab"
MLX_KEYS = ("rms_norm_eps", "rope_theta", "max_position_embeddings")


def _mlx(top: dict, types: list[str] | None) -> list[Problem]:
    out = [
        error(k, "missing: z-lab's MLX load_draft reads config[key] directly")
        for k in MLX_KEYS
        if k not in top
    ]
    if types and "sliding_attention" in types:
        out.append(
            warning(
                "layer_types",
                "z-lab's MLX drafter ignores layer_types: its sliding layers attend to the whole context",
            )
        )
    if top.get("attention_bias") is True:
        out.append(warning("attention_bias", "z-lab's MLX drafter builds q/k/v/o without bias"))
    return out


def _dflash_keys(top: dict, dc: dict, got: dict | None, dflash2: bool):
    """``(problems, target_layer_ids or None, num_target_layers or None)``. DFlash 1 as main (44947fb) and
    MLX read it: ``block_size`` at the top level, the ids in ``dflash_config``; DFlash 2, which only z-lab from
    07ebd93 loads, through ``_draft_value`` (``dflash_config`` first, then the top level)."""
    out = (
        []
        if "dflash_config" in top
        else [error("dflash_config", "missing: z-lab reads config.dflash_config")]
    )
    out += c.block_size(top, dc, top_required=not dflash2, who=WHO)
    p, n_target = c.num_target_layers(top, dc, required=True, who=WHO, source="top")
    out += p
    src = "both" if dflash2 else "dflash"
    p, ids = c.target_layer_ids(top, dc, n_target, once_in_order=None, who=WHO, source=src)
    out += p + c.mask_token_id(top, dc, got and got["vocab_size"], who=WHO, source=src)
    return out, ids, n_target


def _attention(top: dict, dc: dict, types: list[str] | None) -> list[Problem]:
    if not types:
        return []
    is_causal, out = c.causal_flag(top, dc, "is_causal")
    causal = [is_causal if is_causal is not None else t == "sliding_attention" for t in types]
    how = c.causal_reason([("is_causal", is_causal)], "is_causal unset: a sliding layer is causal")
    return out + c.bidirectional(types, causal, "z-lab (07ebd93)", how)


def _tensors(exp: Export, top: dict, got: dict, ids: list[int], d2: dict | None) -> list[Problem]:
    conv = (d2["conv_kernel_size"], d2["conv_group_size"]) if d2 else None
    want = w.expected(got, len(ids), top.get("attention_bias") is True, conv, d2 and d2["selector_rank"])
    out = w.compare(exp.tensors, want, unexpected="warning", who=WHO, ignored=("rotary_emb.inv_freq",))
    return out + w.dtypes(exp.tensors, top)


def _dflash2(top: dict, dc: dict, got: dict | None) -> tuple[list[Problem], dict | None]:
    out, d2 = c.dflash2_fields(dc, got, who=WHO)
    out += c.logit_extras(dc, WHO)
    out.append(warning("architectures", "z-lab's MLX load_draft (at 44947fb) builds DFlash 1 only"))
    return out, d2


def check(exp: Export, target: Target | None = None) -> list[Problem]:
    top = exp.config
    dflash2 = c.arch_of(top) == "DFlash2DraftModel"
    keys = functools.partial(_dflash_keys, dflash2=dflash2)
    out, dc, (got, ids, n_target, types) = c.config_checks(top, WHO, keys, _attention)
    d2 = None
    if dflash2:
        p, d2 = _dflash2(top, dc, got)
        out += p
    else:
        out += _mlx(top, types)
    if exp.tensors is not None and got and ids and (d2 is not None or not dflash2):
        out += _tensors(exp, top, got, ids, d2)
    return out + c.against_target(target, got, n_target)

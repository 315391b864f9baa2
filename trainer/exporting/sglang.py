"""SGLang's rules (``--speculative-algorithm DFLASH --speculative-draft-model-path DIR``).

Read from sgl-project/sglang: ``python/sglang/srt/speculative/dflash_utils.py`` at 00731f0b
(``parse_dflash_draft_config``: ``dflash_config`` before the top level for ``num_target_layers``,
``block_size`` (default 16), ``target_layer_ids``, ``mask_token`` (default ``"<|MASK|>"``), ``mask_token_id``
(an integer >= 0); ``conv_kernel_size`` with ``conv_group_size`` and ``selector_rank`` with ``selector_top_k``
given together; ``resolve_target_layer_ids``: 0 <= id < num_target_layers;
``get_dflash_attention_sliding_window_size``: a sliding layer needs ``sliding_window``, kept as window - 1),
``python/sglang/srt/models/dflash.py`` (at 003b23d7: ``full_attention`` layers ENCODER_ONLY (bidirectional),
``sliding_attention`` layers DECODER (causal); a later version, with ``DFlash2DraftModel`` in ``EntryClass``,
honours the config's ``is_causal`` in ``_get_dflash_attention_type``, builds the grouped convolutions whenever
``conv_kernel_size`` is set, ignores tensors it has no parameter for and leaves a missing one at its initial
value, checks ``fc.weight``'s shape), the DFlash worker's ``_resolve_mask_token_id`` (below the target's
vocabulary; refused if the tokenizer maps ``mask_token`` to another id) and the targets'
``set_dflash_layers_to_capture`` (``[id + 1 for id in layer_ids]``: "before layer i", each layer once, in
layer order). The config is transformers' ``Qwen3Config``. Table: docs/model.md.
"""

from __future__ import annotations

from trainer.exporting import common as c
from trainer.exporting import weights as w
from trainer.exporting.problems import Problem, error, shown, warning
from trainer.exporting.reader import Export, Target

WHO = "SGLang"
ONCE_IN_ORDER = (
    "SGLang captures each target layer once, in layer order, so fc would get other features; train with "
    "distinct --target-layer-ids"
)


def _pairs(dc: dict) -> list[Problem]:
    out = []
    for a, b in (("conv_kernel_size", "conv_group_size"), ("selector_rank", "selector_top_k")):
        if bool(dc.get(a)) != bool(dc.get(b)):
            out.append(error(f"dflash_config.{a}", f"SGLang needs {a} and {b} together"))
    mt = dc.get("mask_token")
    if mt is not None and (not isinstance(mt, str) or not mt):
        out.append(error("dflash_config.mask_token", f"{shown(mt)} is not a non-empty string"))
    sink = dc.get("attention_sink_bias", False)
    if sink is not False:
        out.append(
            error("dflash_config.attention_sink_bias", f"{shown(sink)}: SGLang then expects sink weights")
        )
    return out


def _dflash_keys(top: dict, dc: dict, got: dict | None):
    """``(problems, target_layer_ids or None, num_target_layers or None)``."""
    out = c.block_size(top, dc, top_required=False, who=WHO)
    p, n_target = c.num_target_layers(top, dc, required=False, who=WHO)
    out += p
    p, ids = c.target_layer_ids(top, dc, n_target, once_in_order=ONCE_IN_ORDER, who=WHO)
    out += p + c.mask_token_id(top, dc, got and got["vocab_size"], who=WHO)
    return out + _pairs(dc), ids, n_target


def _attention(top: dict, dc: dict, types: list[str] | None) -> list[Problem]:
    if not types:
        return []
    is_causal, out = c.causal_flag(top, dc, "is_causal")
    causal = [is_causal if is_causal is not None else t == "sliding_attention" for t in types]
    how = c.causal_reason([("is_causal", is_causal)], "is_causal unset: a sliding layer is DECODER attention")
    out += c.bidirectional(types, causal, WHO, how)
    if "sliding_attention" in types and is_causal is False:
        out.append(
            warning(
                "layer_types",
                "SGLang versions before _get_dflash_attention_type (e.g. 003b23d) run "
                "sliding layers causal whatever is_causal says",
            )
        )
    return out


def _modules(top: dict, dc: dict, got: dict | None) -> tuple[list[Problem], tuple | None, int | None, bool]:
    """``(problems, conv (taps, group) or None, selector rank or None, ok)``: what ``DFlashDraftModel`` /
    ``DFlash2DraftModel`` build besides the backbone."""
    if c.arch_of(top) == "DFlash2DraftModel":
        out, d2 = c.dflash2_fields(dc, got, who=WHO)
        out += c.logit_extras(dc, WHO)
        out.append(
            warning(
                "architectures",
                "DFlash2DraftModel needs an SGLang whose models/dflash.py has it (0.5.23 has; "
                "003b23d has not; releases between not read); serve with --speculative-num-draft-tokens = "
                "block_size",
            )
        )
        if d2 is None:
            return out, None, None, False
        return out, (d2["conv_kernel_size"], d2["conv_group_size"]), d2["selector_rank"], True
    taps, group = dc.get("conv_kernel_size"), dc.get("conv_group_size")
    if c.is_int(taps) and c.is_int(group) and taps > 0 and group > 0:
        return [], (taps, group), None, True  # SGLang's DFlashDraftModel builds the convolutions too
    return [], None, None, True


def check(exp: Export, target: Target | None = None) -> list[Problem]:
    top = exp.config
    out, dc, (got, ids, n_target, _types) = c.config_checks(top, WHO, _dflash_keys, _attention)
    p, conv, selector, ok = _modules(top, dc, got)
    out += p
    if exp.tensors is not None and got and ids and ok:
        want = w.expected(got, len(ids), top.get("attention_bias") is True, conv, selector)
        out += w.compare(exp.tensors, want, unexpected="warning", who=WHO, ignored=("rotary_emb.inv_freq",))
        out += w.dtypes(exp.tensors, top)
    return out + c.against_target(target, got, n_target)

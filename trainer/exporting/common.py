"""Rules more than one server applies, each a function returning problems; the server modules compose them.

A rule reads the raw config (``top``: config.json's object, ``dc``: its ``dflash_config``, ``{}`` when absent)
with JSON's types taken strictly: an integer is a JSON integer (not ``true``, not ``8.0``, not ``"8"``), a
flag a JSON boolean. Where a server lets a ``dflash_config`` value override the top-level one (vLLM, SGLang,
z-lab's ``_draft_value``), ``lookup`` does the same. Ids: ``target_layer_ids`` are 0-based "after target layer
i" (transformers' ``hidden_states[i + 1]``); ``mask_token_id`` a 0-based vocabulary row; ``layer_types`` is
indexed by draft layer from 0.
"""

from __future__ import annotations

import math

from trainer.exporting.problems import Problem, error, shown, warning

ARCHS = ("DFlashDraftModel", "DFlash2DraftModel")
LAYER_TYPES = ("full_attention", "sliding_attention")
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# transformers' Qwen3Config defaults: what a server builds when config.json lacks the key
SIZE_DEFAULTS = {
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "num_hidden_layers": 32,
    "vocab_size": 151936,
}
_MISSING = object()
# the most layers a drafter config may name (trainer/drafting/config.py MAX_DRAFT_LAYERS): checked before a
# list of layers or of expected tensors is made, so ``num_hidden_layers: 1e18`` is one error, not 13 GB
MAX_LAYERS = 1024


def is_int(v: object) -> bool:
    return type(v) is int


def is_number(v: object) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def lookup(top: dict, dc: dict, key: str, source: str = "both") -> tuple[object, str]:
    """``(value, where)`` from ``source``: ``"both"`` (``dflash_config`` first, then the top level, as vLLM,
    SGLang and z-lab's ``_draft_value`` do), ``"dflash"`` or ``"top"`` only; the value is ``_MISSING`` if
    absent."""
    if source in ("both", "dflash") and key in dc:
        return dc[key], f"dflash_config.{key}"
    if source in ("both", "top") and key in top:
        return top[key], key
    return _MISSING, (key if source == "top" else f"dflash_config.{key}")


def missing(v: object) -> bool:
    return v is _MISSING


def dflash_of(top: dict) -> tuple[dict, list[Problem]]:
    dc = top.get("dflash_config", _MISSING)
    if dc is _MISSING:
        return {}, []
    if not isinstance(dc, dict):
        return {}, [error("dflash_config", f"is {shown(dc)}, not an object")]
    return dc, []


def arch_of(top: dict) -> str | None:
    a = top.get("architectures")
    return a[0] if isinstance(a, list) and a and isinstance(a[0], str) else None


def structure(top: dict, who: str) -> list[Problem]:
    out = []
    a = top.get("architectures", _MISSING)
    if missing(a):
        out.append(error("architectures", f"missing: {who} picks the drafter class from it"))
    elif arch_of(top) not in ARCHS:
        out.append(error("architectures", f"{shown(a)}: {who} knows {', '.join(ARCHS)}"))
    if top.get("model_type") != "qwen3":
        out.append(
            error(
                "model_type",
                f"{shown(top.get('model_type'))}: {who} parses the drafter config as "
                'transformers\' Qwen3Config (model_type "qwen3")',
            )
        )
    return out


def sizes(top: dict) -> tuple[list[Problem], dict | None]:
    out, got = [], {}
    for k, default in SIZE_DEFAULTS.items():
        v = top.get(k, _MISSING)
        if missing(v):
            out.append(
                error(k, f"missing: Qwen3Config would take its default {default}, not this drafter's size")
            )
        elif not is_int(v) or v < 1:
            out.append(error(k, f"{shown(v)} is not a positive integer"))
        elif k == "num_hidden_layers" and v > MAX_LAYERS:
            out.append(error(k, f"{v} layers: more than a drafter has (at most {MAX_LAYERS})"))
        else:
            got[k] = v
    heads, kv = got.get("num_attention_heads"), got.get("num_key_value_heads")
    if heads and kv and heads % kv:
        out.append(error("num_key_value_heads", f"{kv} does not divide num_attention_heads {heads}"))
    return out, (got if not out else None)


def numerics(top: dict) -> list[Problem]:
    out = []
    eps = top.get("rms_norm_eps", _MISSING)
    if not missing(eps) and (not is_number(eps) or eps <= 0):
        out.append(error("rms_norm_eps", f"{shown(eps)} is not a positive number"))
    params = top.get("rope_parameters")
    theta = (
        params.get("rope_theta")
        if isinstance(params, dict) and "rope_theta" in params
        else top.get("rope_theta")
    )
    if not is_number(theta) or theta <= 0:
        out.append(
            error(
                "rope_theta",
                f"{shown(theta)}: neither rope_parameters.rope_theta nor rope_theta is a "
                "positive number (the servers' defaults differ: 10000, 1000000)",
            )
        )
    act = top.get("hidden_act", "silu")
    if act != "silu":
        out.append(error("hidden_act", f"{shown(act)}: the servers' DFlash MLP is SwiGLU (silu) only"))
    bias = top.get("attention_bias", False)
    if not isinstance(bias, bool):
        out.append(error("attention_bias", f"{shown(bias)} is not true or false"))
    return out


def block_size(top: dict, dc: dict, *, top_required: bool, who: str) -> list[Problem]:
    out, t, d = [], top.get("block_size", _MISSING), dc.get("block_size", _MISSING)
    for v, key in ((t, "block_size"), (d, "dflash_config.block_size")):
        if not missing(v) and (not is_int(v) or v < 2):
            out.append(
                error(key, f"{shown(v)} is not an integer >= 2 (the anchor and at least one mask slot)")
            )
    if top_required and missing(t):
        out.append(error("block_size", f"missing: {who} reads the top-level block_size"))
    elif missing(t) and missing(d):
        out.append(error("block_size", f"missing (top level and dflash_config): {who} assumes 16"))
    elif not missing(t) and not missing(d) and t != d:
        out.append(
            error(
                "block_size",
                f"top level {shown(t)} and dflash_config.block_size {shown(d)} differ: "
                "servers read different ones",
            )
        )
    return out


def num_target_layers(top: dict, dc: dict, *, required: bool, who: str, source: str = "both"):
    """``(problems, n or None)``."""
    v, where = lookup(top, dc, "num_target_layers", source)
    if missing(v):
        return ([error("num_target_layers", f"missing: {who} needs it")] if required else []), None
    if not is_int(v) or v < 1:
        return [error(where, f"{shown(v)} is not a positive integer")], None
    if "num_target_layers" in dc and "num_target_layers" in top and top["num_target_layers"] != v:
        return [
            error(
                where, f"{v} differs from the top-level num_target_layers {shown(top['num_target_layers'])}"
            )
        ], v
    return [], v


def target_layer_ids(
    top: dict, dc: dict, n_target: int | None, *, once_in_order: str | None, who: str, source: str = "both"
) -> tuple[list[Problem], list[int] | None]:
    """``once_in_order``: the server's capture, if it records each target layer once in layer order (then
    the ids must be strictly increasing, or the features reach ``fc`` in another order or number)."""
    v, where = lookup(top, dc, "target_layer_ids", source)
    if missing(v):
        return [
            error(where, f"missing: {who} would pick its own default layers, not the ones trained on")
        ], None
    if not isinstance(v, list) or not v or not all(is_int(i) for i in v):
        return [error(where, f"{shown(v)} is not a non-empty list of integers")], None
    out = []
    if n_target is not None and any(not 0 <= i < n_target for i in v):
        out.append(
            error(
                where,
                f"{shown(v)}: ids are 0-based target layers (after layer i), valid 0.."
                f"{n_target - 1} for num_target_layers {n_target}",
            )
        )
    if once_in_order and any(b <= a for a, b in zip(v, v[1:], strict=False)):
        msg = f"{shown(v)} repeats or lowers an id (not strictly increasing): {once_in_order}"
        out.append(error(where, msg))
    t = top.get("target_layer_ids", _MISSING)
    if "target_layer_ids" in dc and not missing(t) and t != v:
        out.append(error("target_layer_ids", f"top level {shown(t)} differs from dflash_config's {shown(v)}"))
    return out, v


def mask_token_id(top: dict, dc: dict, vocab: int | None, *, who: str, source: str = "both") -> list[Problem]:
    v, where = lookup(top, dc, "mask_token_id", source)
    if missing(v):
        return [error(where, f"missing: {who} fills the block's masked slots with it")]
    if not is_int(v):
        return [error(where, f"{shown(v)} is not an integer token id")]
    if vocab is not None and not 0 <= v < vocab:
        return [
            error(
                where,
                f"{v} is outside the vocabulary: a 0-based row of the target's embedding, "
                f"valid 0..{vocab - 1} (vocab_size {vocab})",
            )
        ]
    return []


def layer_types(top: dict, n_layers: int | None) -> tuple[list[Problem], list[str] | None]:
    """The types a server sees: ``layer_types`` as written, else what Qwen3Config derives (all full unless
    ``use_sliding_window``: then layers from ``max_window_layers`` on are sliding)."""
    v = top.get("layer_types", _MISSING)
    if n_layers is None:
        return [], None
    if missing(v) or v is None:
        if top.get("use_sliding_window") is True and top.get("sliding_window") is not None:
            first = top.get("max_window_layers", 28)
            first = first if is_int(first) else 28
            return [], ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
        return [], ["full_attention"] * n_layers
    if not isinstance(v, list) or len(v) != n_layers or not all(t in LAYER_TYPES for t in v):
        return [
            error(
                "layer_types",
                f"{shown(v)}: one of {', '.join(LAYER_TYPES)} per draft layer (num_hidden_layers {n_layers})",
            )
        ], None
    return [], list(v)


def sliding(top: dict, types: list[str] | None) -> list[Problem]:
    if not types or "sliding_attention" not in types:
        return []
    out, w = [], top.get("sliding_window", _MISSING)
    if missing(w) or w is None:
        out.append(error("sliding_window", "missing on a drafter with sliding_attention layers"))
    elif not is_int(w) or w < 1:
        out.append(error("sliding_window", f"{shown(w)} is not a positive integer"))
    if top.get("use_sliding_window") is not True:
        out.append(
            error(
                "use_sliding_window",
                f"{shown(top.get('use_sliding_window'))}: transformers' "
                "Qwen3Config sets sliding_window to None unless it is true, so the sliding layers lose their "
                "window",
            )
        )
    return out


def causal_flag(top: dict, dc: dict, key: str) -> tuple[bool | None, list[Problem]]:
    """``top[key]`` (``key`` "is_causal") or ``dc[key]`` ("causal", given as "dflash_config.causal"), a
    bool or None."""
    d, name = (dc, key.split(".", 1)[1]) if key.startswith("dflash_config.") else (top, key)
    v = d.get(name)
    if v is None:
        return None, []
    if not isinstance(v, bool):
        return None, [error(key, f"{shown(v)} is not true or false (a string would read as true)")]
    return v, []


def causal_reason(flags: list[tuple[str, bool | None]], default: str) -> str:
    """Why a server runs a layer causal: the first flag of ``flags`` (``(key, value)``) that is set, else
    ``default`` (its rule when none is)."""
    for key, v in flags:
        if v is not None:
            return f"{key} {'true' if v else 'false'}"
    return default


def bidirectional(types: list[str] | None, causal: list[bool], who: str, how: str) -> list[Problem]:
    """An error naming the layers ``who`` runs causal (``how``: why): the trainer's drafter sees its whole
    block."""
    if not types:
        return []
    bad = [i for i, c in enumerate(causal) if c]
    if not bad:
        return []
    return [
        error(
            "is_causal",
            f"{who} runs draft layer(s) {bad} causal within the block ({how}); the drafter "
            "was trained bidirectional within its block: write is_causal false",
        )
    ]


def dflash2_fields(dc: dict, got: dict | None, *, who: str) -> tuple[list[Problem], dict | None]:
    """The four DFlash 2 fields of ``dflash_config`` (all required, positive integers; ``conv_group_size``
    divides hidden_size, ``selector_top_k`` <= vocab_size): ``(problems, {key: value} or None)``."""
    out, vals = [], {}
    for k in DFLASH2_KEYS:
        v = dc.get(k, _MISSING)
        if missing(v):
            out.append(error(f"dflash_config.{k}", f"missing: {who} builds DFlash 2's modules from it"))
        elif not is_int(v) or v < 1:
            out.append(error(f"dflash_config.{k}", f"{shown(v)} is not a positive integer"))
        else:
            vals[k] = v
    if got and "conv_group_size" in vals and got["hidden_size"] % vals["conv_group_size"]:
        out.append(
            error(
                "dflash_config.conv_group_size",
                f"{vals['conv_group_size']} does not divide hidden_size {got['hidden_size']}",
            )
        )
    if got and "selector_top_k" in vals and vals["selector_top_k"] > got["vocab_size"]:
        out.append(
            error(
                "dflash_config.selector_top_k",
                f"{vals['selector_top_k']} exceeds vocab_size {got['vocab_size']}",
            )
        )
    return out, (vals if not out else None)


def logit_extras(dc: dict, who: str) -> list[Problem]:
    """DFlash 2's optional serving scales: the trainer trains without them (1.0, none, 1.0)."""
    out = []
    for k, neutral in (
        ("output_multiplier", (1, 1.0)),
        ("final_logit_softcapping", (None, 0, 0.0)),
        ("input_embedding_scale", (1, 1.0)),
    ):
        if k in dc and dc[k] not in neutral:
            bad = not is_number(dc[k]) or (k == "output_multiplier" and dc[k] <= 0)
            msg = f"{shown(dc[k])}: {who} applies it to the drafter's logits or inputs"
            out.append(
                error(f"dflash_config.{k}", msg + ": not a valid number")
                if bad
                else warning(f"dflash_config.{k}", msg + "; the trainer's drafters are trained without it")
            )
    return out


def config_checks(top: dict, who: str, dflash_keys, layer_modes) -> tuple[list[Problem], dict, tuple]:
    """The checks every server's ``check`` starts with, in order: the ``dflash_config`` object, structure and
    numbers, sizes, the server's own ``dflash_keys(top, dc, got) -> (problems, ids, n_target)``, layer types,
    sliding windows and the server's ``layer_modes(top, dc, types) -> problems``. Returns (the problems,
    ``dc``, (got, ids, n_target, types))."""
    dc, out = dflash_of(top)
    out += structure(top, who) + numerics(top)
    p, got = sizes(top)
    out += p
    p, ids, n_target = dflash_keys(top, dc, got)
    out += p
    p, types = layer_types(top, got and got["num_hidden_layers"])
    out += p + sliding(top, types) + layer_modes(top, dc, types)
    return out, dc, (got, ids, n_target, types)


def against_target(target, got: dict | None, n_target: int | None) -> list[Problem]:
    """The drafter against the target it will serve with (``--target``): same depth, width and vocabulary."""
    if target is None:
        return []
    out = []
    pairs = (
        ("num_target_layers", n_target, target.num_layers, "num_hidden_layers"),
        ("hidden_size", got and got["hidden_size"], target.hidden_size, "hidden_size"),
        ("vocab_size", got and got["vocab_size"], target.vocab_size, "vocab_size"),
    )
    for key, mine, theirs, their_key in pairs:
        if mine is not None and theirs is not None and mine != theirs:
            out.append(error(key, f"{mine}, but the target's {their_key} is {theirs}"))
    return out

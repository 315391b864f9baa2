"""DraftConfig from target configs, validation errors, and the export round trip (config + export)."""

import json

import pytest
import torch

from tests.support.model_util import random_embed, tiny_drafter, tiny_target_config
from trainer.drafting.config import DraftConfig, default_target_layer_ids
from trainer.model import load_drafter, save_drafter


def test_default_target_layer_ids_reference_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # published Qwen3-8B drafter
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    assert default_target_layer_ids(28, 1) == [14]
    assert default_target_layer_ids(36, 2) == [1, 33]
    # a short target: the reference rule would repeat layer 1, which servers capture once
    assert default_target_layer_ids(4, 2) == [0, 3] and default_target_layer_ids(4, 3) == [0, 2, 3]
    assert default_target_layer_ids(6, 2) == [1, 3]  # distinct: the reference rule stands
    with pytest.raises(ValueError, match="3 distinct target layers"):
        default_target_layer_ids(2, 3)


def test_from_target_config_takes_the_target_sizes():
    tc = tiny_target_config(pad_token_id=7)  # the pad token occurs in data: never the default mask
    cfg = DraftConfig.from_target_config(tc, num_draft_layers=3, block_size=8)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        64,
        128,
        4,
        2,
    )
    assert (cfg.head_dim, cfg.vocab_size, cfg.num_target_layers) == (16, 300, 4)
    assert cfg.target_layer_ids == default_target_layer_ids(4, 3)
    assert cfg.mask_token_id == 299  # last vocab id
    assert cfg.layer_types == ["full_attention"] * 3
    assert DraftConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_multimodal_config_uses_text_config_and_llama_rope_scaling():
    from transformers import LlamaConfig, Qwen3_5Config

    mm = Qwen3_5Config(
        text_config=dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=500,
        )
    )
    cfg = DraftConfig.from_target_config(mm, num_draft_layers=2)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_target_layers, cfg.vocab_size) == (64, 96, 8, 500)

    llama = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        vocab_size=300,
        max_position_embeddings=16384,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    cfg = DraftConfig.from_target_config(llama)
    assert cfg.rope_scaling["rope_type"] == "llama3" and cfg.head_dim == 16
    drafter, _ = tiny_drafter(target_config=llama, num_draft_layers=1)
    out = drafter(
        torch.randn(1, 12, 64),
        torch.randint(0, 299, (1, 12)),
        torch.zeros(1, 12, dtype=torch.long),
        torch.tensor([[5]]),
        random_embed(),
    )
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "rope",
    [
        None,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256,
        },
    ],
)
def test_rope_matches_transformers(rope):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    llama = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        vocab_size=300,
        max_position_embeddings=2048,
        rope_theta=5e5,
        rope_scaling=rope,
    )
    drafter, cfg = tiny_drafter(target_config=llama, num_draft_layers=1)
    pos = torch.tensor([[0, 1, 7, 300, 1500]])
    cos, sin = drafter._rope(pos, torch.float32)
    cos_ref, sin_ref = LlamaRotaryEmbedding(llama)(torch.zeros(1, 5, 64), pos)
    torch.testing.assert_close(cos, cos_ref)
    torch.testing.assert_close(sin, sin_ref)


@pytest.mark.parametrize(
    "kwargs, setting",
    [
        (dict(block_size=1), "block_size"),
        (dict(target_layer_ids=[0, 4]), "target_layer_ids"),
        (dict(target_layer_ids=[-1]), "target_layer_ids"),
        (dict(mask_token_id=300), "mask_token_id"),
        (dict(mask_token_id=-2), "mask_token_id"),
        (dict(num_draft_layers=2, layer_types=["full_attention"]), "layer_types"),
        (dict(layer_types=["local"]), "layer_types"),
        (dict(layer_types=["sliding_attention"]), "sliding_window"),
    ],
)
def test_bad_settings_are_named(kwargs, setting):
    with pytest.raises(ValueError, match=setting):
        DraftConfig.from_target_config(tiny_target_config(), **kwargs)


def test_unsupported_target_is_named():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model_type='gpt2'"):
        DraftConfig.from_target_config(GPT2Config())


def test_export_round_trip_is_bit_exact(tmp_path):
    drafter, cfg = tiny_drafter(layer_types=["sliding_attention", "full_attention"], sliding_window=6)
    drafter = drafter.to(torch.bfloat16)
    with torch.no_grad():  # non-default values everywhere, norms included
        for p in drafter.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_drafter(drafter, cfg, tmp_path / "export")
    loaded, cfg2 = load_drafter(tmp_path / "export")
    assert cfg2 == cfg
    sd, sd2 = drafter.state_dict(), loaded.state_dict()
    assert sd.keys() == sd2.keys()
    for k in sd:
        assert sd[k].dtype == sd2[k].dtype == torch.bfloat16
        assert torch.equal(sd[k], sd2[k]), k
    embed = random_embed().to(torch.bfloat16)
    args = (
        torch.randn(1, 16, 128),
        torch.randint(0, 299, (1, 16)),
        torch.zeros(1, 16, dtype=torch.long),
        torch.tensor([[3, 9]]),
        embed,
    )
    with torch.no_grad():
        assert torch.equal(drafter(*args), loaded(*args))


def test_a_drafter_of_the_removed_context_back_experiment_is_refused_by_its_key(tmp_path):
    # written by the trainer's former --context-back N (now lab/context_back/): an fc wider than this drafter's
    drafter, cfg = tiny_drafter()
    save_drafter(drafter, cfg, tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    for value in (0, None):  # never written by the trainer, but the same function as a plain drafter
        conf["dflash_config"]["context_back"] = value
        (tmp_path / "config.json").write_text(json.dumps(conf))
        assert load_drafter(tmp_path)[1] == cfg
    conf["dflash_config"]["context_back"] = 2
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(ValueError, match=r"dflash_config\.context_back=2"):
        load_drafter(tmp_path)
    with pytest.raises(ValueError, match=r"unknown DraftConfig settings: \['context_back'\]"):
        DraftConfig.from_dict({**cfg.to_dict(), "context_back": 2})


def test_export_layout_is_the_reference_one(tmp_path):
    from safetensors import safe_open
    from transformers import Qwen3Config

    drafter, cfg = tiny_drafter(block_size=8, mask_token_id=5)
    save_drafter(drafter, cfg, tmp_path)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"]
    assert conf["block_size"] == 8
    assert conf["dflash_config"] == {
        "block_size": 8,
        "mask_token_id": 5,
        "target_layer_ids": cfg.target_layer_ids,
    }
    assert conf["num_hidden_layers"] == 2 and conf["num_target_layers"] == 4
    assert conf["layer_types"] == ["full_attention"] * 2
    assert conf["hidden_size"] == 64 and conf["head_dim"] == 16 and conf["num_key_value_heads"] == 2
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())  # noqa: SIM118
    assert keys == set(drafter.state_dict())
    assert not any("embed" in k or "lm_head" in k for k in keys)
    import os
    import stat

    for fn in ("config.json", "model.safetensors"):  # readable by a server running as another user
        assert stat.S_IMODE(os.stat(tmp_path / fn).st_mode) == 0o644
    hf = Qwen3Config.from_pretrained(tmp_path)  # a plain Qwen3 config to transformers
    assert hf.num_hidden_layers == 2 and hf.hidden_size == 64

"""Target loading, capture (after-layer hidden states, packed documents, early stop) and FrozenHead."""

import pytest
import torch

from tests.support.model_util import tiny_target
from trainer.drafting.head import FrozenHead
from trainer.target.base import attach
from trainer.target.capture import capture, capture_of, load_target


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_capture_reads_after_layer_states_and_stops_early(target):
    ids = torch.randint(0, 299, (2, 12))
    doc = torch.zeros_like(ids)
    with torch.no_grad():
        ref = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    calls = []
    h = target.model.layers[3].register_forward_hook(lambda *a: calls.append(1))
    try:
        cat, final = capture(target, ids, doc, [0, 2])
    finally:
        h.remove()
    assert final is None
    assert calls == []  # layer 3 comes after the last captured layer: never run
    torch.testing.assert_close(cat, torch.cat([ref[1], ref[3]], dim=-1))
    cat2, final2 = capture(target, ids, doc, [1], need_final_hidden=True)
    torch.testing.assert_close(cat2, ref[2])
    torch.testing.assert_close(final2, ref[-1])  # last_hidden_state, after the final norm


def test_capture_keeps_packed_documents_apart(target):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 299, (1, 10), generator=g)
    b = torch.randint(0, 299, (1, 14), generator=g)
    packed = torch.cat([a, b], dim=1)
    doc = torch.zeros_like(packed)
    doc[:, 10:] = 1
    cat, final = capture(target, packed, doc, [0, 3], need_final_hidden=True)
    cat_b, final_b = capture(target, b, torch.zeros_like(b), [0, 3], need_final_hidden=True)
    cat_a, _ = capture(target, a, torch.zeros_like(a), [0, 3])
    torch.testing.assert_close(cat[:, 10:], cat_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final[:, 10:], final_b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cat[:, :10], cat_a, atol=1e-5, rtol=1e-5)


def test_load_target_truncates_to_the_last_captured_layer(tmp_path, target):
    target.save_pretrained(tmp_path, max_shard_size="200KB")  # sharded: index json path
    assert (tmp_path / "model.safetensors.index.json").exists()
    cut = load_target(str(tmp_path), "cpu", torch.float32, [0, 1])
    assert len(cut.model.layers) == 2
    assert not any(p.requires_grad for p in cut.parameters()) and not cut.training
    ids = torch.randint(0, 299, (1, 9))
    doc = torch.zeros_like(ids)
    torch.testing.assert_close(capture(cut, ids, doc, [0, 1])[0], capture(target, ids, doc, [0, 1])[0])
    full = load_target(str(tmp_path), "cpu", torch.float32, [1], need_final_hidden=True)
    assert len(full.model.layers) == 4
    with pytest.raises(ValueError, match="target_layer_ids"):
        load_target(str(tmp_path), "cpu", torch.float32, [4])


def test_frozen_head_reads_only_its_tensors(tmp_path, target):
    target.save_pretrained(tmp_path / "untied", max_shard_size="200KB")
    head = FrozenHead.from_pretrained(tmp_path / "untied", dtype=torch.float32)
    torch.testing.assert_close(head.embed_tokens.weight, target.model.embed_tokens.weight, rtol=0, atol=0)
    torch.testing.assert_close(head.lm_head.weight, target.lm_head.weight, rtol=0, atol=0)
    h = torch.randn(3, 64)
    torch.testing.assert_close(head.logits(h, prenorm=True), target.lm_head(target.model.norm(h)))
    assert not any(p.requires_grad for p in head.parameters())
    assert head.lm_head.weight.data_ptr() != head.embed_tokens.weight.data_ptr()

    tied = tiny_target(seed=3, tie_word_embeddings=True)
    tied.save_pretrained(tmp_path / "tied")
    head_t = FrozenHead.from_pretrained(tmp_path / "tied", dtype=torch.bfloat16)
    assert head_t.lm_head.weight is head_t.embed_tokens.weight
    assert head_t.embed_tokens.weight.dtype == torch.bfloat16
    torch.testing.assert_close(
        head_t.lm_head.weight.float(), tied.lm_head.weight.bfloat16().float(), rtol=0, atol=0
    )


def _llama_target(**over):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    kw = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    torch.manual_seed(0)
    if over.pop("mistral", False):
        cfg, cls = MistralConfig(**kw, **over), MistralForCausalLM
    else:
        cfg, cls = LlamaConfig(**kw, **over), LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    return cls(cfg).eval()


@pytest.mark.parametrize("kind", ["qwen3", "llama3_rope", "mistral_window"])
def test_direct_capture_equals_the_transformers_forward(kind):
    """prepare_capture's own layer loop (dense per-document mask on CPU) == transformers' forward + hooks."""
    from trainer.target.capture import prepare_capture

    if kind == "qwen3":
        model = tiny_target()
    elif kind == "llama3_rope":
        model = _llama_target(
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        )
    else:
        model = _llama_target(mistral=True, sliding_window=7)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 299, (2, 40), generator=g)
    doc = torch.zeros_like(ids)
    doc[0, 13:] = 1
    doc[0, 30:] = 2
    doc[1, 35:] = -1  # right padding
    ref, ref_final = capture(model, ids, doc, [0, 2], need_final_hidden=True)
    ref_one_doc, _ = capture(model, ids, torch.zeros_like(doc), [0, 2])
    assert prepare_capture(model, compile=False) == "sdpa"
    try:
        out, final = capture(model, ids, doc, [2, 0], need_final_hidden=True)
        torch.testing.assert_close(out, torch.cat([ref[..., 64:], ref[..., :64]], -1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(final, ref_final, atol=1e-5, rtol=1e-5)
        one_doc, none = capture(model, ids, torch.zeros_like(doc), [0, 2])
        assert none is None
        torch.testing.assert_close(one_doc, ref_one_doc, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(one_doc[0, 13:, :64], out[0, 13:, 64:], atol=1e-3)  # documents do matter
    finally:
        attach(model, None)


def test_direct_capture_refuses_what_it_cannot_run():
    from trainer.target.capture import prepare_capture

    model = tiny_target()
    with pytest.raises(ValueError, match="attn"):
        prepare_capture(model, attn="fast")
    model.config.model_type = "gpt2"  # not a decoder the direct loop knows: the hook path stays
    try:
        assert prepare_capture(model) is None and capture_of(model).kind == "hooks"
    finally:
        model.config.model_type = "qwen3"

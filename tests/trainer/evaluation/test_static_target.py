"""The static-buffer target (``static_target.StaticTarget``, the GPU evaluation's engine) computes what the
model's own cached forward computes (``CachedTarget``, transformers' DynamicCache): prefill logits and
features over a prompt longer than one chunk, target-only greedy output, speculative output with a rejected
draft in every block (the hybrid's Gated DeltaNet state rolled back from the verify forward's per-position
states), on a tiny dense Qwen3 and a tiny Qwen3.5 hybrid (fp32, CPU: the same code the CUDA graphs capture)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.evaluation.test_spec_decode import BS, Oracle
from trainer.evaluation.spec_decode import CachedTarget, speculative_generate, target_generate
from trainer.evaluation.static_target import StaticTarget, static_target_problem

LAYERS = [1, 3]
NEW = 24


def _model(assets, scale: bool):
    from trainer.evaluation.load import load_target_model

    model = load_target_model(str(assets / "target"), "cpu", torch.float32)
    if scale:  # so that the continuation depends on the history (see test_spec_decode_hybrid)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("linear_attn.out_proj.weight", "self_attn.o_proj.weight")):
                    p.mul_(10.0)
    return model


@pytest.fixture(scope="module", params=["dense", "hybrid"])
def model(request):
    if request.param == "dense":
        return _model(request.getfixturevalue("tiny_assets"), False)
    return _model(request.getfixturevalue("tiny_hybrid"), True)


def _prompt(model, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.get_text_config().vocab_size - 10, (n,), generator=g).tolist()


def test_prefill_over_chunks_gives_the_models_logits_and_features(model):
    prompt = _prompt(model, 150, 0)  # three chunks of at most 64
    ref_logits, ref_feats = CachedTarget(model, LAYERS).prefill(prompt)
    st = StaticTarget(model, LAYERS, max_len=256)
    logits, feats = st.prefill(prompt)
    assert st.len == len(prompt) and feats.shape == ref_feats.shape
    torch.testing.assert_close(logits[-1], ref_logits[-1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(feats, ref_feats, rtol=1e-4, atol=1e-4)


def test_greedy_and_speculative_output_equal_the_models_own(model):
    vocab = model.config.get_text_config().vocab_size
    ref_t, st = CachedTarget(model, LAYERS), StaticTarget(model, LAYERS, max_len=200, graph_sizes=(1, BS))
    for seed in (1, 2):
        p = _prompt(model, 20, seed)
        ref = p + target_generate(ref_t, p, NEW + 2 * BS).tokens
        assert target_generate(st, p, NEW + 2 * BS).tokens == ref[len(p) :]
        for right in (2, BS - 1):
            g = speculative_generate(st, Oracle(ref, right, vocab), p, NEW)
            assert g.tokens == ref[len(p) : len(p) + NEW]
            assert set(g.accept_lens) == {right + 1} and g.rewind_forwards == 0


def test_a_crop_inside_the_verify_block_leaves_the_state_of_the_kept_tokens(model):
    """After a verify block cropped at each length, the next block's logits equal those of a target that only
    ever saw the kept tokens."""
    p, block = _prompt(model, 30, 3), _prompt(model, BS, 4)
    after = _prompt(model, 3, 5)
    for keep in (1, 4, BS):
        st = StaticTarget(model, LAYERS, max_len=64)
        st.prefill(p)
        st.forward_block(block, rewindable=True)
        st.crop(len(p) + keep)
        got, _ = st.forward_block(after)
        fresh = StaticTarget(model, LAYERS, max_len=64)
        fresh.prefill(p + block[:keep])
        want, _ = fresh.forward_block(after)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bad_use_is_refused(model, tiny_hybrid_moe):
    st = StaticTarget(model, LAYERS, max_len=40)
    st.prefill(_prompt(model, 30, 6))
    with pytest.raises(ValueError, match="more than max_len 40"):
        st.forward_block(_prompt(model, BS + 4, 7))
    if st.linear:
        st.forward_block([1, 2])
        st.forward_block([3])  # not rewindable: the states of [1, 2] are gone
        with pytest.raises(ValueError, match="can only go back"):
            st.crop(31)
    moe = _model(tiny_hybrid_moe, False)
    assert "mixture-of-experts" in static_target_problem(moe)
    with pytest.raises(ValueError, match="mixture-of-experts"):
        StaticTarget(moe, LAYERS, max_len=40)

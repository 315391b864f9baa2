"""The decoding loop on hybrid linear-attention targets (tiny random Qwen3.5, dense and MoE; fp32 on CPU):
a rejected block must leave the Gated DeltaNet conv and recurrent states as if only the accepted tokens had
been seen.

A tiny random model at its init scale is nearly a bigram model (its greedy output hardly depends on anything
but the last token), so a state left wrong would go unseen in its output; the fixture scales the mixers'
output projections so that the continuation depends on the history, and checks that it does."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.evaluation.test_spec_decode import Oracle
from trainer.evaluation.report import summarize
from trainer.evaluation.spec_decode import CachedTarget, speculative_generate, target_generate

torch.set_num_threads(1)

BS = 8
NEW = 24
HYBRIDS = ["tiny_hybrid", "tiny_hybrid_moe"]


class CheckedTarget(CachedTarget):
    """Also checks every verify forward: its logits equal a fresh, cache-free forward of the target over the
    accepted tokens plus the block (the distributions the acceptance rule sees are the target's own)."""

    def __init__(self, model, layer_ids):
        super().__init__(model, layer_ids)
        self.ids: list[int] = []
        self.checked = 0
        self.check = False

    def prefill(self, prompt, want_features=True):
        self.ids = list(prompt)
        return super().prefill(prompt, want_features)

    def forward_block(self, ids, want_features=True, rewindable=False):
        assert len(self.ids) == self.len
        logits, feats = super().forward_block(ids, want_features, rewindable)
        self.ids += list(ids)
        if rewindable and self.check:
            with torch.no_grad():
                ref = self.model(input_ids=torch.tensor([self.ids])).logits[0, -len(ids) :]
            torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
            self.checked += 1
        return logits, feats

    def crop(self, n):
        super().crop(n)
        self.ids = self.ids[:n]


def _states(t: CachedTarget) -> list[torch.Tensor]:
    out = []
    for layer in t.cache.layers:
        for name in ("conv_states", "recurrent_states"):
            out += [v for v in (getattr(layer, name, None) or {}).values() if torch.is_tensor(v)]
        keys = getattr(layer, "keys", None)
        if torch.is_tensor(keys) and keys.dim() >= 2:
            out += [keys, layer.values]
    return out


def _load(assets):
    from tests.support.model_util import tiny_prompts
    from trainer.evaluation.load import load_target_model

    torch.manual_seed(0)
    model = load_target_model(str(assets / "target"), "cpu", torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("linear_attn.out_proj.weight", "self_attn.o_proj.weight")):
                p.mul_(10.0)
    target = CheckedTarget(model, [1, 3])
    target.prefill([1])
    assert any(hasattr(ly, "recurrent_states") for ly in target.cache.layers)
    a = target_generate(target, [5, 9, 17, 33, 40], 16).tokens
    b = target_generate(target, [77, 3, 101, 60, 40], 16).tokens
    assert a != b, "the greedy continuation must depend on more than the last token"
    prompts = tiny_prompts(assets, 2)
    refs = [p + target_generate(target, p, NEW + 2 * BS).tokens for p in prompts]
    return model, target, prompts, refs


@pytest.fixture(scope="module")
def tiny_hybrid_loaded(tiny_hybrid):
    return _load(tiny_hybrid)


@pytest.fixture(scope="module")
def tiny_hybrid_moe_loaded(tiny_hybrid_moe):
    return _load(tiny_hybrid_moe)


@pytest.fixture
def setup(request):
    """(model, target, prompts, their greedy references) of the hybrid named by the test's parameter."""
    return request.getfixturevalue(request.param + "_loaded")


# the dense hybrid at j = 0, 3, BS - 1; the MoE one at j = 2 (time)
@pytest.mark.parametrize(
    "setup,right",
    [("tiny_hybrid", 0), ("tiny_hybrid", 3), ("tiny_hybrid", BS - 1), ("tiny_hybrid_moe", 2)],
    indirect=["setup"],
)
def test_an_oracle_right_on_j_positions_gets_j_plus_1_and_the_greedy_output(setup, right):
    model, target, prompts, refs = setup
    lens, rewinds = [], 0
    for p, ref in zip(prompts, refs, strict=True):
        g = speculative_generate(target, Oracle(ref, right, model.config.vocab_size), p, NEW)
        assert g.tokens == ref[len(p) : len(p) + NEW]  # token for token the target's greedy output
        lens += g.accept_lens
        rewinds += g.rewind_forwards
    s = summarize(lens, BS)
    assert s["mean_accept_len"] == right + 1
    assert s["per_position"] == [1.0] * right + [0.0] * (BS - 1 - right)
    # one extra forward per verify step that rejected a draft; none when every block is kept whole
    assert rewinds == (0 if right == BS - 1 else len(lens))


@pytest.mark.parametrize("setup", HYBRIDS, indirect=True)
def test_the_state_after_rejections_is_that_of_the_accepted_tokens(setup):
    model, target, prompts, refs = setup
    p, ref = prompts[0], refs[0]
    checked, target.check = target.checked, True
    g = speculative_generate(target, Oracle(ref, 2, model.config.vocab_size), p, NEW)
    assert g.rewind_forwards == len(g.accept_lens) > 3 and target.checked - checked == len(g.accept_lens)
    fresh = CachedTarget(model, [1, 3])
    fresh.prefill(ref[: target.len])
    got, want = _states(target), _states(fresh)
    assert len(got) == len(want) > 0
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    target.check = False


@pytest.mark.parametrize("setup", ["tiny_hybrid"], indirect=True)
def test_sampling_with_the_real_drafter_verifies_against_the_targets_own_distributions(setup):
    from tests.support.model_util import tiny_drafter
    from trainer.evaluation.drafter_cache import DrafterProposer

    model, target, prompts, refs = setup
    drafter, _ = tiny_drafter(target_config=model.config, block_size=BS, target_layer_ids=[1, 3])
    prop = DrafterProposer(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    g = speculative_generate(target, prop, prompts[0], NEW)  # greedy: the target's own output
    assert g.tokens == refs[0][len(prompts[0]) : len(prompts[0]) + NEW]
    checked, target.check = target.checked, True
    g = speculative_generate(target, prop, prompts[1], NEW, 1.0, torch.Generator().manual_seed(0))
    target.check = False
    assert len(g.tokens) == NEW and g.rewind_forwards > 0
    assert target.checked - checked == len(g.accept_lens)  # every verify step matched a fresh forward


def test_evaluate_on_a_hybrid_target_directory(tiny_hybrid_moe, tmp_path):
    """``trainer.evaluate``'s own path (in process): the Qwen3.5 MoE directory as saved (multimodal wrapper),
    a drafter built from its config, the report's roll-back count."""
    from transformers import AutoConfig

    from trainer.drafting.config import DraftConfig
    from trainer.evaluation.run import build_parser, check_args, evaluate
    from trainer.model import DFlashDrafter, save_drafter

    target_dir = tiny_hybrid_moe / "target"
    cfg = DraftConfig.from_target_config(
        AutoConfig.from_pretrained(target_dir), num_draft_layers=1, block_size=4
    )
    torch.manual_seed(0)
    save_drafter(DFlashDrafter(cfg), cfg, tmp_path / "drafter")
    a = build_parser().parse_args(
        [
            "--target-model",
            str(target_dir),
            "--drafter",
            str(tmp_path / "drafter"),
            "--prompts",
            str(tiny_hybrid_moe / "data"),
            "--num-prompts",
            "2",
            "--max-new-tokens",
            "16",
            "--device",
            "cpu",
            "--ignore-eos",
        ]  # fmt: skip
    )
    check_args(a)
    rep = evaluate(a)
    assert rep["greedy_match"] is True and rep["new_tokens"] == 2 * 16
    # one roll-back forward per verify step that rejected a draft
    assert rep["rewind_forwards"] == rep["verify_steps"] - rep["histogram"][-1] > 0


def test_a_sliding_window_target_is_refused_with_a_clear_error():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trainer.evaluation.load import EvalError

    cfg = Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, use_sliding_window=True, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    torch.manual_seed(0)
    target = CachedTarget(Qwen3ForCausalLM(cfg).eval(), [0])
    with pytest.raises(EvalError, match="layer 0 is sliding-window attention"):
        speculative_generate(target, None, [1, 2, 3], 4)

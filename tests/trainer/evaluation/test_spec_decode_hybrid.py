"""The decoding loop on hybrid linear-attention targets (tiny random Qwen3.5, dense and MoE; fp32 on CPU):
a rejected block must leave the Gated DeltaNet conv and recurrent states as if only the accepted tokens had
been seen, in both roll-back modes (``rewind="states"``: the verify forward's per-position states, no extra
forward; ``"replay"``: snapshot, restore and run the kept tokens again).

A tiny random model at its init scale is nearly a bigram model (its greedy output hardly depends on anything
but the last token), so a state left wrong would go unseen in its output; the fixture scales the mixers'
output projections so that the continuation depends on the history, and checks that it does."""

from __future__ import annotations

import re

import pytest
import torch

from tests.trainer.evaluation.test_spec_decode import Oracle
from trainer.evaluation.report import summarize
from trainer.evaluation.spec_decode import CachedTarget, speculative_generate, target_generate

BS = 8
NEW = 24
HYBRIDS = ["tiny_hybrid", "tiny_hybrid_moe"]
MODES = ["states", "replay"]


class CheckedTarget(CachedTarget):
    """Also checks every verify forward: its logits equal a fresh, cache-free forward of the target over the
    accepted tokens plus the block (the distributions the acceptance rule sees are the target's own)."""

    def __init__(self, model, layer_ids, rewind="states"):
        super().__init__(model, layer_ids, rewind)
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
    target = CheckedTarget(model, [1, 3], "replay")
    target.prefill([1])
    assert any(hasattr(ly, "recurrent_states") for ly in target.cache.layers)
    a = target_generate(target, [5, 9, 17, 33, 40], 16).tokens
    b = target_generate(target, [77, 3, 101, 60, 40], 16).tokens
    assert a != b, "the greedy continuation must depend on more than the last token"
    prompts = tiny_prompts(assets, 2)
    refs = [p + target_generate(target, p, NEW + 2 * BS).tokens for p in prompts]
    return model, {m: CheckedTarget(model, [1, 3], m) for m in MODES}, prompts, refs


@pytest.fixture(scope="module")
def tiny_hybrid_loaded(tiny_hybrid):
    return _load(tiny_hybrid)


@pytest.fixture(scope="module")
def tiny_hybrid_moe_loaded(tiny_hybrid_moe):
    return _load(tiny_hybrid_moe)


@pytest.fixture
def setup(request):
    """(model, its targets by roll-back mode, prompts, their greedy references) of the hybrid named by the
    test's parameter."""
    return request.getfixturevalue(request.param + "_loaded")


# the dense hybrid at j = 0, 3, BS - 1 by states, j = 3 by replay; the MoE one at j = 2 both ways (time)
@pytest.mark.parametrize(
    "setup,right,mode",
    [
        ("tiny_hybrid", 0, "states"), ("tiny_hybrid", 3, "states"), ("tiny_hybrid", BS - 1, "states"),
        ("tiny_hybrid", 3, "replay"), ("tiny_hybrid_moe", 2, "states"), ("tiny_hybrid_moe", 2, "replay"),
    ],
    indirect=["setup"],
)  # fmt: skip
def test_an_oracle_right_on_j_positions_gets_j_plus_1_and_the_greedy_output(setup, right, mode):
    model, targets, prompts, refs = setup
    lens, rewinds = [], 0
    for p, ref in zip(prompts, refs, strict=True):
        g = speculative_generate(targets[mode], Oracle(ref, right, model.config.vocab_size), p, NEW)
        assert g.tokens == ref[len(p) : len(p) + NEW]  # token for token the target's greedy output
        lens += g.accept_lens
        rewinds += g.rewind_forwards
    s = summarize(lens, BS)
    assert s["mean_accept_len"] == right + 1
    assert s["per_position"] == [1.0] * right + [0.0] * (BS - 1 - right)
    # replay: one extra forward per verify step that rejected a draft, none when every block is kept whole;
    # states: never one
    assert rewinds == (0 if right == BS - 1 or mode == "states" else len(lens))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("setup", HYBRIDS, indirect=True)
def test_the_state_after_rejections_is_that_of_the_accepted_tokens(setup, mode):
    model, targets, prompts, refs = setup
    target, p, ref = targets[mode], prompts[0], refs[0]
    checked, target.check = target.checked, True
    g = speculative_generate(target, Oracle(ref, 2, model.config.vocab_size), p, NEW)
    assert len(g.accept_lens) > 3 and target.checked - checked == len(g.accept_lens)
    assert g.rewind_forwards == (len(g.accept_lens) if mode == "replay" else 0)
    fresh = CachedTarget(model, [1, 3])
    fresh.prefill(ref[: target.len])
    got, want = _states(target), _states(fresh)
    assert len(got) == len(want) > 0
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    target.check = False


@pytest.mark.parametrize("setup", HYBRIDS, indirect=True)
def test_states_and_replay_agree_after_a_crop_at_every_length(setup):
    """One verify block, cropped after each of its positions: the per-position states picked by "states" equal
    what "replay" recomputes (every conv, recurrent and KV state), and so do both the verify logits and the
    logits of the next block; "states" ran no extra forward."""
    model, targets, prompts, refs = setup
    p, ref = prompts[1], refs[1]
    block, after = ref[len(p) : len(p) + BS], ref[len(p) + BS : len(p) + BS + 3]
    vocab = model.config.vocab_size
    for keep in range(1, BS + 1):
        runs = {}
        for mode in MODES:
            t = CachedTarget(model, [1, 3], mode)
            t.prefill(p)
            verify, _ = t.forward_block(block, rewindable=True)
            t.crop(len(p) + keep)
            nxt, _ = t.forward_block([(block[keep - 1] + 1) % vocab, *after], rewindable=True)
            runs[mode] = (t, verify, nxt)
        (s, v_s, n_s), (r, v_r, n_r) = runs["states"], runs["replay"]
        assert s.rewind_forwards == 0 and r.rewind_forwards == (1 if keep < BS else 0)
        torch.testing.assert_close(v_s, v_r, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(n_s, n_r, rtol=1e-5, atol=1e-5)
        got, want = _states(s), _states(r)
        assert len(got) == len(want) > 0
        for x, y in zip(got, want, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("setup", ["tiny_hybrid"], indirect=True)
def test_sampling_with_the_real_drafter_verifies_against_the_targets_own_distributions(setup, mode):
    from tests.support.model_util import tiny_drafter
    from trainer.evaluation.drafter_cache import DrafterProposer

    model, targets, prompts, refs = setup
    target = targets[mode]
    drafter, _ = tiny_drafter(target_config=model.config, block_size=BS, target_layer_ids=[1, 3])
    prop = DrafterProposer(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    g = speculative_generate(target, prop, prompts[0], NEW)  # greedy: the target's own output
    assert g.tokens == refs[0][len(prompts[0]) : len(prompts[0]) + NEW]
    checked, target.check = target.checked, True
    g = speculative_generate(target, prop, prompts[1], NEW, 1.0, torch.Generator().manual_seed(0))
    target.check = False
    assert len(g.tokens) == NEW and min(g.accept_lens) < BS  # some drafts were rejected
    assert (g.rewind_forwards > 0) if mode == "replay" else (g.rewind_forwards == 0)
    assert target.checked - checked == len(g.accept_lens)  # every verify step matched a fresh forward


@pytest.mark.parametrize("setup", ["tiny_hybrid"], indirect=True)
def test_a_block_too_long_to_record_falls_back_to_a_replay(setup):
    from trainer.evaluation.linear_states import MAX_BLOCK

    model, _, prompts, refs = setup
    p, ref = prompts[0], refs[0]
    t = CachedTarget(model, [1, 3])  # "states"
    t.prefill(p)
    long_block = (ref[len(p) :] * (MAX_BLOCK // len(ref) + 2))[: MAX_BLOCK + 1]
    t.forward_block(long_block, rewindable=True)
    t.crop(len(p) + 3)
    assert t.rewind_forwards == 1
    fresh = CachedTarget(model, [1, 3])
    fresh.prefill(p + long_block[:3])
    for x, y in zip(_states(t), _states(fresh), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="rewind: expected one of"):
        CachedTarget(model, [1, 3], "snapshot")


@pytest.mark.parametrize("rewind", MODES)
def test_evaluate_on_a_hybrid_target_directory(tiny_hybrid_moe, tmp_path, rewind, capsys):
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
            "--rewind",
            rewind,
        ]  # fmt: skip
    )
    check_args(a)
    rep = evaluate(a, show_progress="lines")
    assert rep["greedy_match"] is True and rep["new_tokens"] == 2 * 16 and rep["rewind"] == rewind
    # rejected drafts: rolled back from the verify forward's own per-position states (no extra forward), or
    # by running the kept tokens again
    assert rep["verify_steps"] - rep["histogram"][-1] > 0
    assert (rep["rewind_forwards"] == 0) == (rewind == "states")
    err = capsys.readouterr().err  # progress as lines (not a terminal), from before the first prompt
    assert "evaluate: 2 prompt(s) x 16 new tokens on cpu (cache, 1 thread(s)); warming up" in err
    assert re.search(r"evaluate: 2/2 prompts  accept [0-9.]+  spec [0-9,]+ tok/s  target [0-9,]+ tok/s", err)


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


def test_a_bf16_target_rolls_back_by_states_as_by_replay(tiny_hybrid):
    """The GPU runs the target in bf16: the recorded Gated DeltaNet forward (fp32 inside) hands the norm and
    out_proj the model's dtype, and the verify logits and the states after a crop agree with replay's."""
    from tests.support.model_util import tiny_prompts
    from trainer.evaluation.load import load_target_model

    model = load_target_model(str(tiny_hybrid / "target"), "cpu", torch.bfloat16)
    p = tiny_prompts(tiny_hybrid, 1)[0]
    block = [(t * 7 + 3) % model.config.vocab_size for t in range(BS)]
    runs = {}
    for mode in MODES:
        t = CachedTarget(model, [1, 3], mode)
        t.prefill(p)
        verify, feats = t.forward_block(block, rewindable=True)
        t.crop(len(p) + 3)
        nxt, _ = t.forward_block(block[3:6], rewindable=True)
        runs[mode] = (t, verify, feats, nxt)
    (s, v_s, f_s, n_s), (r, v_r, f_r, n_r) = runs["states"], runs["replay"]
    assert (
        v_s.dtype == f_s.dtype == f_r.dtype == torch.bfloat16
        and s.rewind_forwards == 0
        and r.rewind_forwards == 1
    )
    torch.testing.assert_close(v_s, v_r, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(n_s, n_r, rtol=5e-2, atol=5e-2)
    for x, y in zip(_states(s), _states(r), strict=True):
        torch.testing.assert_close(x.float(), y.float(), rtol=5e-2, atol=5e-2)

"""``linear_states.gated_delta_states``: the closed-form states after every position of a block equal those of
transformers' own token-by-token gated delta rule, run over each prefix of the block (fp32, CPU)."""

from __future__ import annotations

import inspect

import pytest
import torch

from trainer.evaluation.linear_states import gated_delta_states


def _reference(q, k, v, g, beta, s0):
    """transformers' torch recurrence (the function under its kernel-routing wrapper), q/k repeated to the
    value heads as the model does before calling it."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    rule = inspect.unwrap(m.torch_recurrent_gated_delta_rule)
    rep = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    return rule(
        q, k, v, g, beta, initial_state=s0.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True
    )


@pytest.mark.parametrize("T,hk,hv", [(1, 2, 2), (8, 2, 4), (16, 1, 3)])
def test_every_positions_state_and_output_match_the_token_by_token_rule(T, hk, hv):
    torch.manual_seed(T)
    dk, dv = 16, 8
    q, k = torch.randn(2, T, hk, dk), torch.randn(2, T, hk, dk)
    v = torch.randn(2, T, hv, dv)
    g = -3 * torch.rand(2, T, hv)  # log decays <= 0
    beta = torch.rand(2, T, hv)
    s0 = torch.randn(2, hv, dk, dv)
    out, states = gated_delta_states(q, k, v, g, beta, s0)
    assert states.shape == (2, hv, T + 1, dk, dv)
    torch.testing.assert_close(states[:, :, 0], s0)
    ref_out, _ = _reference(q, k, v, g, beta, s0)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for t in range(1, T + 1):
        _, after_t = _reference(q[:, :t], k[:, :t], v[:, :t], g[:, :t], beta[:, :t], s0)
        torch.testing.assert_close(states[:, :, t], after_t, rtol=1e-5, atol=1e-5)

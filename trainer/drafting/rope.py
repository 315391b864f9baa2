"""Rotary position embedding (RoPE), one implementation for the drafter and the direct target capture.

- ``rope_inv_freq(cfg) -> (inv_freq (head_dim/2,), attention scaling)`` for a ``DraftConfig``'s RoPE variant
  (plain ``rope_theta``, or any transformers ``rope_scaling`` type through its own init functions);
- ``rope_cos_sin(pos, inv_freq, scale, dtype) -> (cos, sin)``, each ``(*pos.shape, head_dim)``;
- ``apply_rope(x, cos, sin, unsqueeze_dim=1)``: ``x * cos + rotate_half(x) * sin`` with ``cos``/``sin``
  ``(B, L, D)`` broadcast over the heads axis of ``x`` (``unsqueeze_dim=1``: ``x`` is ``(B, heads, L, D)``,
  the drafter's layout; ``2``: ``(B, L, heads, D)``, the direct target capture's, whose cos/sin come from the
  target decoder's own ``rotary_emb``).
"""

from __future__ import annotations

import torch

from trainer.drafting.config import DraftConfig


def rope_inv_freq(cfg: DraftConfig, device=None) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,), attention scaling) for the config's RoPE variant."""
    if cfg.rope_scaling is None:
        exps = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device=device) / cfg.head_dim
        return 1.0 / (cfg.rope_theta**exps), 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = dict(cfg.rope_scaling)
    params["rope_theta"] = cfg.rope_theta
    hf = Qwen3Config(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters=params,
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, device)
    return inv_freq.float(), float(scale)


def rope_cos_sin(
    pos: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin at positions ``pos`` (any shape; computed in fp32, returned in ``dtype``)."""
    freqs = pos.float().unsqueeze(-1) * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> torch.Tensor:
    """x: (B, heads, L, D) (``unsqueeze_dim=1``) or (B, L, heads, D) (``2``); cos/sin: (B, L, D)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return x * cos + rotate_half(x) * sin

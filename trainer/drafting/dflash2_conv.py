"""DFlash 2's grouped dynamic depthwise causal convolution, wrapped around every attention and MLP sublayer.

The published layout (vLLM ``qwen3_dflash2.py`` ``DFlashGroupedConv``; vllm-project/speculators
``GroupedDynamicCausalConv``, adapted from z-lab/dflash ``dflash/model.py``): per sublayer one module with

- ``base_kernel`` ``(2, taps, hidden)``: the static per-channel kernel, side 0 for the sublayer's input, side 1
  for its output;
- ``kernel_projection`` (``Linear(hidden, 2 * taps * groups)``, no bias): the content-dependent correction,
  one coefficient per tap and group of ``group_size`` channels, computed from the sublayer's (normed) input.

``out[p] = sum_t (base[t] + delta[p, t, group]) * x[p - t]`` over taps ``t`` with ``p - t`` in the same block:
slot ``k`` of a block mixes in slots ``k - 1 .. k - taps + 1`` of that block only: never a later slot, never
the slot of another block (position 0 of a block, the anchor, sees only itself). The sequence axis must hold
whole blocks of ``block_size`` slots back to back (training: ``A`` blocks per row; inference: one block).

Initialised as the identity (``base[:, 0] = 1``, the rest 0, the projection 0): a fresh DFlash 2 layer
computes exactly what the DFlash 1 layer with the same weights does.

``prepare(x) -> (conv_in(x), delta_out)`` then ``finish(y, delta_out) -> conv_out(y)``, as the references.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def grouped_causal_conv(
    x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int, group_size: int
) -> torch.Tensor:
    """``x`` ``(B, L, H)`` with ``L`` a multiple of ``block_size``; ``delta`` ``(B, L, taps, groups)``;
    ``base`` ``(taps, H)``. Returns ``(B, L, H)``."""
    B, L, H = x.shape
    taps = base.shape[0]
    if L % block_size:
        raise ValueError(f"sequence length {L} is not a whole number of blocks of {block_size}")
    groups = H // group_size
    xb = x.view(B, L // block_size, block_size, groups, group_size)
    coef = base.view(1, 1, 1, taps, groups, group_size).to(x.dtype) + delta.view(
        B, L // block_size, block_size, taps, groups, 1
    ).to(x.dtype)
    out = coef[:, :, :, 0] * xb
    for t in range(1, taps):
        # shift by t slots inside each block (dim 2), zeros entering at the block's start
        shifted = F.pad(xb[:, :, : block_size - t], (0, 0, 0, 0, t, 0))
        out = out + coef[:, :, :, t] * shifted
    return out.view(B, L, H)


class GroupedDynamicConv(nn.Module):
    def __init__(self, hidden_size: int, block_size: int, kernel_size: int, group_size: int):
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size ({group_size}) must divide hidden_size ({hidden_size})")
        if kernel_size > block_size:
            raise ValueError(f"conv_kernel_size ({kernel_size}) cannot exceed block_size ({block_size})")
        self.block_size, self.kernel_size, self.group_size = block_size, kernel_size, group_size
        self.num_groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.num_groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The identity: tap 0 weighs 1, every other tap and the dynamic correction 0."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0].fill_(1.0)
            self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, L, _ = x.shape
        delta = self.kernel_projection(x).view(B, L, 2, self.kernel_size, self.num_groups)
        out = grouped_causal_conv(x, delta[:, :, 0], self.base_kernel[0], self.block_size, self.group_size)
        return out, delta[:, :, 1]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return grouped_causal_conv(y, delta, self.base_kernel[1], self.block_size, self.group_size)

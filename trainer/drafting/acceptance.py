"""The acceptance-length estimate of a training step's blocks, as a decoding loop would count it.

``decode_walk(anchors (B, A), chain (B, A), valid (B, A)) -> (tokens, steps)`` (0-d long tensors, no host sync)

Speculative decoding does not start a block at every position: after a verify step that accepted ``c``
drafted tokens after anchor ``p``, the next block starts at ``p + c + 1`` (the bonus token). Easy stretches
(long chains) are crossed in few steps and hard ones take a step per token, so the mean over uniformly
sampled anchors of ``c + 1`` over-reads the served acceptance length (tokens / verify steps): every anchor
inside an easy stretch counts a long chain. This walks each row's sorted anchors the way decoding would:
from the row's first anchor, each step accepts ``chain + 1`` tokens and the next step starts at the first
anchor at or after ``p + chain + 1`` (the exact position when every position is an anchor; the next sampled
one otherwise). ``tokens / steps`` summed over rows is the estimate. The walk runs on the device by pointer
doubling: ``ceil(log2(A + 1))`` gathers over ``(B, A + 1)``; no loop over anchors, no sync.
"""

from __future__ import annotations

import torch


def decode_walk(
    anchors: torch.Tensor, chain: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum over rows of the tokens the walk accepts, sum of its verify steps)``; ``anchors`` sorted
    ascending per row with padding (``valid`` False) after the real ones, ``chain`` the accepted drafted
    tokens of each block (the bonus token is added here)."""
    if not (anchors.shape == chain.shape == valid.shape) or anchors.dim() != 2:
        raise ValueError(
            f"anchors, chain and valid must be one (B, A) shape: {anchors.shape}, {chain.shape}, {valid.shape}"
        )
    B, A = anchors.shape
    device = anchors.device
    big = torch.iinfo(torch.long).max // 4
    pos = torch.where(valid, anchors.long(), torch.full_like(anchors, big, dtype=torch.long))
    step_len = torch.where(valid, chain.long() + 1, torch.zeros_like(chain, dtype=torch.long))
    nxt = torch.searchsorted(pos.contiguous(), (pos + step_len).contiguous())  # (B, A) in [0, A]
    nxt = torch.where(valid, nxt, torch.full_like(nxt, A))
    sentinel = torch.full((B, 1), A, dtype=torch.long, device=device)
    up = torch.cat([nxt, sentinel], dim=1)  # node A: the end, absorbing
    tok = torch.cat([step_len, torch.zeros((B, 1), dtype=torch.long, device=device)], dim=1)
    cnt = torch.cat([valid.long(), torch.zeros((B, 1), dtype=torch.long, device=device)], dim=1)
    span = 1
    while span < A + 1:  # after this, tok[:, j] / cnt[:, j]: the whole walk from node j
        tok = tok + torch.gather(tok, 1, up)
        cnt = cnt + torch.gather(cnt, 1, up)
        up = torch.gather(up, 1, up)
        span *= 2
    return tok[:, 0].sum(), cnt[:, 0].sum()

"""The verification rule of block speculative decoding: how many drafted tokens the target accepts, and the
token it adds.

``accept_block(target_logits (B, K + 1, V), draft_tokens (B, K), draft_probs (B, K, V) or None, temperature,
generator) -> (accepted (B,) long in 0..K, next_token (B,) long)``. Row ``b``: ``target_logits[b, i]`` is the
target's next-token distribution after the anchor and drafted tokens ``1..i``; drafted token ``k`` (1-based)
is checked against row ``k - 1``.

- temperature 0: the longest prefix of drafted tokens equal to the target's argmax, then the target's argmax
  after it (the bonus token; the first correction on a mismatch). The output is the target's greedy output.
- temperature > 0 (speculative sampling, Leviathan et al. 2023 / Chen et al. 2023): with target distribution
  ``p = softmax(logits / T)`` and the drafter's ``q`` (``draft_probs``; None means the drafts were
  deterministic: ``q`` is one-hot), drafted token ``x`` is accepted with probability ``min(1, p(x) / q(x))``;
  the first rejection draws the next token from ``max(0, p - q)`` renormalised; if all ``K`` are accepted the
  bonus token is drawn from ``p`` after the last. Every token is then distributed exactly as the target alone
  would sample it (lossless); a test checks that statistically, and that a wrong rule fails the same test.

Batched over ``B`` so the lossless test draws many samples in one call; the decoding loop uses ``B = 1``.
"""

from __future__ import annotations

import torch


def accept_block(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, K1, V = target_logits.shape
    K = K1 - 1
    if draft_tokens.shape != (B, K):
        raise ValueError(f"draft_tokens {tuple(draft_tokens.shape)} must be (B, K) = ({B}, {K})")
    draft_tokens = draft_tokens.long()
    rows = torch.arange(B, device=target_logits.device)
    if temperature <= 0:
        pred = target_logits.argmax(-1)  # (B, K + 1)
        match = (draft_tokens == pred[:, :K]).long()
        accepted = match.cumprod(dim=1).sum(dim=1)
        return accepted, pred[rows, accepted]
    p = torch.softmax(target_logits.float() / temperature, dim=-1)  # (B, K + 1, V)
    if draft_probs is None:
        q = torch.nn.functional.one_hot(draft_tokens, V).float()
    else:
        q = draft_probs.float()
    px = p[:, :K].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # (B, K)
    qx = q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    u = torch.rand((B, K), generator=generator, device=p.device)
    ok = (u * qx < px).long()  # u < min(1, p/q), without dividing by q = 0
    accepted = ok.cumprod(dim=1).sum(dim=1)  # (B,)
    # the distribution of the next token: the residual at the first rejection, p itself after K accepts
    p_next = p[rows, accepted]  # (B, V)
    rejected = accepted < K
    q_at = q[rows, accepted.clamp(max=K - 1)] if K > 0 else torch.zeros_like(p_next)
    residual = (p_next - q_at).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    dist = torch.where(rejected.unsqueeze(-1), residual, p_next)
    next_token = torch.multinomial(dist, 1, generator=generator).view(B)
    return accepted, next_token

"""Temperature > 0 is lossless: speculative sampling through ``accept_block`` yields exactly the target's
distribution over whole continuations, and a deliberately wrong rule fails the same test.

Design: vocabulary V = 4, a Markov target ``P[prev, next]`` and a drafter double whose parallel proposals for
block positions 1, 2 come from tables ``Q1[anchor]``, ``Q2[anchor]`` (different from P, as a real drafter's
marginals are). 50,000 continuations of L = 3 tokens are decoded at once (block size 3, the decoding loop's
bookkeeping vectorised over rows); their 64-cell histogram is compared with the exact target distribution by
Pearson's chi-square (63 degrees of freedom), rejecting at p < 1e-4 (critical value 113.7 by Wilson-Hilferty).
Power: the wrong rule ("on a rejection, draw from p instead of the residual max(0, p - q)") has a
first-token marginal whose chi-square divergence from the target's gives a noncentrality lambda = N * chi2 of
over 2,000 (computed below); the joint's is at least that (data processing), so the wrong rule's expected
statistic is > 2,000 against a critical value of 113.7: power > 0.9999. Fixed seeds: the test is deterministic.
"""

from __future__ import annotations

import torch

from trainer.evaluation.verify import accept_block

V, L, K, N = 4, 3, 2, 50_000
CRITICAL = 113.7  # chi-square, 63 degrees of freedom, p = 1e-4


def tables():
    g = torch.Generator().manual_seed(7)
    P = torch.rand(V, V, generator=g) ** 2 + 0.02
    P = P / P.sum(1, keepdim=True)
    Q1 = torch.rand(V, V, generator=g) ** 3 + 0.01
    Q2 = torch.rand(V, V, generator=g) ** 3 + 0.01
    return P, Q1 / Q1.sum(1, keepdim=True), Q2 / Q2.sum(1, keepdim=True)


def wrong_rule(target_logits, draft_tokens, draft_probs, temperature, generator=None):
    """The classic bug: a rejected position is redrawn from p itself, not from the residual."""
    B = target_logits.shape[0]
    p = torch.softmax(target_logits.float() / temperature, dim=-1)
    px = p[:, :K].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    qx = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
    u = torch.rand((B, K), generator=generator)
    accepted = (u * qx < px).long().cumprod(1).sum(1)
    nxt = torch.multinomial(p[torch.arange(B), accepted], 1, generator=generator).view(B)
    return accepted, nxt


def decode(rule, deterministic_drafts: bool = False) -> torch.Tensor:
    """Histogram (V**L,) of N continuations of start token 0, decoded block by block with ``rule``."""
    P, Q1, Q2 = tables()
    g = torch.Generator().manual_seed(11)
    rows = torch.arange(N)
    seq = torch.zeros(N, 1 + L + K + 1, dtype=torch.long)
    lens = torch.ones(N, dtype=torch.long)
    while (lens < 1 + L).any():
        a = seq[rows, lens - 1]
        q = torch.stack([Q1[a], Q2[a]], 1)  # (N, K, V)
        if deterministic_drafts:
            x = q.argmax(-1)
            probs = None
        else:
            x = torch.multinomial(q.view(-1, V), 1, generator=g).view(N, K)
            probs = q
        ctx = torch.cat([a.unsqueeze(1), x], 1)  # the target sees anchor, x1, x2
        logits = P[ctx].log()  # (N, K + 1, V): p(. | anchor), p(. | x1), p(. | x2)
        acc, nxt = rule(logits, x, probs, 1.0, g)
        active = lens < 1 + L
        for k in range(K + 1):  # write x[:k] then nxt at lens .. lens + acc
            tok = torch.where(k < acc, x[:, min(k, K - 1)], nxt)
            pos = (lens + k).clamp(max=seq.shape[1] - 1)
            write = active & (k <= acc)
            seq[rows[write], pos[write]] = tok[write]
        lens = torch.where(active, lens + acc + 1, lens)
    out = seq[:, 1 : 1 + L]
    idx = (out * torch.tensor([V * V, V, 1])).sum(1)
    return torch.bincount(idx, minlength=V**L).double()


def exact() -> torch.Tensor:
    P, _, _ = tables()
    x = torch.cartesian_prod(*[torch.arange(V)] * L)
    return (P[0, x[:, 0]] * P[x[:, 0], x[:, 1]] * P[x[:, 1], x[:, 2]]).double()


def chi2(counts: torch.Tensor) -> float:
    e = exact() * N
    return float(((counts - e) ** 2 / e).sum())


def test_power_of_the_design_against_the_wrong_rule():
    P, Q1, _ = tables()
    p, q = P[0].double(), Q1[0].double()
    beta = torch.minimum(p, q).sum()
    wrong = torch.minimum(p, q) + (1 - beta) * p  # first-token law under the wrong rule
    lam = N * float(((wrong - p) ** 2 / p).sum())
    assert lam > 2000, lam


def test_speculative_sampling_reproduces_the_target_distribution():
    assert chi2(decode(accept_block)) < CRITICAL


def test_deterministic_drafts_are_lossless_too():
    assert chi2(decode(accept_block, deterministic_drafts=True)) < CRITICAL


def test_the_same_test_catches_a_wrong_acceptance_rule():
    assert chi2(decode(wrong_rule)) > CRITICAL

"""Evaluation with DFlash 2 drafters: the selector's walk proposes; greedy keeps the target's output, sampling
stays lossless.

Lossless design (as tests/trainer/evaluation/test_verify_lossless.py): vocabulary V = 4, a Markov target
``P[prev, next]``, block size 3 (2 drafted slots), continuations of L = 3 tokens. The drafter double is a
DFlash 2 selector: per anchor, K = 3 candidates per slot and random edge scores with a strong dependence on
the previous pick; ``walk`` draws the path and returns its conditional distributions, scattered over the
vocabulary as ``DrafterProposer`` does. 50,000 continuations decoded at once; Pearson's chi-square over the
64 cells (63 d.o.f., reject at p < 1e-4: 113.7). The control passes the distribution of the first row of
every slot (as if the previous pick were always rank 0) instead of the conditional one: the same test must
reject it.
"""

from __future__ import annotations

import pytest
import torch

from trainer.drafting.selector import walk
from trainer.evaluation.drafter_cache import DrafterProposer
from trainer.evaluation.spec_decode import CachedTarget, speculative_generate, target_generate
from trainer.evaluation.verify import accept_block

V, L, K, N, SLOTS = 4, 3, 3, 50_000, 2
CRITICAL = 113.7


def tables():
    g = torch.Generator().manual_seed(7)
    P = torch.rand(V, V, generator=g) ** 2 + 0.02
    P = P / P.sum(1, keepdim=True)
    cand = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(V * SLOTS)]).view(V, SLOTS, K)
    edges = 2.0 * torch.randn(V, SLOTS, K, K, generator=g)
    return P, cand, edges


def decode(conditional: bool) -> torch.Tensor:
    P, cand, edges = tables()
    g = torch.Generator().manual_seed(11)
    rows = torch.arange(N)
    seq = torch.zeros(N, 1 + L + SLOTS + 1, dtype=torch.long)
    lens = torch.ones(N, dtype=torch.long)
    T = 1.0
    while (lens < 1 + L).any():
        a = seq[rows, lens - 1]
        idx, q = walk(edges[a], T, g)  # (N, SLOTS), (N, SLOTS, K)
        c = cand[a]  # (N, SLOTS, K)
        x = c.gather(2, idx.unsqueeze(-1)).squeeze(-1)
        if not conditional:
            q = torch.softmax(edges[a][:, :, 0, :] / T, dim=-1)
        probs = torch.zeros(N, SLOTS, V).scatter_(2, c, q)
        ctx = torch.cat([a.unsqueeze(1), x], 1)
        acc, nxt = accept_block(P[ctx].log(), x, probs, T, g)
        active = lens < 1 + L
        for k in range(SLOTS + 1):
            tok = torch.where(k < acc, x[:, min(k, SLOTS - 1)], nxt)
            pos = (lens + k).clamp(max=seq.shape[1] - 1)
            write = active & (k <= acc)
            seq[rows[write], pos[write]] = tok[write]
        lens = torch.where(active, lens + acc + 1, lens)
    out = seq[:, 1 : 1 + L]
    return torch.bincount((out * torch.tensor([V * V, V, 1])).sum(1), minlength=V**L).double()


def chi2(counts: torch.Tensor) -> float:
    P, _, _ = tables()
    x = torch.cartesian_prod(*[torch.arange(V)] * L)
    e = (P[0, x[:, 0]] * P[x[:, 0], x[:, 1]] * P[x[:, 1], x[:, 2]]).double() * N
    return float(((counts - e) ** 2 / e).sum())


def test_selector_walk_sampling_is_lossless():
    assert chi2(decode(conditional=True)) < CRITICAL


def test_the_same_test_rejects_the_wrong_proposal_distribution():
    assert chi2(decode(conditional=False)) > CRITICAL


@pytest.fixture(scope="module")
def setup(tiny_assets):
    from tests.support.model_util import tiny_drafter, tiny_prompts
    from trainer.evaluation.load import load_target_model

    torch.manual_seed(0)
    model = load_target_model(str(tiny_assets / "target"), "cpu", torch.float32)
    target = CachedTarget(model, [1, 3])
    prompts = tiny_prompts(tiny_assets, 1)
    drafter, _ = tiny_drafter(
        target_config=model.config,
        block_size=8,
        target_layer_ids=[1, 3],
        arch="dflash2",
        dflash2={"selector_rank": 8, "selector_top_k": 4},
    )
    with torch.no_grad():  # a selector whose transition term matters
        drafter.candidate_selector.successor_codebook.normal_(std=3.0)
        drafter.candidate_selector.predecessor_codebook.normal_(std=3.0)
    prop = DrafterProposer(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    return model, target, prompts, prop


def test_dflash2_greedy_keeps_the_target_greedy_output(setup):
    model, target, prompts, prop = setup
    p = prompts[0]
    ref = target_generate(target, p, 12).tokens
    assert speculative_generate(target, prop, p, 12).tokens == ref


def test_dflash2_proposals_come_from_the_walk(setup, monkeypatch):
    model, target, prompts, prop = setup
    import trainer.evaluation.drafter_cache as dc

    seen = []
    real_walk = dc.walk

    def spy(edges, temperature, generator):
        idx, q = real_walk(edges, temperature, generator)
        seen.append((edges, idx, q))
        return idx, q

    monkeypatch.setattr(dc, "walk", spy)
    _, feats = target.prefill(prompts[0])
    tokens = list(prompts[0]) + [5]
    prop.reset()
    greedy = prop.propose(tokens, feats, 0.0, None)
    edges, idx, _ = seen[-1]
    assert greedy.probs is None and len(greedy.tokens) == 7
    # the proposed tokens are the walk's picks, which differ from the unary argmax when the selector speaks
    prop.reset()
    sampled = prop.propose(tokens, feats, 0.8, torch.Generator().manual_seed(0))
    edges, idx, q = seen[-1]
    probs = sampled.probs
    assert probs.shape == (7, model.config.vocab_size)
    torch.testing.assert_close(probs.sum(-1), torch.ones(7))
    assert ((probs > 0).sum(-1) <= 4).all()  # mass only on the top-k candidates
    prev = 0
    for step in range(7):
        want = torch.softmax(edges[step, prev] / 0.8, -1)
        got = probs[step][probs[step] > 0]
        torch.testing.assert_close(got.sort().values, want.sort().values)
        assert probs[step, sampled.tokens[step]] == want[idx[step]]
        prev = int(idx[step])

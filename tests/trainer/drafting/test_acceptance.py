"""The acceptance estimate walks a step's blocks as decoding would (trainer/drafting/acceptance.py)."""

import random

import pytest
import torch

from tests.support.walk import decode_steps
from trainer.drafting.acceptance import decode_walk


def _rows(rows):
    A = max(len(r[0]) for r in rows)
    anchors = torch.full((len(rows), A), -1)
    chain = torch.zeros((len(rows), A), dtype=torch.long)
    for i, (a, c) in enumerate(rows):
        anchors[i, : len(a)] = torch.tensor(a, dtype=torch.long)
        chain[i, : len(c)] = torch.tensor(c, dtype=torch.long)
    return anchors, chain, anchors >= 0


def test_walk_equals_step_by_step_decoding_on_random_rows():
    rng = random.Random(0)
    for _ in range(30):
        rows = []
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(0, 40)
            anchors = sorted(rng.sample(range(60), n))
            rows.append((anchors, [rng.randint(0, 7) for _ in anchors]))
        want = [decode_steps(a, c) for a, c in rows]
        tok, steps = decode_walk(*_rows(rows))
        assert (int(tok), int(steps)) == (sum(t for t, _ in want), sum(s for _, s in want))


def test_an_easy_stretch_is_crossed_in_few_steps():
    """Every position an anchor: 16 positions of full blocks (chain 3 at block 4) then 16 where nothing is
    accepted. The mean over anchors of chain + 1 says (16 * 4 + 16 * 1) / 32 = 2.5; decoding crosses the easy
    half in 4 steps and the hard half in 16: 32 tokens in 20 steps = 1.6."""
    chains = [3] * 16 + [0] * 16
    anchors = list(range(32))
    tok, steps = decode_walk(*_rows([(anchors, chains)]))
    assert (int(tok), int(steps)) == (32, 20)
    assert sum(c + 1 for c in chains) / len(chains) == pytest.approx(2.5)


def test_rows_without_anchors_count_nothing():
    tok, steps = decode_walk(*_rows([([], []), ([5], [2])]))
    assert (int(tok), int(steps)) == (3, 1)
    with pytest.raises(ValueError, match="one"):
        decode_walk(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3, dtype=torch.bool))


def test_runs_of_anchors_read_the_decoding_count_where_scattered_ones_over_read():
    """Stretches of 24 positions, easy (the drafter right on all of a block) or hard (right on none), at
    density 1/16 (256 anchors in 4,096 positions, about the seeds'): scattered anchors skip the hard positions
    after a rejection and read double; runs of 16 (masks.sample_anchors' run_length) step as decoding does."""
    from trainer.drafting.masks import sample_anchors

    bs, T = 8, 4096 + 7
    g = torch.Generator().manual_seed(0)
    easy = (torch.rand(T // 24 + 1, generator=g) < 0.4).repeat_interleave(24)[:T].tolist()
    chain = torch.tensor([next((c for c in range(bs - 1) if p + 1 + c >= T or not easy[p + 1 + c]), bs - 1)
                          for p in range(T)])  # fmt: skip
    p, tok, steps = 0, 0, 0
    while p < T - bs + 1:  # decoding: every position a possible anchor
        tok, steps, p = tok + int(chain[p]) + 1, steps + 1, p + int(chain[p]) + 1
    exact = tok / steps
    doc, lm = torch.zeros(1, T, dtype=torch.long), torch.ones(1, T, dtype=torch.long)

    def read(run_length: int) -> float:
        t = s = 0
        for _ in range(30):
            a = sample_anchors(doc, lm, bs, 256, g, run_length=run_length)
            tt, ss = decode_walk(a, chain[a.clamp(min=0)], a >= 0)
            t, s = t + int(tt), s + int(ss)
        return t / s

    assert read(1) > 1.5 * exact
    assert abs(read(16) / exact - 1) < 0.15

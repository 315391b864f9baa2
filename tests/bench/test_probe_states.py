"""bench/probe_states.py: the samples line up as a drafter sees them (states before the anchor, the target's
argmax at the drafted slot), the probes learn what their inputs determine and not what they do not, and a bad
--target is refused."""

from __future__ import annotations

import argparse

import pytest
import torch

from bench import probe_states


def test_samples_take_the_states_before_the_anchor_and_the_slots_argmax():
    D, T, H = 2, 6, 3
    docs = torch.arange(D * T).view(D, T)
    feats = docs.unsqueeze(-1).float().expand(D, T, H) * 10  # a position's state says which position it is
    argmax = docs + 100
    for slot in (1, 2, 3):
        x, anchor, label = probe_states.samples(feats, argmax, docs, slot)
        assert x.shape == (D * (T - slot), H)
        assert torch.equal(x[:, 0], (anchor - 1).float() * 10)  # the state at t - 1
        assert torch.equal(label, anchor + slot - 1 + 100)  # the target's argmax after t + slot - 1
        assert int(anchor.view(D, -1)[:, 0].remainder(T).min()) == 1  # every anchor has a state before it


def test_the_probes_learn_what_the_inputs_determine():
    g = torch.Generator().manual_seed(0)
    n = 4000
    anchor = torch.randint(0, 50, (n,), generator=g)
    x = torch.randn(n, 8, generator=g)
    by_state = (x[:, 0] > 0).long() + 200  # decided by the state, not the anchor
    assert probe_states.fit(None, anchor, anchor, 0, steps=400) > 0.95  # a bigram that is exact
    assert probe_states.fit(x, anchor, by_state, 0, steps=400) > 0.9
    assert probe_states.fit(x, anchor, by_state, 32, steps=400) > 0.9
    assert probe_states.fit(None, anchor, by_state, 0, steps=400) < 0.65  # the anchor alone cannot tell


@pytest.mark.parametrize("bad", ["dir:1,5", "a=dir", "a=:1", "a=dir:x,1"])
def test_a_bad_target_is_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        probe_states.parse_target(bad)
    assert probe_states.parse_target("dense=bench/out/t:1,5") == ("dense", "bench/out/t", [1, 5])

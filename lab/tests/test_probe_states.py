"""lab/probe_states.py: the samples line up as a drafter sees them (states before the anchor, the target's
argmax at the drafted slot), the probes learn what their inputs determine and not what they do not, and a bad
--target is refused."""

from __future__ import annotations

import argparse

import pytest
import torch

from lab import probe_states


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


def test_soft_labels_train_the_probe_toward_the_distributions_argmax():
    g = torch.Generator().manual_seed(0)
    n = 4000
    anchor = torch.randint(0, 50, (n,), generator=g)
    x = torch.randn(n, 8, generator=g)
    by_state = (x[:, 0] > 0).long() + 200
    soft = torch.full((n, probe_states.VOCAB), 0.1 / (probe_states.VOCAB - 1))
    soft[torch.arange(n), by_state] = 0.9  # a confident target whose argmax the state decides
    assert probe_states.fit(x, anchor, by_state, 32, steps=400, soft=soft) > 0.9
    flat = torch.full_like(soft, 1 / probe_states.VOCAB)  # a target that says nothing: nothing to learn
    assert probe_states.fit(x, anchor, by_state, 32, steps=400, soft=flat) < 0.65


def test_own_text_documents_and_their_completion_anchors(tmp_path):
    import json

    P, N = probe_states.OWN_PROMPT, probe_states.OWN_NEW
    rows = [
        {"prompt": "p" * (P + 5), "completion": "c" * (N + 3)},
        {"prompt": "short", "completion": "c" * N},
    ]
    rows += [{"prompt": "q" * P, "completion": "d" * N}]
    path = tmp_path / "regenerated.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs = probe_states.own_docs(str(path), 2, seed=0)
    assert docs.shape == (2, P + N)
    assert sorted(bytes(d[:P].tolist()) for d in docs) == [b"p" * P, b"q" * P]  # the prompt's last bytes
    with pytest.raises(SystemExit, match="2 documents long enough, 3 asked for"):
        probe_states.own_docs(str(path), 3, seed=0)
    # anchors from the completion on: the first anchor's state is the prompt's last byte
    feats = torch.arange(2 * (P + N)).view(2, -1, 1).float()
    x, anchor, label = probe_states.samples(feats, docs, docs, 1, first=P)
    assert x.shape[0] == 2 * N and x[0, 0] == P - 1
    probs = torch.nn.functional.one_hot(docs, probe_states.VOCAB).float()
    assert torch.equal(probe_states.at_slot(probs, docs, 1, first=P).argmax(-1), label)


def test_own_text_needs_its_target(capsys):
    with pytest.raises(SystemExit):
        probe_states.main(["--target", "a=dir:1,5", "--own-text", "b=file.jsonl"])
    assert "--own-text for no --target: b" in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError):
        probe_states.parse_text("file.jsonl")


def test_the_context_probes_read_what_a_layer_keeps_of_the_text_before():
    g = torch.Generator().manual_seed(0)
    D, T, V = 40, 64, 12
    docs = torch.randint(0, V, (D, T), generator=g)
    keeps = torch.nn.functional.one_hot(docs.roll(1, dims=1), V).float()  # a state keeps its previous token
    noise = torch.randn(D, T, V, generator=g)  # a state that keeps nothing
    out = probe_states.context_tokens(torch.cat([keeps, noise], -1), docs, [3, 7])
    assert out["3"]["t-2"] > 0.95  # the state at t - 1 holds the token at t - 2
    assert out["3"]["t-4"] < 0.3 and out["7"]["t-2"] < 0.3  # neither holds what was not put in
    own = probe_states.context_tokens(torch.cat([keeps, noise], -1), docs, [3, 7], back=(1, 2))
    assert own["3"]["t-2"] > 0.95 and own["3"]["t-1"] < 0.3  # it keeps the token before, not its own
    with pytest.raises(argparse.ArgumentTypeError):
        probe_states._back("0,2")
    with pytest.raises(SystemExit):
        probe_states.main(["--target", "a=dir:1,5", "--probes", "slots,nope"])

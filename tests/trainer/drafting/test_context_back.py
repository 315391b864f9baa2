"""The context-back experiment (``drafting.context_back``): fc reads each context position beside the positions
before it in its document, training and decoding compute the same, the export keeps it, and every server's
check refuses it (no server feeds fc more than one position)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.model_util import random_embed, tiny_drafter
from trainer.drafting.config import ConfigError
from trainer.drafting.context_back import Tail, expand
from trainer.exporting import SERVERS, check_dir
from trainer.exporting.problems import ERROR
from trainer.model import load_drafter, save_drafter


def test_expand_lays_the_positions_before_beside_each_within_its_document():
    h = torch.arange(1, 8, dtype=torch.float32).view(1, 7, 1).repeat(1, 1, 2)  # position t's features: t + 1
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    e = expand(h, doc, 2)
    assert e.shape == (1, 7, 6)
    own, back1, back2 = e[0, :, 0], e[0, :, 2], e[0, :, 4]
    assert own.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert back1.tolist() == [0, 1, 2, 0, 4, 5, 6]  # the second document starts at position 3: nothing before
    assert back2.tolist() == [0, 0, 1, 0, 0, 4, 5]
    assert expand(h, doc, 0) is h


def test_the_tail_fed_in_uneven_runs_equals_expand_over_the_sequence():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(1, 11, 3, generator=g)
    whole = expand(h, torch.zeros(1, 11, dtype=torch.long), 3)[0]
    tail = Tail(3)
    runs = [tail.push(h[0, lo:hi]) for lo, hi in ((0, 1), (1, 1), (1, 6), (6, 8), (8, 11))]
    torch.testing.assert_close(torch.cat(runs), whole, rtol=0, atol=0)
    tail.reset()
    torch.testing.assert_close(tail.push(h[0, :4]), whole[:4], rtol=0, atol=0)


def test_a_packed_document_sees_nothing_of_the_one_before():
    """The block anchored in the second document of a packed row equals the same block with that document
    alone: no feature of the first leaks in through the positions before."""
    drafter, cfg = tiny_drafter(block_size=4, context_back=2)
    embed = random_embed()
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, 12, cfg.num_captured * cfg.hidden_size, generator=g)
    ids = torch.randint(0, 200, (1, 12), generator=g)
    doc = torch.tensor([[0] * 5 + [1] * 7])
    packed = drafter(feats, ids, doc, torch.tensor([[9]]), embed)[0, 0]
    alone = drafter(feats[:, 5:], ids[:, 5:], torch.zeros(1, 7, dtype=torch.long), torch.tensor([[4]]), embed)
    torch.testing.assert_close(packed, alone[0, 0], atol=2e-5, rtol=1e-4)
    with torch.no_grad():  # and the positions before do reach the block: change one, the block moves
        feats[0, 7] += 3.0
    assert not torch.allclose(drafter(feats, ids, doc, torch.tensor([[9]]), embed)[0, 0], packed)


def test_fc_widens_and_bad_values_are_refused():
    _, plain = tiny_drafter()
    drafter, cfg = tiny_drafter(context_back=2)
    assert drafter.fc.in_features == 3 * plain.num_captured * plain.hidden_size == cfg.fc_in_features
    for bad in (-1, 9, True):
        with pytest.raises(ConfigError) as e:
            tiny_drafter(context_back=bad)
        assert e.value.setting == "context_back"


def test_the_export_keeps_it_and_every_server_refuses_it(tmp_path):
    drafter, cfg = tiny_drafter(block_size=8, target_layer_ids=[1, 2], context_back=1)
    save_drafter(drafter, cfg, tmp_path / "cb")
    conf = json.loads((tmp_path / "cb" / "config.json").read_text())
    assert conf["dflash_config"]["context_back"] == 1
    loaded, cfg2 = load_drafter(tmp_path / "cb")
    assert cfg2.context_back == 1
    torch.testing.assert_close(loaded.fc.weight, drafter.fc.weight)
    res = check_dir(str(tmp_path / "cb"), list(SERVERS), None)
    for server, problems in res.items():
        keys = [p.key for p in problems if p.severity == ERROR]
        assert "dflash_config.context_back" in keys, server
    plain, pcfg = tiny_drafter(block_size=8, target_layer_ids=[1, 2])
    save_drafter(plain, pcfg, tmp_path / "plain")
    assert "context_back" not in json.loads((tmp_path / "plain" / "config.json").read_text())["dflash_config"]

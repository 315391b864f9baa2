"""lab/est_seen.py: its anchors are every completion-predicting position, its texts are read as the bench
writes them, fresh prompts are never training prompts, and the estimate is the trainer's walk over them."""

from __future__ import annotations

import json

import torch

from lab import est_seen
from lab.est_seen import PROMPT, SEQ
from tests.support.model_util import tiny_drafter, tiny_target
from trainer.drafting.head import FrozenHead


def test_the_anchors_are_every_position_that_predicts_completion_tokens():
    mask = [0] * PROMPT + [1] * (SEQ - PROMPT)
    row = est_seen._anchors(mask, 8)
    real = row[row >= 0]
    assert (
        real[0] == PROMPT - 1 and real[-1] == SEQ - 8 and torch.equal(real, torch.arange(PROMPT - 1, SEQ - 7))
    )
    assert (row[len(real) :] == -1).all() and len(row) == SEQ - 7


def test_texts_are_read_as_the_bench_writes_them_and_short_rows_are_left_out(tmp_path):
    full = {"prompt": "a" * PROMPT, "completion": "b" * PROMPT}
    (tmp_path / "regen.jsonl").write_text(
        "\n".join(json.dumps(x) for x in (full, {**full, "completion": "b"}, full))
    )
    rows = est_seen.train_rows(str(tmp_path / "regen.jsonl"), 5)
    assert len(rows) == 2 and rows[0][0] == [97] * PROMPT + [98] * PROMPT and sum(rows[0][1]) == PROMPT
    assert est_seen.seen_prompts(str(tmp_path / "regen.jsonl")) == {"a" * PROMPT}
    out = tmp_path / "gen"
    out.mkdir()
    row = {"input_ids": list(range(SEQ)), "loss_mask": [0] * PROMPT + [1] * PROMPT}
    (out / "out1.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "input_ids": [1]}) + "\n")
    (out / "out0.jsonl").write_text(json.dumps({**row, "input_ids": [2] * SEQ}) + "\n")
    got = est_seen.decoded_rows(str(out), 5)
    assert [r[0][0] for r in got] == [2, 0]  # files in order, the short row left out


def test_fresh_prompts_are_never_training_prompts():
    first = est_seen.fresh_prompts(set(), 3, seed=5)
    seen = {bytes(p).decode("utf-8", "replace") for p in first[:2]}
    again = est_seen.fresh_prompts(seen, 3, seed=5)
    assert again[0] == first[2] and all(len(p) == PROMPT for p in again)
    assert not {bytes(p).decode("utf-8", "replace") for p in again} & seen


def test_the_estimate_is_the_trainers_walk_and_its_runs_walk_as_the_trainer_does():
    """``estimate``'s chains, walked here, give the trainer's own walk (``dflash_loss``) to the token; a run walk
    over one run as long as the row is the full walk; a walk steps by chain + 1 and may end past its run."""
    target = tiny_target()
    drafter, cfg = tiny_drafter(block_size=4)
    ids = torch.randint(0, 250, (3, SEQ), generator=torch.Generator().manual_seed(1)).tolist()
    rows = [(r, [0] * PROMPT + [1] * PROMPT) for r in ids]
    full, chains = est_seen.estimate(target, drafter.eval(), FrozenHead.from_model(target), rows, batch=2)
    assert 1.0 <= full <= cfg.block_size and len(chains) == 3 and len(chains[0]) == SEQ - 4 + 1 - (PROMPT - 1)
    walks = [est_seen.walk(c, 0, len(c)) for c in chains]
    assert full == sum(t for t, _ in walks) / sum(n for _, n in walks)
    assert est_seen.run_walk(chains, len(chains[0])) == full
    assert est_seen.walk([2, 0, 0, 3, 0], 0, 5) == (3 + 4, 2)  # 0 -> 3 -> past the end
    assert est_seen.walk([2, 0, 0, 3, 0], 1, 3) == (1 + 1, 2)  # a run of two anchors, one token each


def test_seen_share_counts_windows_found_verbatim():
    row = ([0] * 4 + list(range(40)), [0] * 4 + [1] * 40)
    assert est_seen.seen_share([row], [row]) == 1.0
    other = ([0] * 4 + list(range(100, 140)), [0] * 4 + [1] * 40)
    assert est_seen.seen_share([other], [row]) == 0.0
    part = ([0] * 4 + list(range(40)) + list(range(200, 224)), [0] * 4 + [1] * 64)
    assert est_seen.seen_share([part], [row]) == 9 / 33  # windows starting at 0 .. 8 of 0 .. 32

"""The data format: validation naming file and line, truncation, deterministic packing."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data.dataset import DataError, Plan, load_dir, pack_epoch


def _write(tmp_path, name, lines):
    (tmp_path / name).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"loss_mask": [1, 1]}', 'missing "input_ids"'),
        ('{"input_ids": [1, 2.5]}', "integers only"),
        ('{"input_ids": [1, -2]}', "negative"),
        ('{"input_ids": [1, 2, 3], "loss_mask": [1, 1]}', "has 2 entries"),
        ('{"input_ids": [1, 2], "loss_mask": [1, 2]}', "only 0 and 1"),
        # issue 33: these raised OverflowError / RecursionError / an unnamed ValueError before
        ('{"input_ids": [1, 9223372036854775808]}', "token id 9223372036854775808, beyond any vocabulary"),
        ('{"input_ids": [1, ' + "9" * 5000 + "]}", "not valid JSON"),
        ('{"input_ids": [1, 2], "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, why):
    _write(tmp_path, "a.jsonl", ['{"input_ids": [1, 2, 3]}'])
    _write(tmp_path, "b.jsonl", ['{"input_ids": [4, 5, 6], "loss_mask": [0, 1, 1]}', "", line])
    with pytest.raises(DataError) as e:
        load_dir(str(tmp_path), 100)
    assert str(e.value).startswith(f"{tmp_path / 'b.jsonl'}:3:")  # JSON errors: FILE:LINE:COLUMN:
    assert why in str(e.value)


@pytest.mark.parametrize(
    ("line", "col", "torn"),
    [
        ('{"input_ids": [1, 2, 3, 4', 26, True),  # a write cut short: json itself says "line 2 column 1"
        ('{"input_ids": [1, 2], "loss_m', 30, True),
        ('{"input_ids": [1, 2]}}', 22, False),
        ('{"input_ids": [1, x]}', 19, False),
    ],
)
def test_a_torn_line_points_at_its_column(tmp_path, line, col, torn):
    _write(tmp_path, "a.jsonl", ['{"input_ids": [1, 2, 3]}', line])
    with pytest.raises(DataError) as e:
        load_dir(str(tmp_path), 100)
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'a.jsonl'}:2:{col}: not valid JSON (") and f"at column {col}" in msg
    assert ("cut short" in msg) is torn


def test_an_overlong_line_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    from trainer.data import dataset

    monkeypatch.setattr(dataset, "MAX_LINE_CHARS", 1000)
    _write(tmp_path, "a.jsonl", ['{"input_ids": [1, 2, 3]}', '{"input_ids": [' + "1, " * 1000 + "1]}"])
    with pytest.raises(DataError, match=r"a\.jsonl:2: a line longer than 1000 characters"):
        load_dir(str(tmp_path), 100)


def test_load_truncates_drops_and_checks_vocab(tmp_path):
    _write(
        tmp_path,
        "a.jsonl",
        [
            '{"input_ids": [1, 2, 3, 4, 5, 6], "loss_mask": [0, 0, 1, 1, 1, 1]}',
            '{"input_ids": [7, 8], "loss_mask": [1, 0]}',  # nothing to predict: dropped
            '{"input_ids": [9, 10, 11], "extra": "ignored"}',
        ],
    )
    ds = load_dir(str(tmp_path), 4)
    assert len(ds) == 2 and ds.truncated == 1 and ds.dropped == 1
    assert ds.tokens.tolist() == [1, 2, 3, 4, 9, 10, 11]
    assert ds.mask.tolist() == [False, False, True, True, True, True, True]
    ds.check_vocab(12)
    with pytest.raises(DataError, match=r"a\.jsonl:3: token id 11"):
        ds.check_vocab(11)


def test_packing_respects_limits_and_is_deterministic():
    lengths = np.random.default_rng(0).integers(5, 60, size=200)
    a = pack_epoch(lengths, 1, 0, token_budget=256, max_batch_size=6)
    assert [b.tolist() for b in a] == [b.tolist() for b in pack_epoch(lengths, 1, 0, 256, 6)]
    assert [b.tolist() for b in a] != [b.tolist() for b in pack_epoch(lengths, 1, 1, 256, 6)]
    assert sorted(np.concatenate(a).tolist()) == list(range(200))
    for b in a:
        assert len(b) <= 6 and lengths[b].sum() <= 256


def test_plan_rows_and_cursor(tmp_path):
    _write(tmp_path, "a.jsonl", [f'{{"input_ids": {list(range(i, i + 10))}}}' for i in range(30)])
    ds = load_dir(str(tmp_path), 100)
    plan = Plan(ds, seed=0, epochs=2, token_budget=35, max_batch_size=8)
    assert plan.total == 20 and plan.locate(10) == (1, 0) and plan.epoch_progress(15) == 1.5
    mb = plan.batch(11)
    assert mb.index == 11 and mb.epoch == 1 and mb.num_tokens == 30
    assert mb.doc_ids.tolist() == [0] * 10 + [1] * 10 + [2] * 10
    assert mb.position_ids.tolist() == list(range(10)) * 3
    assert (
        Plan(ds, seed=0, epochs=2, token_budget=35, max_batch_size=8).batch(11).input_ids.tolist()
        == mb.input_ids.tolist()
    )


def test_held_out_sequences_end_every_micro_batch_and_are_never_packed_for_training(tmp_path):
    """``--est-holdout``: N sequences leave the epochs; micro-batch g ends with held-out sequence g mod N (the
    row's last document), inside the token budget; every other sequence is packed once an epoch, as before."""
    lines = [f'{{"input_ids": {list(range(i, i + 5 + i % 7))}}}' for i in range(40)]
    _write(tmp_path, "a.jsonl", lines)
    ds = load_dir(str(tmp_path), 100)
    plan = Plan(ds, seed=4, epochs=2, token_budget=40, max_batch_size=5, holdout=3)
    held = plan.holdout.tolist()
    assert len(held) == 3 and held == sorted(held)
    assert Plan(ds, seed=4, epochs=1, token_budget=40, max_batch_size=5, holdout=3).holdout.tolist() == held
    assert Plan(ds, seed=5, epochs=1, token_budget=40, max_batch_size=5, holdout=3).holdout.tolist() != held
    for e in range(2):
        trained = []
        for g in range(plan.starts[e], plan.starts[e + 1]):
            mb = plan.batch(g)
            assert mb.num_tokens <= 40 and mb.doc_ids.max() + 1 <= 5
            starts = np.flatnonzero(mb.position_ids == 0)
            seqs = [int(mb.input_ids[i]) for i in starts]  # sequence i starts with token i
            assert seqs[-1] == held[g % 3] and not set(seqs[:-1]) & set(held)
            trained += seqs[:-1]
        assert sorted(trained) == sorted(set(range(40)) - set(held))
    # off: the plan of old, sequence for sequence
    plain = Plan(ds, seed=4, epochs=1, token_budget=40, max_batch_size=5)
    assert len(plain.holdout) == 0
    assert [b.tolist() for b in plain.epochs[0]] == [b.tolist() for b in pack_epoch(ds.lengths, 4, 0, 40, 5)]


@pytest.mark.parametrize(
    ("holdout", "budget", "batch", "why"),
    [
        (40, 40, 5, "fewer than the data's 40"),
        (3, 20, 5, "--token-budget >= 2"),
        (3, 40, 1, "--max-batch-size >= 2"),
    ],
)
def test_a_holdout_that_cannot_fit_is_refused_with_what_would(tmp_path, holdout, budget, batch, why):
    _write(tmp_path, "a.jsonl", [f'{{"input_ids": {list(range(i, i + 5 + i % 7))}}}' for i in range(40)])
    with pytest.raises(DataError, match=why):
        Plan(
            load_dir(str(tmp_path), 100),
            seed=4,
            epochs=1,
            token_budget=budget,
            max_batch_size=batch,
            holdout=holdout,
        )


def test_the_resume_flags_are_those_that_move_the_stream_and_a_resume_must_keep_them(tmp_path):
    """``Plan.RESUME_FLAGS``: each one changes which sequences the micro-batches hold, so a resume under another
    value is refused, naming the flag (``build.check_plan``); ``--epochs`` leaves the earlier epochs as they are."""
    from types import SimpleNamespace

    from trainer.run.flags import FlagError
    from trainer.runtime.build import check_plan

    lines = [f'{{"input_ids": {list(range(i, i + 5 + i % 7))}}}' for i in range(40)]
    _write(tmp_path, "a.jsonl", lines)
    ds = load_dir(str(tmp_path), 100)
    base = {"seed": 4, "token_budget": 40, "max_batch_size": 5, "est_holdout": 3}

    def stream(epochs=1, **change):
        flags = SimpleNamespace(**{**base, **change}, epochs=epochs)
        plan = Plan.from_flags(ds, flags)
        return [plan.batch(g).input_ids.tolist() for g in range(plan.starts[1])]

    assert set(Plan.RESUME_FLAGS) == set(base)
    for name, other in (("seed", 5), ("token_budget", 30), ("max_batch_size", 3), ("est_holdout", 2)):
        assert stream(**{name: other}) != stream(), name
        with pytest.raises(FlagError) as e:
            check_plan(SimpleNamespace(**{**base, name: other}), base, "ckpt")
        assert e.value.flag == "--" + name.replace("_", "-") and f"{base[name]}, not {other}" in str(e.value)
    assert stream(epochs=3) == stream()  # more epochs: the first is the same
    check_plan(SimpleNamespace(**base), base, "ckpt")  # the same plan resumes
    old = {k: v for k, v in base.items() if k != "est_holdout"}  # a checkpoint from before --est-holdout ...
    check_plan(SimpleNamespace(**{**base, "est_holdout": 0}), old, "ckpt")  # ... had none
    with pytest.raises(FlagError):
        check_plan(SimpleNamespace(**base), old, "ckpt")

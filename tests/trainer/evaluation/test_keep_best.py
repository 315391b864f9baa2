"""--keep-best (trainer/evaluation/best.py): the best evaluated checkpoint is kept past the rotation, named by
``checkpoints/best``, and said in the records the console reads."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.trainer_run import events, records, run_in_process, tiny_flags
from trainer.data.dataset import held_out, load_dir
from trainer.evaluation import best
from trainer.run import checkpoint


def _save(root, step, keep=1):
    def payload(tmp):
        with open(os.path.join(tmp, "weights.bin"), "wb") as f:
            f.write(bytes([step]) * 64)

    return checkpoint.save(str(root), step, payload, {}, keep=keep)[0]


def test_a_held_checkpoint_rotated_away_comes_back_as_best_and_is_spared_until_beaten(tmp_path):
    ckpts, evals = tmp_path / "checkpoints", tmp_path / "evals"
    keep = best.KeepBest(str(ckpts), str(evals))
    first = _save(ckpts, 1)
    best.hold(first, str(evals), 1)  # due for evaluation: held while it waits
    _save(ckpts, 2)
    _save(ckpts, 3)
    assert checkpoint.list_steps(str(ckpts)) == ["step_00000003"]  # --keep-checkpoints 1 rotated it away
    assert keep.consider(1, 2.5) == (True, None)
    best.release(str(evals), 1)
    assert checkpoint.read_pointer(str(ckpts), "best") == "step_00000001"
    assert checkpoint.verify(first) is None  # put back whole, from the held links
    assert (ckpts / "step_00000001" / "weights.bin").read_bytes() == bytes([1]) * 64
    assert not (evals / "step_00000001" / "checkpoint").exists()
    _save(ckpts, 4)
    assert checkpoint.list_steps(str(ckpts)) == ["step_00000001", "step_00000004"]  # best spared
    assert keep.consider(4, 2.5) == (False, None)  # not above the best: best stays
    assert keep.consider(4, 2.6) == (True, None)
    _save(ckpts, 5)
    assert checkpoint.list_steps(str(ckpts)) == ["step_00000004", "step_00000005"]  # the old best rotates
    # a resumed run knows its best from the pointer and that evaluation's result
    res = evals / "step_00000004" / "result.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text('progress\n{"mean_accept_len": 2.6}\n')
    assert best.KeepBest(str(ckpts), str(evals)).best == (2.6, 4)


def test_a_best_that_cannot_be_kept_leaves_the_earlier_best(tmp_path):
    ckpts, evals = tmp_path / "checkpoints", tmp_path / "evals"
    keep = best.KeepBest(str(ckpts), str(evals))
    _save(ckpts, 1)
    assert keep.consider(1, 2.0) == (True, None)
    _save(ckpts, 2)
    _save(ckpts, 3)  # step 2 rotated away (step 1, the best, spared), never held
    ok, why = keep.consider(2, 3.0)
    assert not ok and "no complete copy" in why
    assert checkpoint.read_pointer(str(ckpts), "best") == "step_00000001" and keep.best == (2.0, 1)


def test_a_link_in_place_of_best_is_not_followed(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (tmp_path / "elsewhere").write_text("step_00000009\n")
    os.symlink(tmp_path / "elsewhere", ckpts / "best")
    assert checkpoint.read_pointer(str(ckpts), "best") is None
    best.KeepBest(str(ckpts), str(tmp_path / "evals")).consider(9, 1.0)  # no step_9: nothing written through
    assert (tmp_path / "elsewhere").read_text() == "step_00000009\n"


@pytest.mark.e2e
def test_the_trainer_validates_on_its_held_out_split_and_keeps_its_best_checkpoint(
    tiny_assets, tmp_path, capfd
):
    """--est-holdout 3 --eval-data est-holdout: the evaluations decode from the 3 sequences the run never
    trains on; --keep-best keeps the best of them past --keep-checkpoints 1."""
    out = tmp_path / "run"
    flags = ("--max-steps", "6", "--seed", "5", "--save-every", "1", "--keep-checkpoints", "1", "--eval-every",
             "1", "--est-holdout", "3", "--eval-data", "est-holdout", "--eval-prompts", "2", "--eval-new-tokens",
             "8", "--keep-best")  # fmt: skip
    assert run_in_process(tiny_flags(tiny_assets, out, *flags)) == 0, capfd.readouterr()
    ds = load_dir(str(tiny_assets / "data"), 256)
    want = [ds.tokens[ds.offsets[s] : ds.offsets[s + 1]].tolist() for s in held_out(len(ds), 3, 5)]
    got = [json.loads(x)["input_ids"] for x in (out / "evals" / "est-holdout.jsonl").read_text().splitlines()]
    assert got == want  # the plan's held-out sequences (the ones no micro-batch trains on)
    ev = [r for r in records(out) if r["kind"] == "eval"]
    assert ev and all(isinstance(e["best"], bool) and len(e["per_position"]) == 7 for e in ev)
    assert all(e["prompts"] == 2 for e in ev)
    named = [e for e in events(out) if e["name"] == "best_checkpoint"]
    # a best_checkpoint event exactly where an evaluation beat every earlier one
    running, expect = None, []
    for e in ev:
        if running is None or e["accept_len"] > running:
            running = e["accept_len"]
            expect.append(e["step"])
    assert [e["step"] for e in ev if e["best"]] == expect == [e["step"] for e in named]
    top = max(ev, key=lambda e: e["accept_len"])
    assert named[-1]["accept_len"] == top["accept_len"]
    ckpts = out / "checkpoints"
    assert checkpoint.read_pointer(str(ckpts), "best") == f"step_{named[-1]['step']:08d}"
    assert checkpoint.verify(str(ckpts / f"step_{named[-1]['step']:08d}")) is None
    assert set(checkpoint.list_steps(str(ckpts))) <= {"step_00000006", f"step_{named[-1]['step']:08d}"}
    assert not list((out / "evals").glob("step_*/checkpoint"))  # no held copy left behind


def test_keep_best_needs_eval_every_and_est_holdout_prompts_need_est_holdout(tiny_assets, tmp_path, capfd):
    assert run_in_process(tiny_flags(tiny_assets, tmp_path / "run", "--keep-best")) == 2
    assert "--keep-best: needs --eval-every" in capfd.readouterr().err
    argv = tiny_flags(tiny_assets, tmp_path / "run", "--eval-every", "1", "--eval-data", "est-holdout")
    assert run_in_process(argv) == 2
    assert (
        "--eval-data: est-holdout evaluates on the sequences --est-holdout N holds out"
        in capfd.readouterr().err
    )

"""RUN_DIR/tracking.json (trainer/tracking/state.py): replaced atomically, read bounded, never through a link."""

from __future__ import annotations

import json
import os

from trainer.tracking.state import FILE, MAX_BYTES, State


def test_put_and_read_back(tmp_path):
    State(str(tmp_path)).put("wandb", {"id": "ab12cd34", "mode": "offline"})
    State(str(tmp_path)).put("mlflow", {"run_id": "r1", "tracking_uri": "file:///x"})
    again = State(str(tmp_path))
    assert again.problem is None
    assert (
        again.get("wandb") == {"id": "ab12cd34", "mode": "offline"} and again.get("mlflow")["run_id"] == "r1"
    )
    assert again.get("tensorboard") is None
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # no temp file left


def test_a_link_an_oversized_or_odd_file_reads_as_empty(tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"wandb": {"id": "theirs"}}))
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(elsewhere, run / FILE)
    s = State(str(run))
    assert s.get("wandb") is None and "cannot open" in s.problem  # a link we did not make is not followed
    s.put("wandb", {"id": "ours"})
    assert not (run / FILE).is_symlink() and json.loads(elsewhere.read_text()) == {"wandb": {"id": "theirs"}}

    (run / FILE).write_text(json.dumps({"wandb": {"id": "x" * MAX_BYTES}}))
    assert State(str(run)).get("wandb") is None and "at most" in State(str(run)).problem
    for text in ("[1, 2]", '{"wandb": "id"}', "[" * 60_000, "\xff not json"):
        (run / FILE).write_text(text)
        assert State(str(run)).data == {} and State(str(run)).problem

"""bench_acceptance's ``--regen-from``: an earlier run's regenerated text is taken only from the same target,
with the same prompts, from a plain file that parses; every refusal names why."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bench import regen_reuse
from bench.acceptance_flags import build_parser
from bench.bench_acceptance import settle

PAIRS = [{"prompt": "def f():", "completion": ""}, {"prompt": "import os", "completion": ""}]


def _target(path, weights: bytes):
    path.mkdir()
    (path / "model.safetensors").write_bytes(weights)
    return str(path)


def _earlier_run(tmp_path, target: str, max_tokens: int = 128):
    """A regenerated.jsonl as a regeneration leaves it, with its meta."""
    raw = tmp_path / "earlier" / "regenerated.jsonl"
    raw.parent.mkdir()
    raw.write_text(
        "".join(json.dumps({"prompt": p["prompt"], "completion": " x = 1\n"}) + "\n" for p in PAIRS)
    )
    regen_reuse.write_meta(str(raw), target, max_tokens)
    return raw


def test_the_same_target_and_prompts_are_reused(tmp_path):
    target = _target(tmp_path / "t", b"weights")
    raw = _earlier_run(tmp_path, target)
    got = regen_reuse.reuse(str(raw), PAIRS, str(tmp_path / "regen"), target, 128)
    assert got["prompts"] == 2 and got["generated"] == 0 and got["reused"] == str(raw)
    assert Path(got["raw"]).read_text() == raw.read_text()  # the file the trainer's prepare then reads
    assert os.path.isfile(got["raw"] + regen_reuse.META)  # reusable again


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("weights", "another target"),
        ("tokens", "responses of 128 tokens, this run writes 64"),
        ("prompt", "prompt 1 is not this run's"),
        ("count", "2 responses, this run has 3 prompts"),
        ("meta", "is missing"),
        ("link", "not a plain file"),
        ("line", "not a {'prompt': str, 'completion': str} line"),
    ],
)
def test_what_does_not_fit_is_refused_naming_why(tmp_path, change, why):
    target = _target(tmp_path / "t", b"weights")
    raw = _earlier_run(tmp_path, target)
    pairs, max_tokens, src = list(PAIRS), 128, str(raw)
    if change == "weights":
        target = _target(tmp_path / "t2", b"other weights")
    elif change == "tokens":
        max_tokens = 64
    elif change == "prompt":
        pairs[1] = {"prompt": "import sys", "completion": ""}
    elif change == "count":
        pairs.append({"prompt": "x", "completion": ""})
    elif change == "meta":
        os.remove(src + regen_reuse.META)
    elif change == "link":
        os.symlink(src, tmp_path / "link.jsonl")
        os.symlink(src + regen_reuse.META, str(tmp_path / "link.jsonl") + regen_reuse.META)
        src = str(tmp_path / "link.jsonl")
    elif change == "line":
        raw.write_text(raw.read_text() + '{"prompt": 3}\n')
    with pytest.raises(ValueError, match=re.escape(why)):
        regen_reuse.reuse(src, pairs, str(tmp_path / "regen"), target, max_tokens)
    assert not (tmp_path / "regen" / "regenerated.jsonl").exists()


def test_it_needs_generated_text(tmp_path, capsys):
    ap = build_parser()
    argv = [
        "--tiny",
        "--out",
        str(tmp_path),
        "--regen-from",
        str(tmp_path / "r.jsonl"),
        "--train-text",
        "data",
    ]
    with pytest.raises(SystemExit):
        settle(ap, ap.parse_args(argv))
    assert "--regen-from takes the target's responses" in capsys.readouterr().err

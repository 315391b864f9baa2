"""`python -m trainer.tiny` output loads offline with transformers; prepare tokenizes chat data with it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.trainer_run import ROOT, env


def test_tiny_target_and_tokenizer_load_offline(tiny_assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_assets / "target", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_assets / "target", local_files_only=True)
    assert model.config.model_type == "qwen3"
    assert (tiny_assets / "target" / "model.safetensors").exists()
    assert tok.mask_token_id == model.config.vocab_size - 1  # the drafter's default mask token
    ids = tok("count from 3 by 2", add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == "count from 3 by 2"


@pytest.mark.e2e
def test_prepare_masks_assistant_turns(tiny_assets, tmp_path):
    raw = tmp_path / "in.jsonl"
    raw.write_text(
        "\n".join(
            [
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": "repeat 1 2"},
                            {"role": "assistant", "content": "1 2 1 2"},
                        ]
                    }
                ),
                json.dumps({"prompt": "count from 5 by 1 ", "completion": "5 6 7 8"}),
            ]
        )
        + "\n"
    )
    out = tmp_path / "data"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.prepare",
            "--tokenizer",
            str(tiny_assets / "target"),
            "--input",
            str(raw),
            "--output-dir",
            str(out),
        ],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_assets / "target", local_files_only=True)
    recs = [json.loads(x) for x in (out / "part-00000.jsonl").read_text().splitlines()]
    trained = [
        tok.convert_ids_to_tokens([i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m])
        for r in recs
    ]
    assert trained[0] == ["1", "2", "1", "2", "<|im_end|>"]
    assert trained[1] == ["5", "6", "7", "8"]
    raw.write_text('{"text": "1 2 3"}\n{"messages": []}\n')
    from trainer.data.tokenizing import PrepareError, prepare

    with pytest.raises(PrepareError, match=f"{raw}:2: messages must be a non-empty list"):
        prepare(tok, [str(raw)], str(tmp_path / "d2"))


def test_tiny_data_is_in_the_trainer_format(tiny_assets):
    from trainer.data.dataset import load_dir

    ds = load_dir(str(tiny_assets / "data"), 4096)
    assert len(ds) >= 100 and ds.dropped == 0 and 0 < ds.mask.mean() < 1


def test_prepare_heldout_split_is_disjoint_and_deterministic(tiny_assets, tmp_path):
    from transformers import AutoTokenizer

    from trainer.data.tokenizing import prepare

    tok = AutoTokenizer.from_pretrained(tiny_assets / "target", local_files_only=True)
    raw = tiny_assets / "raw" / "chat.jsonl"
    stats = prepare(tok, [str(raw)], str(tmp_path / "d"), heldout_fraction=0.1)
    lines = lambda p: [ln for f in sorted(p.glob("*.jsonl")) for ln in f.read_text().splitlines()]  # noqa: E731
    train, held = lines(tmp_path / "d"), lines(tmp_path / "d" / "heldout")
    assert stats["heldout_sequences"] == len(held) and stats["sequences"] == len(train)
    assert 10 < len(held) < 80 and len(train) + len(held) == 400  # ~10% of the 400 chats
    assert not set(train) & set(held)
    prepare(tok, [str(raw)], str(tmp_path / "e"), heldout_fraction=0.1)
    assert lines(tmp_path / "e" / "heldout") == held

"""trainer.prepare's served-text check: the trained text against what the server's template renders."""

from __future__ import annotations

import json

import pytest

from tests.support.chat_tokenizer import qwen3_chat_tokenizer
from trainer.data.tokenizing import main

ONE_TURN = {
    "messages": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\n7 has no divisor\n</think>\n\nYes."},
    ]
}
TWO_TURNS = {
    "messages": [
        *ONE_TURN["messages"],
        {"role": "user", "content": "And 9?"},
        {"role": "assistant", "content": "<think>\n3 x 3\n</think>\n\nNo."},
    ]
}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3_tok")
    qwen3_chat_tokenizer().save_pretrained(d)
    return d


def _prepare(tok_dir, tmp_path, records, *flags):
    raw = tmp_path / "in.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    argv = ["--tokenizer", str(tok_dir), "--input", str(raw), "--output-dir", str(out), "--overwrite", *flags]
    return main(argv), raw, out


def test_thinking_trained_but_served_without_fails_at_the_first_difference(tok_dir, tmp_path, capsys):
    rc, raw, out = _prepare(
        tok_dir, tmp_path, [ONE_TURN], "--served-template-kwargs", '{"enable_thinking": false}'
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{raw}:1: assistant turn (message 1)" in err and "prompt for it" in err
    # the served prompt ends in an empty think block; the trained text goes on with the thinking itself
    p = len("<|im_start|>user\nIs 7 prime?<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert f"at character {p}:" in err and "'7 has no divisor" in err
    assert not out.exists()  # nothing written before the check
    # served as trained (thinking on): passes; or thinking dropped when the server has it off: passes
    assert _prepare(tok_dir, tmp_path, [ONE_TURN])[0] == 0
    flags = ("--served-template-kwargs", '{"enable_thinking": false}', "--thinking", "drop")
    assert _prepare(tok_dir, tmp_path, [ONE_TURN], *flags)[0] == 0


def test_template_dropping_earlier_thinking_is_caught_and_turns_split_or_last_fix_it(
    tok_dir, tmp_path, capsys
):
    rc, raw, _ = _prepare(tok_dir, tmp_path, [ONE_TURN, TWO_TURNS])
    err = capsys.readouterr().err
    assert rc == 2 and f"{raw}:2: assistant turn (message 1)" in err and "as the newest turn" in err
    p = len("<|im_start|>user\nIs 7 prime?<|im_end|>\n<|im_start|>assistant\n")
    assert f"at character {p}:" in err
    assert _prepare(tok_dir, tmp_path, [ONE_TURN, TWO_TURNS], "--turns", "split")[0] == 0
    # only the last turn trained (a regenerated reply after the data's history): checked and passing
    rc, _, out = _prepare(tok_dir, tmp_path, [ONE_TURN, TWO_TURNS], "--turns", "last")
    assert rc == 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    recs = [json.loads(x) for x in (out / "part-00000.jsonl").read_text().splitlines()]
    trained = [
        tok.decode([i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m]) for r in recs
    ]
    assert trained == [
        "<think>\n7 has no divisor\n</think>\n\nYes.<|im_end|>\n",
        "<think>\n3 x 3\n</think>\n\nNo.<|im_end|>\n",
    ]
    assert (
        _prepare(tok_dir, tmp_path, [ONE_TURN, TWO_TURNS], "--served-check", "1")[0] == 0
    )  # checks line 1 only

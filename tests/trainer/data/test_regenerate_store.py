"""The regeneration's output directory: what a resumed run reads back, and the prompts' keys."""

from __future__ import annotations

import json

import pytest

from trainer.regeneration import store
from trainer.regeneration.prompt_file import read_prompts


def test_a_cut_last_line_is_dropped_and_a_damaged_line_before_it_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    good = [json.dumps({"key": k, "prompt": "p", "completion": "c"}) + "\n" for k in ("a", "b")]
    (out / store.OUTPUT).write_text("".join(good) + '{"key": "c", "prom', encoding="utf-8")
    assert store.done_keys(str(out)) == {"a", "b"}
    assert (out / store.OUTPUT).read_text(encoding="utf-8") == "".join(good)  # ready to append to
    (out / store.OUTPUT).write_text(good[0] + "{not json\n" + good[1], encoding="utf-8")
    with pytest.raises(store.StoreError, match=r":2: not valid JSON"):
        store.done_keys(str(out))


def test_keys_follow_the_prompt_the_settings_and_repeats(tmp_path):
    inp = tmp_path / "in.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "old"}]}
    other = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "other"}]}
    inp.write_text("\n".join(json.dumps(r) for r in (chat, other, chat)) + "\n", encoding="utf-8")
    keys = [p.key for p in read_prompts(str(inp), "chat", {"temperature": 0})]
    assert len(set(keys)) == 3  # the data's old reply is not the prompt: a repeat is its own result
    again = [p.key for p in read_prompts(str(inp), "chat", {"temperature": 0})]
    assert again == keys
    hot = [p.key for p in read_prompts(str(inp), "chat", {"temperature": 1})]
    assert not set(hot) & set(keys)
    assert read_prompts(str(inp), "chat", {})[0].messages == [{"role": "user", "content": "hi"}]

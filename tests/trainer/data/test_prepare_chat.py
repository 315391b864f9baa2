"""trainer.prepare on chat data: multi-turn and tool-call loss masks, thinking keep / drop / mask, template
kwargs (a real byte-level tokenizer with a Qwen3-style template: tests/support/chat_tokenizer.py)."""

from __future__ import annotations

import json

import pytest

from tests.support.chat_tokenizer import qwen3_chat_tokenizer
from trainer.data.tokenizing import ChatOptions, PrepareError, encode_record, main, prepare

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CONV = {
    "tools": TOOLS,
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 C.", "reasoning_content": "the tool said 21"},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "<think>\nno data\n</think>\n\nUnknown."},
    ],
}
# what the template renders for each assistant turn after its header (Qwen3: thinking only after the last query)
TURNS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n',
    "It is 21 C.<|im_end|>\n",
    "<think>\nno data\n</think>\n\nUnknown.<|im_end|>\n",
]


@pytest.fixture(scope="module")
def tok():
    return qwen3_chat_tokenizer()


def _expected_mask(tok, text: str, pieces: list[str]) -> list[int]:
    """1 for the tokens inside ``pieces``, located in order in ``text``."""
    spans, cursor = [], 0
    for piece in pieces:
        start = text.index(piece, cursor)
        spans.append((start, start + len(piece)))
        cursor = start + len(piece)
    offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return [int(any(s <= a < e for s, e in spans)) for a, _ in offsets]


def _roles(runs) -> list[str]:
    return [r for r, n in runs for _ in range(n)]


def test_multi_turn_tool_call_mask_is_right_token_by_token(tok):
    [(ids, mask, runs)] = encode_record(tok, CONV)
    text = tok.apply_chat_template(CONV["messages"], tools=TOOLS, tokenize=False)
    assert tok.decode(ids) == text
    assert mask == _expected_mask(tok, text, TURNS)
    roles = _roles(runs)
    assert len(roles) == len(ids)
    for role in ("system", "user", "tool", "template"):  # every non-assistant token is untrained
        picked = [m for m, r in zip(mask, roles, strict=True) if r == role]
        assert picked and not any(picked), role
    for role, content in (
        ("user", "Weather in Paris?"),
        ("tool", '{"temp": 21}'),
        ("system", "You are terse."),
    ):
        assert content in tok.decode([i for i, r in zip(ids, roles, strict=True) if r == role])
    assert all(m for m, r in zip(mask, roles, strict=True) if r in ("assistant", "thinking"))


def test_thinking_keep_drop_mask(tok):
    rec = {"messages": CONV["messages"][5:]}  # a user turn and a thinking answer
    rec["messages"] = [{"role": "user", "content": "And tomorrow?"}, CONV["messages"][6]]
    trained = {}
    for mode in ("keep", "drop", "mask"):
        [(ids, mask, runs)] = encode_record(tok, rec, ChatOptions(thinking=mode))
        trained[mode] = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
        if mode == "mask":
            text = tok.decode(ids)
            assert "<think>\nno data\n</think>" in text  # in the text ...
            thinking = [m for m, r in zip(mask, _roles(runs), strict=True) if r == "thinking"]
            assert thinking and not any(thinking)  # ... but not trained
    assert trained["keep"] == "<think>\nno data\n</think>\n\nUnknown.<|im_end|>\n"
    assert trained["drop"] == "<think>\n\n</think>\n\nUnknown.<|im_end|>\n"  # the template's empty block
    assert trained["mask"] == "\n\nUnknown.<|im_end|>\n"
    # reasoning_content is thinking too
    rc = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"},
        ]
    }
    [(ids, mask, _)] = encode_record(tok, rc, ChatOptions(thinking="drop"))
    assert "r\n</think>" not in tok.decode(ids)


def test_template_kwargs_reach_the_template(tmp_path, capsys):
    tok = qwen3_chat_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    raw = tmp_path / "in.jsonl"
    raw.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
        + "\n"
    )
    # a template that renders a kwarg shows that it is passed (the Qwen3 one reads enable_thinking only when prompting)
    tok.chat_template = "{{ 'mode=' ~ mode ~ ' ' }}" + tok.chat_template
    tok.save_pretrained(tmp_path / "tok2")
    out = tmp_path / "d"
    rc = main(
        [
            "--tokenizer",
            str(tmp_path / "tok2"),
            "--input",
            str(raw),
            "--output-dir",
            str(out),
            "--chat-template-kwargs",
            '{"mode": "fast"}',
        ]
    )
    assert rc == 0, capsys.readouterr().err
    rec = json.loads((out / "part-00000.jsonl").read_text())
    assert tok.decode(rec["input_ids"]).startswith("mode=fast ")
    bads = (
        ("[1, 2]", "must be a JSON object"),
        ("{enable", "not valid JSON"),
        ('{"tokenize": true}', "tokenize"),
    )
    for bad, what in bads:
        rc = main(
            [
                "--tokenizer",
                str(tmp_path / "tok"),
                "--input",
                str(raw),
                "--output-dir",
                str(out),
                "--chat-template-kwargs",
                bad,
            ]
        )
        err = capsys.readouterr().err
        assert rc == 2 and "--chat-template-kwargs" in err and what in err


def test_split_turns_trains_each_turn_once_as_the_newest(tok, tmp_path):
    raw = tmp_path / "in.jsonl"
    raw.write_text(json.dumps(CONV) + "\n")
    stats = prepare(tok, [str(raw)], str(tmp_path / "d"), options=ChatOptions(turns="split"))
    recs = [json.loads(x) for x in (tmp_path / "d" / "part-00000.jsonl").read_text().splitlines()]
    assert stats["sequences"] == len(recs) == 3
    trained = [
        tok.decode([i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m]) for r in recs
    ]
    # each turn the newest: the template renders its thinking (the first turn's think block is empty)
    assert trained[0] == "<think>\n\n</think>\n\n" + TURNS[0]
    assert trained[1] == "<think>\nthe tool said 21\n</think>\n\n" + TURNS[1]
    assert trained[2] == TURNS[2]


def test_bad_chat_records_name_file_and_line(tok, tmp_path):
    raw = tmp_path / "in.jsonl"
    raw.write_text(
        '{"text": "ok"}\n' + json.dumps({"messages": [{"role": "assistant", "content": 3}]}) + "\n"
    )
    with pytest.raises(PrepareError, match=f"{raw}:2: each message needs string"):
        prepare(tok, [str(raw)], str(tmp_path / "d"))
    strict = qwen3_chat_tokenizer()
    strict.chat_template = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('needs a system turn') }}{% endif %}"
    )
    raw.write_text('{"text": "ok"}\n' + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(PrepareError, match=f"{raw}:2: the chat template failed: .*needs a system turn"):
        prepare(strict, [str(raw)], str(tmp_path / "d"))
    raw.write_text(json.dumps({"tools": {}, "messages": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(PrepareError, match=f'{raw}:1: "tools" must be a list'):
        prepare(tok, [str(raw)], str(tmp_path / "d"))

"""The server's reply as ``trainer.regenerate`` reads it: reasoning back into the content, tool calls kept, the
record's tools sent; anything not the API's shape refused."""

from __future__ import annotations

import json

import pytest

from trainer.regeneration.client import Permanent, ServerConfig, parse_reply, request_body
from trainer.regeneration.prompt_file import Prompt, output_record

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_reasoning_and_tool_calls_become_the_assistant_turn_prepare_reads():
    msg = {
        "role": "assistant",
        "content": "\n\nthe answer",
        "reasoning_content": "I think\n",
        "tool_calls": [CALL],
    }
    raw = json.dumps({"choices": [{"message": msg, "finish_reason": "tool_calls"}]}).encode()
    text, finish, calls, _ = parse_reply(raw, chat=True)
    assert text == "<think>\nI think\n</think>\n\nthe answer" and finish == "tool_calls" and calls == [CALL]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    p = Prompt(0, "k", [{"role": "user", "content": "add"}], None, tools)
    body = request_body(ServerConfig("http://127.0.0.1:1", "m", thinking="on"), p)
    assert body["tools"] == tools and body["chat_template_kwargs"] == {"enable_thinking": True}
    rec = output_record(p, text, finish, calls)
    assert rec["messages"][-1] == {"role": "assistant", "content": text, "tool_calls": [CALL]}
    assert rec["tools"] == tools


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"choices": []}',
        b'{"choices": ["x"]}',
        b'{"choices": [{"message": "x"}]}',
        b'{"choices": [{"message": {"content": ["x"]}}]}',
        b'{"choices": [{"message": {"content": "x", "tool_calls": {"a": 1}}}]}',
        b'{"choices": [{"message": {"content": "x"}, "finish_reason": 3}]}',
        b"{" * 100_000,
    ],
)
def test_a_reply_not_of_the_apis_shape_is_refused(raw):
    with pytest.raises(Permanent):
        parse_reply(raw, chat=True)


@pytest.mark.parametrize(
    ("usage", "want"),
    [({"completion_tokens": 5}, 5), ({"completion_tokens": "5"}, None), ({"completion_tokens": -1}, None),
     ({"completion_tokens": True}, None), ("x", None), (None, None)],
)  # fmt: skip
def test_the_usage_token_count_is_read_only_when_it_is_a_count(usage, want):
    rep = {"choices": [{"text": "t", "finish_reason": "length"}], "usage": usage}
    assert parse_reply(json.dumps(rep).encode(), chat=False).tokens == want

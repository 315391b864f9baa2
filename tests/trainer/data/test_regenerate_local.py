"""``python -m trainer.regenerate --target-model``: in-process batched decoding on CPU (left-padded batches of
prompts of different lengths), checked against the target's own greedy ``model.generate``, one prompt at a
time, for a dense and a hybrid target."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.openai_server import TinyTarget
from trainer.regeneration import command, store
from trainer.regeneration.local import _pick

NEW = 8


def prompts() -> list[dict]:
    out = [{"messages": [{"role": "user", "content": "count from 3 by 1"}]}]
    out.append(
        {"messages": [{"role": "user", "content": "repeat 7 8 9 " * 6}]}
    )  # longer: padding for the rest
    out.append(
        {
            "messages": [
                {"role": "system", "content": "ok"},
                {"role": "user", "content": "count from 40 by 2"},
                {"role": "assistant", "content": "40 42 44"},
                {"role": "user", "content": "please repeat"},
            ]
        }
    )
    out += [{"messages": [{"role": "user", "content": f"repeat {i}"}]} for i in range(2)]
    return out


@pytest.mark.parametrize("assets", ["tiny_assets", "tiny_hybrid"])
def test_batched_greedy_decoding_is_the_targets_generate(assets, request, tmp_path, capsys):
    tiny_assets = request.getfixturevalue(assets)  # a dense Qwen3; a hybrid Qwen3.5 (linear attention)
    recs = prompts()
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--input", str(inp), "--output", str(out), "--target-model", str(tiny_assets / "target"),
            "--batch-size", "2", "--max-tokens", str(NEW), "--progress-every", "0"]  # fmt: skip
    assert command.main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    got = [json.loads(x) for x in (out / store.OUTPUT).read_text().splitlines()]
    ref = TinyTarget(str(tiny_assets / "target"))
    assert len(got) == len(recs)
    for rec, g in zip(recs, got, strict=True):
        want, finish, tokens = ref.answer({"messages": rec["messages"], "max_tokens": NEW})
        assert g["messages"] == [*rec["messages"], {"role": "assistant", "content": want}]
        assert g["finish_reason"] == finish and g["completion_tokens"] == tokens
    assert summary["generated_tokens"] == sum(g["completion_tokens"] for g in got) > 0


def test_top_p_samples_only_from_the_nucleus():
    logits = torch.log(torch.tensor([[0.05, 0.6, 0.25, 0.1], [0.4, 0.1, 0.1, 0.4]]))
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([_pick(logits, 1.0, 0.7, g) for _ in range(400)])
    assert set(draws[:, 0].tolist()) == {1, 2}  # 0.6 < 0.7: the second token joins, no other
    assert set(draws[:, 1].tolist()) == {0, 3}
    assert set(torch.stack([_pick(logits, 1.0, 0.5, g) for _ in range(50)])[:, 0].tolist()) == {1}
    assert _pick(logits, 0.0, 0.1, g).tolist() == [1, 0]  # temperature 0: argmax


def test_output_of_a_retrained_target_is_not_taken_as_done(tiny_assets, tmp_path, capsys):
    """The same --target-model path with other weights (a retrained target) is refused, not resumed."""
    import os
    import shutil

    target = tmp_path / "target"
    shutil.copytree(tiny_assets / "target", target)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps(prompts()[0]) + "\n", encoding="utf-8")
    argv = ["--input", str(inp), "--output", str(tmp_path / "out"), "--target-model", str(target),
            "--max-tokens", "2", "--progress-every", "0"]  # fmt: skip
    assert command.main(argv) == 0
    assert command.main(argv) == 0  # unchanged: resumed, nothing to do
    assert '"already_done": 1' in capsys.readouterr().out
    weights = next(target.glob("*.safetensors"))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # written again
    assert command.main(argv) == 2
    err = capsys.readouterr().err
    assert "other settings (target_files)" in err and "target's files changed" in err


def test_a_tokenizer_without_a_chat_template_renders_conversations_as_prepare_does(tiny_assets):
    """A target whose tokenizer has no chat template: the conversation is rendered as ``trainer.prepare``
    renders it (``role: content`` lines), not a crash."""
    from transformers import AutoTokenizer

    from trainer.data.chat import Render
    from trainer.regeneration.local import render
    from trainer.regeneration.prompt_file import Prompt

    tok = AutoTokenizer.from_pretrained(str(tiny_assets / "target"), local_files_only=True)
    tok.chat_template = None
    msgs = [{"role": "user", "content": "count from 3 by 1"}]
    ids = render(tok, Prompt(0, "k", messages=msgs, text=None), thinking="off")
    want = Render()(tok, msgs, add_generation_prompt=True)
    assert want.endswith("assistant: ") and ids == tok(want, add_special_tokens=False)["input_ids"]

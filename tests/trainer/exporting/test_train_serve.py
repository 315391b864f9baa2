"""The train/serve checks of ``trainer.export --check``: each fails on a deliberately broken export, target or
data set, naming the key, and passes on the good one (a real export, a real tokenizer with Qwen3's template,
data written by ``trainer.prepare``)."""

from __future__ import annotations

import json

import pytest

from tests.support.chat_tokenizer import qwen3_chat_tokenizer
from tests.trainer.exporting.test_checks import ALL, _set, errors
from trainer.exporting import check_dir
from trainer.exporting.problems import ERROR
from trainer.exporting.reader import read_target
from trainer.exporting.target_files import read_tokenizer
from trainer.exporting.train_serve import Serving, read_prepared

ONE_TURN = {
    "messages": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\n7 has no divisor\n</think>\n\nYes."},
    ]
}


def messages(path, servers=ALL, target=None, serving=None) -> dict[str, list[str]]:
    """``{server: [message of each error]}``."""
    extra = () if serving is None else (serving,)
    res = check_dir(str(path), servers, target, *extra)
    return {s: [p.message for p in ps if p.severity == ERROR] for s, ps in res.items()}


def test_is_causal_true_is_named_as_set_not_unset(variant):
    got = messages(variant("swa", _set("is_causal", True)))
    for server in ALL:
        (msg,) = got[server]
        assert "(is_causal true)" in msg and "unset" not in msg, (server, msg)

    # vLLM's own override, dflash_config.causal, when is_causal is absent
    def causal(conf):
        del conf["is_causal"]
        conf["dflash_config"]["causal"] = True

    (msg,) = messages(variant("swa", causal), ["vllm"])["vllm"]
    assert "(dflash_config.causal true)" in msg


# (edit, the key each server's error names; None: that server builds the RoPE as trained)
ROPE_CASES = {
    "partial_rotary_factor at the top": (_set("partial_rotary_factor", 0.25), "partial_rotary_factor"),
    "partial_rotary_factor in rope_parameters": (
        _set("rope_parameters", lambda d: {**d, "partial_rotary_factor": 0.5}),
        "rope_parameters.partial_rotary_factor",
    ),
    "rope_dim under head_dim": (
        _set("rope_scaling", {"rope_type": "default", "rope_dim": 8}),
        {"zlab": None, "vllm": None, "sglang": "rope_scaling.rope_dim"},
    ),
    "rope_parameters and rope_scaling disagree": (
        _set("rope_parameters", lambda d: {**d, "rope_type": "yarn", "factor": 4.0}),
        "rope_parameters.rope_type",
    ),
    "rope_theta and rope_parameters disagree": (
        _set("rope_theta", 1_000_000.0),
        "rope_parameters.rope_theta",
    ),
    "is_neox_style false": (
        _set("is_neox_style", False),
        {"zlab": None, "vllm": "is_neox_style", "sglang": "is_neox_style"},
    ),
    "rope_is_neox_style false": (
        _set("rope_is_neox_style", False),
        {"zlab": None, "vllm": None, "sglang": "rope_is_neox_style"},
    ),
}


@pytest.mark.parametrize("case", list(ROPE_CASES))
def test_a_rotary_setting_other_than_trained_fails_the_servers_that_read_it(variant, case):
    edit, want = ROPE_CASES[case]
    want = want if isinstance(want, dict) else {s: want for s in ALL}
    got = errors(variant("dflash", edit))
    for server, key in want.items():
        assert got[server] == ([] if key is None else [key]), (server, got[server])


def test_is_neox_style_true_passes(variant):
    assert errors(variant("dflash", _set("is_neox_style", True))) == {s: [] for s in ALL}


def _target(tmp_path, name="target", tokenizer=None, **config):
    from tests.support.model_util import tiny_target_config

    path = tmp_path / name
    tiny_target_config(num_hidden_layers=4, **config).save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def test_rope_against_the_target(exports, tmp_path):
    good = read_target(_target(tmp_path))
    assert errors(exports["dflash"], target=good) == {s: [] for s in ALL}
    theta = read_target(
        _target(tmp_path, "theta", rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    )
    assert all(k == ["rope_theta"] for k in errors(exports["dflash"], target=theta).values())
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    scaled = read_target(_target(tmp_path, "yarn", rope_parameters=yarn))
    assert all(k == ["rope_scaling"] for k in errors(exports["dflash"], target=scaled).values())


@pytest.fixture(scope="module")
def tok():
    return qwen3_chat_tokenizer()


@pytest.fixture
def tokenized_target(tmp_path, tok):
    """A tiny target (vocab 300) with the Qwen3-template tokenizer (ids 0..264; 265.. unused rows)."""
    return _target(tmp_path, "tok_target", tok, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))


def _mask_errors(path, target_dir) -> dict[str, list[str]]:
    serving = Serving(tokenizer=read_tokenizer(str(target_dir)))
    return messages(path, target=read_target(str(target_dir)), serving=serving)


def test_the_mask_token_maps_to_no_other_token(variant, exports, tokenized_target, tok):
    assert _mask_errors(exports["dflash"], tokenized_target) == {s: [] for s in ALL}  # 299: an unused row
    cases = {
        "a byte of the vocabulary": (tok.convert_tokens_to_ids("a"), "a token of the target's vocabulary"),
        "the eos token": (tok.convert_tokens_to_ids("<|im_end|>"), "eos_token_id in config.json"),
        "the pad token": (tok.convert_tokens_to_ids("<|endoftext|>"), "pad_token"),
        "an added token": (tok.convert_tokens_to_ids("<think>"), 'added token "<think>"'),
        "a chat special token": (tok.convert_tokens_to_ids("<|im_start|>"), 'added token "<|im_start|>"'),
    }
    for case, (mask, said) in cases.items():
        path = variant("dflash", _set("dflash_config.mask_token_id", mask))
        got = _mask_errors(path, tokenized_target)
        for server in ALL:
            assert len(got[server]) == 1 and said in got[server][0], (case, server, got[server])


def test_a_mask_beyond_the_targets_embedding_fails(variant, tmp_path):
    """A drafter whose vocabulary is larger than the target's: its mask row does not exist in the target."""
    target = read_target(_target(tmp_path, vocab_size=280))
    got = check_dir(str(variant("dflash")), ALL, target, Serving())
    for server in ALL:
        keys = [p.key for p in got[server] if p.severity == ERROR]
        assert "dflash_config.mask_token_id" in keys and "vocab_size" in keys, (server, keys)


def _meta(data_dir: str) -> dict:
    with open(data_dir + "/prepare.json", encoding="utf-8") as f:
        return json.load(f)


def _prepare(tmp_path, tok_dir, name, *flags) -> str:
    from trainer.data.tokenizing import main

    raw = tmp_path / "in.jsonl"
    raw.write_text(json.dumps(ONE_TURN) + "\n")
    out = tmp_path / name
    assert main(["--tokenizer", str(tok_dir), "--input", str(raw), "--output-dir", str(out), *flags]) == 0
    return str(out)


def _serving(target_dir, data_dir, serve_thinking) -> Serving:
    data, problems = read_prepared(data_dir)
    return Serving(read_tokenizer(str(target_dir)), data, tuple(problems), serve_thinking)


def test_prepare_records_the_template_and_thinking(tmp_path, tokenized_target):
    from trainer.exporting.templates import template_sha256

    meta = _meta(_prepare(tmp_path, tokenized_target, "on"))
    assert meta["chat_template_sha256"] == template_sha256(
        read_tokenizer(str(tokenized_target)).chat_template
    )
    assert meta["prompt_thinking"] == "on" and meta["thinking"] == "keep"
    assert 0 < meta["trained_thinking_tokens"] < meta["trained_tokens"]
    flags = ("--chat-template-kwargs", '{"enable_thinking": false}', "--thinking", "drop")
    meta = _meta(_prepare(tmp_path, tokenized_target, "off", *flags))
    assert meta["prompt_thinking"] == "off" and meta["thinking"] == "drop"
    assert meta["trained_thinking_tokens"] == 0


def test_thinking_served_otherwise_than_prepared_fails(exports, tmp_path, tokenized_target):
    path, target = exports["dflash"], read_target(str(tokenized_target))
    on = _prepare(tmp_path, tokenized_target, "on")
    off = _prepare(
        tmp_path,
        tokenized_target,
        "off",
        "--chat-template-kwargs",
        '{"enable_thinking": false}',
        "--thinking",
        "drop",
        "--served-template-kwargs",
        '{"enable_thinking": false}',
    )
    for data, serve in ((on, "on"), (off, "off"), (on, None)):
        assert errors(path, target=target) == {s: [] for s in ALL}
        assert messages(path, target=target, serving=_serving(tokenized_target, data, serve)) == {
            s: [] for s in ALL
        }, (data, serve)
    got = check_dir(str(path), ALL, target, _serving(tokenized_target, on, "off"))
    for server in ALL:
        assert [p.key for p in got[server] if p.severity == ERROR] == ["enable_thinking"]
    got = check_dir(str(path), ALL, target, _serving(tokenized_target, off, "on"))
    for server in ALL:
        assert [p.key for p in got[server] if p.severity == ERROR] == ["enable_thinking", "thinking"]


def test_a_template_other_than_the_targets_fails(exports, tmp_path, tokenized_target, tok):
    data = _prepare(tmp_path, tokenized_target, "data")
    other = qwen3_chat_tokenizer()
    other.chat_template = tok.chat_template.replace("<think>\\n\\n</think>", "<think>\\n</think>")
    assert other.chat_template != tok.chat_template
    served = _target(tmp_path, "other", other)
    got = check_dir(str(exports["dflash"]), ALL, read_target(str(served)), _serving(served, data, "on"))
    for server in ALL:
        assert [p.key for p in got[server] if p.severity == ERROR] == ["chat_template"]


def test_data_without_prepare_json_fails(exports, tmp_path, tokenized_target):
    data = tmp_path / "old"
    data.mkdir()
    (data / "part-00000.jsonl").write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n')
    got = check_dir(str(exports["dflash"]), ["vllm"], None, _serving(tokenized_target, str(data), "on"))
    (p,) = [p for p in got["vllm"] if p.severity == ERROR]
    assert p.key == "prepare.json" and "missing" in p.message


def test_dflash2_names_the_server_versions_that_serve_it(exports):
    res = check_dir(str(exports["dflash2"]), ["vllm", "sglang"])
    vllm = [p.message for p in res["vllm"] if p.key == "architectures"]
    sglang = [p.message for p in res["sglang"] if p.key == "architectures"]
    assert any("from 0.32 on" in m and "V2 model runner" in m for m in vllm), vllm
    assert any("0.5.23" in m for m in sglang), sglang


def test_a_repeated_target_layer_says_what_vllm_does(variant):
    got = messages(variant("dflash", _set("dflash_config.target_layer_ids", [1, 1])), ["vllm"])
    (msg,) = got["vllm"]
    assert "fails at the first request" in msg and "--target-layer-ids" in msg


def test_a_dedicated_mask_token_passes(variant, tmp_path):
    tok = qwen3_chat_tokenizer()
    tok.add_special_tokens({"mask_token": "<|dflash_slot|>"})  # the tokenizer's own mask token, any name
    target = _target(tmp_path, "masked", tok)
    path = variant("dflash", _set("dflash_config.mask_token_id", tok.mask_token_id))
    assert _mask_errors(path, target) == {s: [] for s in ALL}
    other = qwen3_chat_tokenizer()
    other.add_tokens(["<|dflash_slot|>"], special_tokens=True)  # the same token, not the mask token
    got = _mask_errors(path, _target(tmp_path, "unmasked", other))
    assert all(len(m) == 1 and "<|dflash_slot|>" in m[0] for m in got.values()), got


def test_the_tokenizers_own_mask_token_passes_when_the_vocabulary_holds_it_too(variant, tmp_path):
    """trainer.tiny's tokenizer: ``<|mask|>`` is its mask token, a special added token, and a piece of its
    word-level vocabulary as well (same id): text reaches that id only as the mask token."""
    from trainer.data.tiny_build import VOCAB_SIZE, build_tokenizer

    tok = build_tokenizer()
    target = _target(tmp_path, "tiny_tok", tok)
    assert tok.mask_token_id == VOCAB_SIZE - 1 and tok.mask_token in tok.get_vocab()
    path = variant("dflash", _set("dflash_config.mask_token_id", tok.mask_token_id))
    assert _mask_errors(path, target) == {s: [] for s in ALL}

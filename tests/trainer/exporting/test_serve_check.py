"""``python -m trainer.serve_check``: the train/serve checks of a run before it starts, from its trainer flags
alone (no weights, no export): each fails on a broken data set or flag set and passes on a good one. The
target is a config.json and a real tokenizer with Qwen3's template; the data is written by ``trainer.prepare``
(the fixtures of test_train_serve.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support.chat_tokenizer import qwen3_chat_tokenizer
from tests.trainer.exporting.test_train_serve import _prepare, _target, tok, tokenized_target  # noqa: F401
from trainer.serve_check import drafter_config, main

THINKING_OFF = (
    "--chat-template-kwargs",
    '{"enable_thinking": false}',
    "--thinking",
    "drop",
    "--served-template-kwargs",
    '{"enable_thinking": false}',
)


def _flags(target, data, run, *extra) -> list[str]:
    cpu = ("--target-gpus", "cpu", "--drafter-gpus", "cpu")
    return ["--target-model", str(target), "--data-dir", str(data), "--output-dir", str(run), *cpu, *extra]


def check(capsys, serve, thinking, flags) -> tuple[int, dict]:
    """(exit code, the JSON it printed) of ``trainer.serve_check`` in this process."""
    args = ["--serve", serve, *(["--serve-thinking", thinking] if thinking else []), "--json", "--", *flags]
    capsys.readouterr()
    rc = main(args)
    out = capsys.readouterr().out
    return rc, json.loads(out) if rc in (0, 1) else {}


def keys(doc: dict, severity: str = "error") -> list[str]:
    (server,) = doc["servers"].values()
    return [p["key"] for p in server["problems"] if p["severity"] == severity]


@pytest.fixture
def good(tmp_path, tokenized_target):  # noqa: F811
    """(target, data prepared with thinking on, data prepared with thinking off, run dir)."""
    on = _prepare(tmp_path, tokenized_target, "on")
    off = _prepare(tmp_path, tokenized_target, "off", *THINKING_OFF)
    return tokenized_target, on, off, tmp_path / "run"


@pytest.mark.parametrize("serve", ["vllm", "sglang"])
def test_good_flags_and_data_pass(capsys, good, serve):
    target, on, off, run = good
    for data, thinking in ((on, "on"), (off, "off"), (on, None)):
        rc, doc = check(capsys, serve, thinking, _flags(target, data, run))
        assert rc == 0 and doc["ok"] and keys(doc) == [], (data, thinking, doc)
        assert doc["serve"] == serve and doc["target"] == str(target)
    assert not run.exists()  # it reads; nothing is written


def test_thinking_served_otherwise_than_prepared_fails(capsys, good):
    target, on, off, run = good
    rc, doc = check(capsys, "vllm", "off", _flags(target, on, run))
    assert rc == 1 and keys(doc) == ["enable_thinking"]
    rc, doc = check(capsys, "vllm", "on", _flags(target, off, run))
    assert rc == 1 and keys(doc) == ["enable_thinking", "thinking"]


def test_a_template_other_than_the_targets_fails(capsys, good, tmp_path, tok):  # noqa: F811
    _, on, _, run = good
    other = qwen3_chat_tokenizer()
    other.chat_template = tok.chat_template.replace("<think>\\n\\n</think>", "<think>\\n</think>")
    served = _target(tmp_path, "other", other)
    rc, doc = check(capsys, "sglang", "on", _flags(served, on, run))
    assert rc == 1 and keys(doc) == ["chat_template"]


def test_data_without_prepare_json_fails(capsys, good, tmp_path):
    target, _, _, run = good
    old = tmp_path / "old"
    old.mkdir()
    (old / "part-00000.jsonl").write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n')
    rc, doc = check(capsys, "vllm", "on", _flags(target, old, run))
    assert rc == 1 and keys(doc) == ["prepare.json"]


def test_a_mask_token_that_is_a_real_token_fails(capsys, good, tok):  # noqa: F811
    target, on, _, run = good
    for token, said in (("<|im_end|>", "eos_token_id"), ("a", "vocabulary"), ("<think>", "added token")):
        mask = str(tok.convert_tokens_to_ids(token))
        rc, doc = check(capsys, "vllm", "on", _flags(target, on, run, "--mask-token-id", mask))
        (problem,) = [p for p in doc["servers"]["vllm"]["problems"] if p["severity"] == "error"]
        assert rc == 1 and problem["key"] == "dflash_config.mask_token_id" and said in problem["message"]


def test_a_repeated_target_layer_fails_vllm(capsys, good):
    target, on, _, run = good
    flags = _flags(target, on, run, "--num-draft-layers", "2", "--target-layer-ids", "1,1")
    rc, doc = check(capsys, "vllm", "on", flags)
    assert rc == 1 and keys(doc) == ["dflash_config.target_layer_ids"], doc
    rc, doc = check(capsys, "vllm", "on", _flags(target, on, run, "--num-draft-layers", "2"))
    assert rc == 0  # the reference rule's layers: distinct, in order


def test_mixed_sliding_and_full_layers_name_vllms_v2_runner(capsys, good):
    target, on, _, run = good
    layers = ("--num-draft-layers", "2", "--layer-types", "full_attention,sliding_attention")
    rc, doc = check(capsys, "vllm", "on", _flags(target, on, run, *layers, "--sliding-window", "64"))
    assert rc == 0 and keys(doc, "warning") == ["layer_types"]
    (warn,) = [p["message"] for p in doc["servers"]["vllm"]["problems"]]
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in warn


def test_dflash2_names_the_server_versions_that_serve_it(capsys, good):
    target, on, _, run = good
    rc, doc = check(capsys, "vllm", "on", _flags(target, on, run, "--arch", "dflash2"))
    said = [p["message"] for p in doc["servers"]["vllm"]["problems"] if p["key"] == "architectures"]
    assert rc == 0 and any("V2 model runner" in m for m in said), doc
    rc, doc = check(capsys, "sglang", "on", _flags(target, on, run, "--arch", "dflash2"))
    said = [p["message"] for p in doc["servers"]["sglang"]["problems"] if p["key"] == "architectures"]
    assert rc == 0 and any("0.5.23" in m for m in said), doc


def test_the_targets_rope_is_what_the_drafter_is_built_with(capsys, good, tmp_path, tok):  # noqa: F811
    """A target with partial RoPE and YaRN: the drafter rotates whole heads with the target's scaling, and
    its config says so (every server builds that); a scaling that narrows the rotation (``rope_dim``, which
    SGLang reads) taken over from the target fails SGLang."""
    _, on, _, run = good
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 128,
    }
    partial = _target(tmp_path, "partial", tok, rope_parameters=yarn, partial_rotary_factor=0.5)
    _, config = drafter_config(_flags(partial, on, run))
    assert config["rope_scaling"]["rope_type"] == "yarn" and "partial_rotary_factor" not in json.dumps(config)
    for serve in ("vllm", "sglang"):
        rc, doc = check(capsys, serve, "on", _flags(partial, on, run))
        assert rc == 0 and keys(doc) == [], doc
    narrow = _target(tmp_path, "narrow", tok, rope_parameters={**yarn, "rope_dim": 8})
    rc, doc = check(capsys, "sglang", "on", _flags(narrow, on, run))
    assert rc == 1 and keys(doc) == ["rope_scaling.rope_dim"], doc


def test_flags_the_trainer_refuses_are_usage(capsys, good):
    target, on, _, run = good
    assert main(["--serve", "vllm", "--", *_flags(target, on, run, "--mask-token-id", "100000")]) == 2
    assert "--mask-token-id" in capsys.readouterr().err
    assert main(["--serve", "vllm"]) == 2  # no trainer flags
    with pytest.raises(SystemExit) as e:
        main(["--serve", "zlab", "--", *_flags(target, on, run)])  # not a server
    assert e.value.code == 2


def test_it_runs_as_a_command_and_loads_no_model(good):
    """The console runs it in the place before a launch: one process that reads the target's config with
    transformers' ``AutoConfig``, as the trainer does (which imports torch: transformers' RoPE helpers), and
    builds no model."""
    target, on, _, run = good
    code = (
        "import sys, runpy; sys.argv = ['x'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('trainer.serve_check', run_name='__main__')\n"
        "finally:\n    print('MODEL' if 'transformers.modeling_utils' in sys.modules else 'NO-MODEL', file=sys.stderr)\n"
    )
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--serve",
            "vllm",
            "--serve-thinking",
            "on",
            "--",
            *_flags(target, on, run),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "vllm: ok", r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == "NO-MODEL", r.stderr
    print(f"trainer.serve_check took {took:.1f} s")

"""``python -m trainer.export --check``: exit 0 / 1 / 2, one line per problem, ``--json``, ``--target``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.trainer_run import ROOT, env

pytestmark = pytest.mark.e2e  # each test starts a real process


def run(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.export", *map(str, args)],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_good_export_exits_0_and_a_broken_one_1_naming_each_problem(exports, variant):
    ok = run("--check", "vllm,sglang", exports["swa"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert "vllm: ok (1 warning)" in lines and lines[-1] == "sglang: ok (1 warning)"

    def break_two(conf):
        conf["dflash_config"]["mask_token_id"] = 300
        del conf["use_sliding_window"]

    bad = run("--check", "all", variant("swa", break_two))
    assert bad.returncode == 1
    lines = bad.stdout.splitlines()
    for server in ("zlab", "vllm", "sglang"):
        assert any(
            x.startswith(f"{server}: error: dflash_config.mask_token_id: 300 is outside") for x in lines
        )
        assert any(x.startswith(f"{server}: error: use_sliding_window: ") for x in lines)
        assert f"{server}: failed" in lines or f"{server}: failed (1 warning)" in lines


def test_json_and_target(exports, tmp_path):
    from tests.support.model_util import tiny_target_config

    tiny_target_config(num_hidden_layers=6).save_pretrained(tmp_path / "target")
    r = run("--check", "zlab", "--json", "--target", tmp_path / "target", exports["dflash"])
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and list(doc["servers"]) == ["zlab"]
    problems = doc["servers"]["zlab"]["problems"]
    (p,) = [x for x in problems if x["severity"] == "error"]
    assert [x["key"] for x in problems if x["severity"] == "warning"] == ["tokenizer.json"]  # none there
    assert p == {
        "severity": "error",
        "key": "num_target_layers",
        "message": "4, but the target's num_hidden_layers is 6",
    }


def test_bad_usage_exits_2(exports, tmp_path):
    r = run("--check", "tgi", exports["dflash"])
    assert r.returncode == 2 and "unknown server" in r.stderr
    r = run("--check", "vllm", "--target", tmp_path / "nothing", exports["dflash"])
    assert r.returncode == 2 and "config.json missing" in r.stderr
    r = run("--check", "vllm", tmp_path / "nothing")
    assert r.returncode == 1 and "vllm: error: directory: " in r.stdout


def test_data_and_serve_thinking(exports, tmp_path):
    from tests.support.chat_tokenizer import qwen3_chat_tokenizer
    from tests.support.model_util import tiny_target_config
    from trainer.data.tokenizing import main as prepare

    target = tmp_path / "target"
    tiny_target_config(num_hidden_layers=4).save_pretrained(target)
    qwen3_chat_tokenizer().save_pretrained(target)
    raw = tmp_path / "raw.jsonl"
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello."},
    ]
    raw.write_text(json.dumps({"messages": chat}) + "\n")
    data = tmp_path / "data"
    assert prepare(["--tokenizer", str(target), "--input", str(raw), "--output-dir", str(data)]) == 0
    common = ("--check", "vllm,sglang", "--target", target, "--data", data)
    ok = run(*common, "--serve-thinking", "on", exports["dflash"])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = run(*common, "--serve-thinking", "off", exports["dflash"])
    assert bad.returncode == 1
    for server in ("vllm", "sglang"):
        (line,) = [x for x in bad.stdout.splitlines() if x.startswith(f"{server}: error: ")]
        assert line.startswith(f"{server}: error: enable_thinking: the data was prepared with thinking on")
    usage = run("--check", "vllm", "--serve-thinking", "on", exports["dflash"])
    assert usage.returncode == 2 and "--serve-thinking needs --data" in usage.stderr
    usage = run("--check", "vllm", "--data", tmp_path / "nothing", exports["dflash"])
    assert usage.returncode == 2 and "is not a directory" in usage.stderr


def test_to_speculators_writes_a_directory_vllm_serves_and_refuses_bad_usage(exports, tmp_path):
    ok = run("--to", "speculators", exports["dflash"], tmp_path / "spec", "--verifier", "org/target")
    assert ok.returncode == 0, ok.stderr
    assert "(zlab layout) in the speculators layout" in ok.stdout
    check = run("--check", "vllm", tmp_path / "spec")
    assert check.returncode == 0 and check.stdout.splitlines()[-1] == "vllm: ok (1 warning)", check.stdout
    for args, said in (
        (("--to", "speculators", exports["dflash"], tmp_path / "b"), "needs --verifier"),
        (("--to", "speculators", exports["dflash"], tmp_path / "spec", "--verifier", "x"), "is not empty"),
        (("--to", "zlab", exports["dflash"]), "--to needs SRC and OUT"),
        (("--check", "vllm", exports["dflash"], tmp_path / "c"), "OUT and --verifier are --to's"),
    ):
        r = run(*args)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "b").exists()

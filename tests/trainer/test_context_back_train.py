"""``--context-back`` through the real trainer on the tiny target: it trains, a resume keeps it without the flag,
the export carries it, ``trainer.evaluate`` serves it with the target's greedy output, and ``trainer.export
--check`` refuses it for every server."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.trainer_run import ROOT, env, run, steps, tiny_flags

pytestmark = pytest.mark.slow


def test_context_back_trains_resumes_evaluates_and_no_server_takes_it(tiny_assets, tmp_path):
    out = tmp_path / "run"
    rc, log = run(tiny_flags(tiny_assets, out, "--max-steps", "3", "--context-back", "1"))
    assert rc == 0, log
    rc, log = run(tiny_flags(tiny_assets, out, "--max-steps", "5", "--resume", "auto"))
    assert rc == 0, log
    assert [s["step"] for s in steps(out)][-2:] == [4, 5]
    assert json.loads((out / "run.json").read_text())["drafter"]["context_back"] == 1  # the checkpoint's
    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    export = ckpt / "export"
    assert json.loads((export / "config.json").read_text())["dflash_config"]["context_back"] == 1

    argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", str(tiny_assets / "target"),
            "--drafter", str(export), "--prompts", str(tiny_assets / "data"), "--num-prompts", "2",
            "--max-new-tokens", "16", "--json"]  # fmt: skip
    r = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["greedy_match"] is True and rep["verify_steps"] > 0

    argv = [sys.executable, "-m", "trainer.export", "--check", "zlab,vllm,sglang", str(export)]
    r = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    for server in ("z-lab", "vLLM", "SGLang"):
        assert f"{server} feeds fc one position's features" in r.stdout + r.stderr, server

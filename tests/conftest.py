"""Shared fixtures. Add yours below; keep the existing ones stable (other helpers' tests use them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.trainer_run import ROOT, env


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    """A directory with ``target/`` (tiny random Qwen3 + tokenizer) and ``data/`` (tokenized *.jsonl),
    built once per session by ``python -m trainer.tiny``; also ``raw/chat.jsonl`` (chat input)."""
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [sys.executable, "-m", "trainer.tiny", str(out)],
        cwd=ROOT,
        env=env(),
        check=True,
        capture_output=True,
        timeout=180,
    )
    return out

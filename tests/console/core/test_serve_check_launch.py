"""The launch's train/serve check (console/core/serve_check.py), through the in-process SSH server's container
and the real ``python -m trainer.serve_check``: a failing check refuses the launch and starts nothing; a
check that cannot run (a trainer too old to have it, a timeout, output that is not its JSON) is said and
does not block; what the check prints reaches no terminal uncleaned."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from console.core.events import Outcome
from console.core.place import Proxmox
from console.core.serve_check import run, skipped
from console.core.serving import Endpoint
from console.core.session import Session
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture
from tests.support.trainer_run import ROOT, TRAINER_ENV, tiny_flags

pytestmark = pytest.mark.e2e

host = devhost_fixture(asynchronous=True, env=TRAINER_ENV)
THINKING_ON = Endpoint("vllm", 8000, thinking="on")
BASE_PYTHON = os.path.join(sys.base_prefix, "bin", "python3")


def _session(host, run_dir: Path, serve=THINKING_ON) -> Session:
    return Session(
        options_for(host),
        place=Proxmox(CT),
        run_dir=str(run_dir),
        telemetry=False,
        streams=False,
        serve=serve,
    )


async def test_a_failing_check_refuses_the_launch_and_starts_nothing(host, tiny_assets):
    run_dir = host.container_dir(CT) / "refused"
    said: list[str] = []
    async with _session(host, run_dir) as s:
        flags = tiny_flags(tiny_assets, run_dir)
        res = await s.launch(flags, python=sys.executable, code_dir=str(ROOT), on_status=said.append)
        assert res.code == Outcome.ERROR and res.trainer is None, res
        check = res.serve_check
        assert check.state == "failed" and check.summary == "vllm:8000 (thinking on): 1 error", check
        (line,) = check.errors
        assert line.startswith("vllm: error: thinking: the data trains no thinking"), line
        assert "refused: the train/serve check fails" in res.message and line in res.message
        assert "--skip-serve-check" in res.message and 'type "serve"' in res.message  # the way on
        assert any("python -m trainer.serve_check" in m for m in said), said
        assert not (run_dir / "run.json").exists() and s.trainer is None  # nothing was started
        # served with thinking off, as the data was prepared: the check passes (the launch would go on)
        helper = s.need_helper()
        env = {"PYTHONPATH": str(ROOT)}
        off = Endpoint("sglang", 30000, thinking="off")
        ok = await run(helper, flags, off, python=sys.executable, env=env, cwd=str(run_dir.parent))
        assert ok.state == "ok" and not ok.blocks() and ok.errors == (), ok
        assert check.blocks() and check.blocks(["something else"]) and not check.blocks(check.errors)
        assert not check.blocks(True) and not skipped().blocks()


def _stand_in(root: Path, module: str | None) -> Path:
    """A code dir whose ``trainer`` package has only ``serve_check.py`` = ``module`` (None: no such module,
    an older trainer)."""
    (root / "trainer").mkdir(parents=True)
    (root / "trainer" / "__init__.py").write_text("")
    if module is not None:
        (root / "trainer" / "serve_check.py").write_text(module)
    return root


HOSTILE = r"""
import json, sys
p = {"severity": "error", "key": "k\u001b]52;c;SGVsbG8=\u0007", "message": "m\u009b2J\u202egnp.exe"}
print(json.dumps({"servers": {"vllm\u001b[2J": {"ok": False, "problems": [p] * 80}}}))
sys.exit(1)
"""


async def test_a_check_that_cannot_run_is_said_and_does_not_block(host, tmp_path):
    folder = host.container_dir(CT)
    old = _stand_in(folder / "old", None)
    slow = _stand_in(folder / "slow", "import time; time.sleep(60)")
    hostile = _stand_in(folder / "hostile", HOSTILE)
    garbage = _stand_in(folder / "garbage", "print('{not json'); raise SystemExit(1)")
    flags = ["--target-model", "x", "--data-dir", "y", "--output-dir", "z"]
    async with _session(host, tmp_path) as s:
        helper = s.need_helper()

        async def check(code: Path, timeout: float = 60):
            # the stand-ins run on the venv's base interpreter: the venv's editable install of the project
            # would find the real trainer package before PYTHONPATH's
            python = sys.executable if code == ROOT else BASE_PYTHON
            env = {"PYTHONPATH": str(code)}
            return await run(
                helper, flags, THINKING_ON, python=python, env=env, cwd=str(folder), timeout=timeout
            )

        too_old = await check(old)
        assert too_old.state == "not run" and not too_old.blocks(), too_old
        assert "has no trainer.serve_check (older than the check)" in too_old.summary
        refused = await check(ROOT)  # the real check, on flags the trainer refuses
        assert refused.state == "not run" and "it refused the flags" in refused.summary, refused
        assert "--target-model" in refused.summary and not refused.blocks()
        timed_out = await check(slow, timeout=3)
        assert timed_out.state == "not run" and "did not finish within 3 s" in timed_out.summary
        bad = await check(garbage)
        assert bad.state == "not run" and "not the check's JSON" in bad.summary, bad
        loud = await check(hostile)
    assert loud.state == "failed" and len(loud.errors) == 51 and loud.errors[-1] == "... and 30 more"
    text = "\n".join(loud.lines())
    assert not any(c in text for c in "\x1b\x07\x9b\u202e"), ascii(
        text
    )  # cleaned: nothing acts on a terminal

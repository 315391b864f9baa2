"""What a restart runs (issue 54, item 1; issue 55): the code deployed last to the place where run.json's
code is a deployed one (the CLI's ``restart`` and the screen's ``r`` share the planner), and nothing the
run directory names is run on its word: a working directory other than home or the code dir, a variable
that changes what the trainer loads, and test hooks (never passed on). The real session over the
in-process SSH server; fake ``trainer`` packages that leave a mark when they run (tests/support/fake_code.py)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from console.core.deploy import CODE_HOME, deploy
from console.core.events import Outcome
from console.core.place import Proxmox
from console.core.session import Session
from tests.support.core_util import CT, options_for
from tests.support.devhost import devhost_fixture
from tests.support.fake_code import fake_deployment, mark_last, other_code, run_json_for

host = devhost_fixture(scope="module")
OLD, NEW = "0" * 16, "1" * 16


def test_choose_code_prefers_the_last_deployment_only_over_deployed_code():
    from console.core.launching import choose_code

    base = "/h/.dflash-console/code"
    last = (f"{base}/{NEW}", 1.8e9)
    assert choose_code(None, f"{base}/{OLD}", last, base)[:2] == (last[0], "deployed")
    assert choose_code(None, None, last, base)[:2] == (last[0], "deployed")
    code, src, why = choose_code(None, "/home/me/dflash", last, base)  # a checkout of the user's own
    assert (code, src) == ("/home/me/dflash", "run.json") and f"--code-dir {last[0]}" in why
    assert choose_code("/srv/x", f"{base}/{OLD}", last, base)[:2] == ("/srv/x", "given")
    assert choose_code(None, f"{base}/{OLD}", None, base)[:2] == (f"{base}/{OLD}", "run.json")


def _run(host, name: str, code: str, **extra) -> tuple:
    ct_dir = host.container_dir(CT)
    run_dir = ct_dir / "runs" / name
    run_dir.mkdir(parents=True)
    run_json_for(run_dir, ct_dir, code)
    if extra:
        run = json.loads((run_dir / "run.json").read_text())
        (run_dir / "run.json").write_text(json.dumps({**run, **extra}))
    return ct_dir, run_dir


def _session(host, run_dir) -> Session:
    return Session(options_for(host), place=Proxmox(CT), run_dir=str(run_dir), telemetry=False, streams=False)


@pytest.mark.e2e
async def test_a_restart_runs_the_code_deployed_last(host):
    base = host.container_dir(CT) / CODE_HOME
    old, new = fake_deployment(base, OLD), fake_deployment(base, NEW)
    _, run_dir = _run(host, "deployed", old)
    mark_last(base, NEW)
    async with _session(host, run_dir) as s:
        plan, concerns, _ = await s.plan_restart()
        assert plan.code_dir == new and concerns == [], (plan.lines(), concerns)
        assert any(
            ln.startswith(f"code directory: {new} (deployed last: ") and old in ln for ln in plan.lines()
        )
        assert plan.env["PYTHONPATH"] == new  # the old one is gone from it
        res = await s.restart_trainer(wait_s=30, shown=plan)
        assert res.code == Outcome.OK, res.message
    assert (run_dir / "RAN").read_text().startswith(os.path.join(new, "trainer", "pipeline.py"))


@pytest.mark.e2e
async def test_deploy_names_its_folder_the_last_one_and_a_link_is_not_taken(host):
    from console.core.deploy import last_deployed

    base = host.container_dir(CT) / CODE_HOME
    async with _session(host, None) as s:
        helper = s.need_helper()
        where = await deploy(helper, sys.executable, check=False)
        assert (await last_deployed(helper))[0] == where
        (base / "last").unlink()
        (base / "elsewhere").write_text(json.dumps({"hash": os.path.basename(where), "t": 1}))
        (base / "last").symlink_to(base / "elsewhere")  # not deploy's: refused
        assert await last_deployed(helper) is None
        (base / "last").unlink()
        os.symlink(where, base / ("2" * 16))  # a linked HASH folder is no deployment
        mark_last(base, "2" * 16)
        assert await last_deployed(helper) is None
        assert await deploy(helper, sys.executable, check=False) == where  # again: the last one again
        assert (await last_deployed(helper))[0] == where


@pytest.mark.e2e
async def test_a_working_directory_of_run_jsons_needs_trust(host, tmp_path):
    base = host.container_dir(CT) / CODE_HOME
    code = fake_deployment(base, "3" * 16)
    planted = other_code(tmp_path / "cwd")  # python -m imports its trainer/ first
    _, run_dir = _run(host, "cwd", code, cwd=planted)
    async with _session(host, run_dir) as s:
        plan, concerns, _ = await s.plan_restart(code)
        assert plan.cwd == planted
        assert [c for c in concerns if c.startswith(f"the working directory {planted} (run.json's)")]
        res = await s.restart_trainer(wait_s=30, code_dir=code, shown=plan)
        assert res.code == Outcome.ERROR and "the working directory" in res.message
    assert not (run_dir / "RAN").exists()


@pytest.mark.e2e
async def test_loader_variables_need_trust_and_test_hooks_are_never_passed_on(host, tmp_path):
    base = host.container_dir(CT) / CODE_HOME
    code = fake_deployment(base, "4" * 16)
    env = {"PYTHONPATH": code, "LD_LIBRARY_PATH": str(tmp_path), "DFLASH_TEST_ENOSPC_SAVE": "1,2,3"}
    _, run_dir = _run(host, "env", code, env={**env, "DFLASH_STALL": "0"})
    async with _session(host, run_dir) as s:
        plan, concerns, _ = await s.plan_restart(code)
        assert "DFLASH_TEST_ENOSPC_SAVE" not in plan.env
        assert "not passed on (test hooks): DFLASH_TEST_ENOSPC_SAVE" in plan.lines()
        assert concerns == [
            f"run.json's env sets LD_LIBRARY_PATH={tmp_path}, which changes what the trainer loads"
        ]
        res = await s.restart_trainer(wait_s=30, code_dir=code, shown=plan)
        assert res.code == Outcome.ERROR and not (run_dir / "RAN").exists()
        res = await s.restart_trainer(wait_s=30, code_dir=code, shown=plan, trusted=concerns)
        assert res.code == Outcome.OK, res.message
    ran = json.loads((run_dir / "ENV").read_text())
    assert ran.get("LD_LIBRARY_PATH") == str(tmp_path) and ran.get("DFLASH_STALL") == "0"
    assert "DFLASH_TEST_ENOSPC_SAVE" not in ran

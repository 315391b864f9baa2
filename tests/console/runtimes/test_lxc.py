"""Real LXC: the console reaches a trainer inside an LXC container (``--lxc LXCPATH/NAME``) through
``lxc-attach``, and through ``--ct N`` where ``pct exec`` runs ``lxc-attach`` (as on a Proxmox host; the
``pct`` there a stand-in over the real LXC). The whole walk works in both (tests/support/runtime_walk.py)."""

from __future__ import annotations

import pytest

from tests.support.runtime_walk import missing_program, runtime_fixtures, walk, wrong_name
from tests.support.runtimes.lxc import Lxc

pytestmark = pytest.mark.e2e
runtime, host = runtime_fixtures(Lxc)


def test_launch_restart_onto_deployed_code_and_stop_cleanly_in_an_lxc_container(
    host, runtime, tiny_assets, tmp_path
):
    where = runtime.start("trainer-a")
    alive = lambda pid: runtime.exec("trainer-a", "test", "-d", f"/proc/{pid}", check=False).returncode == 0  # noqa: E731
    walk(host, ["--lxc", where], "lxc", tmp_path / "run", tiny_assets, alive)


def test_the_same_walk_through_pct_exec_over_real_lxc(host, runtime, tiny_assets, tmp_path):
    runtime.start("201")
    alive = lambda pid: runtime.exec("201", "test", "-d", f"/proc/{pid}", check=False).returncode == 0  # noqa: E731
    walk(host, ["--ct", "201"], "ct", tmp_path / "run", tiny_assets, alive, value=201)


def test_a_wrong_container_is_one_line_naming_the_command(host, runtime):
    wrong_name(host, "--lxc", f"{runtime.path}/nosuch", "lxc-attach")
    wrong_name(host, "--ct", "999", "does not exist")


def test_lxc_attach_missing_on_the_host_is_one_line(tmp_path):
    missing_program(tmp_path, "--lxc", "x", "lxc-attach")

"""Real Podman: the console reaches a trainer inside a Podman container (``--podman NAME``) through
``podman exec -i``, and the whole walk works there (tests/support/runtime_walk.py)."""

from __future__ import annotations

import pytest

from tests.support.runtime_walk import missing_program, runtime_fixtures, walk, wrong_name
from tests.support.runtimes.podman import Podman

pytestmark = pytest.mark.e2e
runtime, host = runtime_fixtures(Podman)


def test_launch_restart_onto_deployed_code_and_stop_cleanly_in_a_podman_container(
    host, runtime, tiny_assets, tmp_path
):
    name = runtime.start("trainer-a")
    alive = lambda pid: runtime.exec(name, "test", "-d", f"/proc/{pid}", check=False).returncode == 0  # noqa: E731
    walk(host, ["--podman", name], "podman", tmp_path / "run", tiny_assets, alive)


def test_a_wrong_container_is_one_line_naming_the_command(host):
    wrong_name(host, "--podman", "nosuch", "no such container")


def test_podman_missing_on_the_host_is_one_line(tmp_path):
    missing_program(tmp_path, "--podman", "x", "podman")

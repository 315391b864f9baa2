"""Real Docker: the console reaches a trainer inside a Docker container (``--docker NAME``) through
``docker exec -i`` (dockerd found through DOCKER_HOST), and the whole walk works there (tests/support/runtime_walk.py)."""

from __future__ import annotations

import pytest

from tests.support.core_util import cli, conn_args
from tests.support.runtime_walk import missing_program, runtime_fixtures, walk, wrong_name
from tests.support.runtimes.docker import Docker

pytestmark = pytest.mark.e2e
runtime, host = runtime_fixtures(Docker)


def test_launch_restart_onto_deployed_code_and_stop_cleanly_in_a_docker_container(
    host, runtime, tiny_assets, tmp_path
):
    name = runtime.start("trainer-a")
    alive = lambda pid: runtime.exec(name, "test", "-d", f"/proc/{pid}", check=False).returncode == 0  # noqa: E731
    walk(host, ["--docker", name], "docker", tmp_path / "run", tiny_assets, alive)


def test_a_wrong_container_is_one_line_naming_the_command(host):
    wrong_name(host, "--docker", "nosuch", "No such container")


def test_docker_missing_on_the_host_is_one_line(tmp_path):
    missing_program(tmp_path, "--docker", "x", "docker")


def test_three_containers_of_one_host_are_three_runs(host, runtime):
    for name in ("multi-a", "multi-b", "multi-c"):
        runtime.start(name)
    flags = [f for n in ("multi-a", "multi-b", "multi-c") for f in ("--docker", n)]
    r = cli("status", *conn_args(host, ct=None), *flags)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 4, r.stdout + r.stderr  # no trainer in any of them
    for name, line in zip(("multi-a", "multi-b", "multi-c"), lines, strict=True):
        assert line.startswith(f"127.0.0.1/docker:{name} ") and name in line and "no trainer" in line, lines

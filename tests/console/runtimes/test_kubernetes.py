"""Kubernetes pods (``--pod [NS/]POD[:CONTAINER]``): the console sends the real kubectl's argv
(``kubectl exec -i -n NS POD -c C -- ...``) to a kubectl STAND-IN that runs it in a real Podman container
(tests/support/runtimes/kubectl.py; no Kubernetes can run here). The whole walk works there."""

from __future__ import annotations

import pytest

from tests.support.runtime_walk import missing_program, runtime_fixtures, walk, wrong_name
from tests.support.runtimes.kubectl import Kubectl

pytestmark = pytest.mark.e2e
runtime, host = runtime_fixtures(Kubectl)


def test_stand_in_kubectl_launch_restart_onto_deployed_code_and_stop_cleanly_in_a_pod(
    host, runtime, tiny_assets, tmp_path
):
    pod = runtime.start("ml/trainer-0")
    alive = lambda pid: runtime.exec(pod, "test", "-d", f"/proc/{pid}", check=False).returncode == 0  # noqa: E731
    walk(host, ["--pod", f"{pod}:trainer"], "pod", tmp_path / "run", tiny_assets, alive)


def test_stand_in_kubectl_a_wrong_pod_is_one_line_naming_the_command(host):
    wrong_name(host, "--pod", "ml/nosuch", 'pods "nosuch" not found')


def test_kubectl_missing_on_the_host_is_one_line(tmp_path):
    missing_program(tmp_path, "--pod", "x", "kubectl")
